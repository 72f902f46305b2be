"""Several processes: rank 0 claims the run directory and every rank gets its refusal (none waits
for a rank that has given up)."""

import os
import sys

from dare_core.testing.distributed import run_ranks
from dare_core.testing.engines import TINY

sys.path.insert(0, os.path.dirname(__file__))  # the spawned ranks import refusal by name
from refusal import refusal  # noqa: E402


def test_every_rank_refuses_an_existing_run_directory(tmp_path):
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "config.yaml").write_text("algo: pg_test\n")
    overrides = [*TINY, "engine.name=ddp", f"model.path={tmp_path / 'ckpt'}", f"output_dir={tmp_path}", "run_name=exp"]
    expected = (
        f"run directory {tmp_path / 'exp'} exists; choose another run_name, pass --overwrite to "
        f"replace it, or continue it with trainer.resume=auto"
    )
    assert run_ranks(2, refusal, (), "pg_test", overrides, timeout=180) == [expected, expected]
    assert os.listdir(tmp_path / "exp") == ["config.yaml"]
