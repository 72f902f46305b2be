"""lm-evaluation-harness end to end, offline: local task YAMLs over a local jsonl (a multiple-choice
task scored by loglikelihood, a generate_until task), run through ``simple_evaluate(model="dare")``
on the bundled tiny checkpoints; and the refusals."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
from dare_core.api import DareError, get_dare  # noqa: E402
from dare_plugin_lmeval._compat import load_lm_eval  # noqa: E402

try:
    load_lm_eval()
except ImportError:
    pytest.skip("lm_eval is not installed (pip install 'dare-plugin-lmeval[test]')", allow_module_level=True)

DATA = Path(__file__).parent / "data" / "sudoku_choices.jsonl"

MC_YAML = """task: dare_sudoku_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
target_delimiter: ""
metric_list:
  - metric: acc
"""

GEN_YAML = """task: dare_sudoku_generate
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{target}}}}"
generation_kwargs:
  until: ["</answer>"]
  max_gen_toks: 40
metric_list:
  - metric: exact_match
"""


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    d = tmp_path_factory.mktemp("tasks")
    (d / "mc.yaml").write_text(MC_YAML.format(data=DATA))
    (d / "gen.yaml").write_text(GEN_YAML.format(data=DATA))
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(d))


def _need(family):
    if family not in get_dare().registries.models:
        pytest.skip(f"family {family} not installed")


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_simple_evaluate_both_request_types(tasks, family):
    _need(family)
    from lm_eval import simple_evaluate

    import dare_plugin_lmeval.model  # noqa: F401  (registers `dare`)

    out = simple_evaluate(
        model="dare",
        model_args=f"family={family},mc_samples=4,seed=0",
        tasks=["dare_sudoku_choice", "dare_sudoku_generate"],
        task_manager=tasks,
        limit=4,
        apply_chat_template=True,
        log_samples=True,
        batch_size=4,
    )
    mc = out["results"]["dare_sudoku_choice"]
    # 4 choices each (chance 0.25); the near misses (two cells swapped) beat the tiny sdar model
    assert mc["acc,none"] >= (0.75 if family == "llada" else 0.25)
    gens = [s["resps"][0][0] for s in out["samples"]["dare_sudoku_generate"]]
    assert len(gens) == 4
    assert all("<answer>" in g and "</answer>" not in g for g in gens)  # cut before the stop string
    assert "exact_match,none" in out["results"]["dare_sudoku_generate"]


def test_loglikelihood_deterministic_and_rolling_refused():
    _need("llada")
    from lm_eval.api.instance import Instance

    from dare_plugin_lmeval.model import DareLM

    lm = DareLM(family="llada", mc_samples=4, seed=1, gen_length=40)
    row = json.loads(DATA.read_text().splitlines()[0])
    context = lm.apply_chat_template([{"role": "user", "content": row["question"]}])
    reqs = [Instance("loglikelihood", {}, (context, c), i) for i, c in enumerate(row["choices"])]
    first, again = lm.loglikelihood(reqs), lm.loglikelihood(reqs[::-1])[::-1]
    assert first == again and all(g is False for _, g in first)
    assert max(range(4), key=lambda j: first[j][0]) == row["label"]
    with pytest.raises(DareError, match="no left-to-right factorisation"):
        lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, ("text",), 0)])


def test_bad_model_args_are_dare_errors():
    _need("llada")
    from dare_plugin_lmeval.model import DareLM

    with pytest.raises(DareError, match="family=NAME"):
        DareLM()
    with pytest.raises(DareError, match="gen_lenght"):
        DareLM(family="llada", gen_lenght=8)


def test_module_entry_point_lists_the_model_args_help():
    proc = subprocess.run(
        [sys.executable, "-m", "dare_plugin_lmeval", "--help"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0 and "--model_args" in proc.stdout
