"""``dare eval`` on 2 gloo ranks (the core's ``ddp`` engine) equals one process: the metrics and
every sample, written once by rank 0."""

import json
import os

from dare_core.testing.distributed import run_ranks
from dare_plugin_eval.testing import PLUGINS, TINY, suite_on


def _samples(root: str) -> list[dict]:
    with open(os.path.join(root, "samples.jsonl")) as fh:
        return [json.loads(line) for line in fh]


def test_two_ranks_equal_one_process(tmp_path):
    common = [*TINY, f"model.path={tmp_path / 'ckpt'}", f"output_dir={tmp_path / 'out'}"]
    tasks = ["digits", "first_digit"]
    (one,) = run_ranks(1, suite_on, PLUGINS, "toy", tasks, [*common, "run_name=one"])
    many = run_ranks(2, suite_on, PLUGINS, "toy", tasks, [*common, "run_name=many", "engine.name=ddp"])
    assert many[1]["eval_dir"] is None and sorted(os.listdir(tmp_path / "out")) == ["many", "one"]

    def strip(metrics):
        return {k: v for k, v in metrics.items() if k != "seconds"}

    for task in tasks:
        assert strip(many[0]["tasks"][task]) == strip(many[1]["tasks"][task]) == strip(one["tasks"][task])
        assert one["tasks"][task]["nfe"] == 4  # every rank's counted batches: the one-process count
    assert _samples(many[0]["eval_dir"]) == _samples(one["eval_dir"])
    assert len(_samples(one["eval_dir"])) == 10
