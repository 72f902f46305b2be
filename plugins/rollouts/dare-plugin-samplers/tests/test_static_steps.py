"""Static-shape decode steps (``graphs``) of the ``fast`` and ``block`` backends, on the CPU.

The static path (``graphs=static``: preallocated buffers, fixed step shapes, what CUDA graphs
replay) must give the eager path's (``graphs=eager``) tokens, reveal steps and forward counts in
fp32, on the bundled tiny checkpoints: LLaDA and Dream (masked, Dream with shifted logits) through
``fast``, SDAR and LLaDA2 (block diffusion) through ``block``; greedy and sampled with a fixed
generator, left-padded batches, stop tokens. ``torch.compile`` of the same steps is in the slow
tests (minutes of compilation on a small CPU).
"""

from __future__ import annotations

import glob
import importlib
import os

import pytest
import torch

from dare_core.api import DareError
from dare_plugin_samplers.block import BlockRolloutConfig, BlockSampler
from dare_plugin_samplers.fast import FastConfig, FastSampler
from dare_plugin_samplers.graphs import Captures, Step, graph_mode

REVEAL = frozenset({"reveal_step"})
_WRAPPERS: dict = {}


def bundled(family: str, device: str = "cpu"):
    """The family's bundled tiny checkpoint on ``device``, loaded once (skipped without the plugin)."""
    if (family, device) not in _WRAPPERS:
        pytest.importorskip(f"dare_plugin_{family}")
        wrapper = importlib.import_module(f"dare_plugin_{family}.wrapper")
        root = os.path.dirname(importlib.import_module(f"dare_plugin_{family}").__file__)
        paths = glob.glob(os.path.join(root, "checkpoints", "tiny-sudoku"))
        if not paths:
            pytest.skip(f"no bundled {family} checkpoint")
        _WRAPPERS[family, device] = wrapper.load(paths[0], device=device)
    return _WRAPPERS[family, device]


def sudoku_prompts(w, n: int = 4, cut: int = 5):
    """``n`` held-out Sudoku prompts, row ``i`` shortened by ``i * cut`` tokens (left padded)."""
    sudoku = pytest.importorskip("dare_plugin_tasks.sudoku")
    from dare_core.api import TaskConfig, left_pad

    examples = sudoku.SudokuTask(TaskConfig()).examples("eval", limit=n)
    ids = [w.encode(w.render_prompt(ex.prompt))[i * cut :] for i, ex in enumerate(examples)]
    return left_pad(ids, w.pad_token_id)


def random_prompts(w, b: int = 3, p: int = 11, pads=(3, 0, 6)):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 60, (b, p), generator=g)
    mask = torch.ones(b, p, dtype=torch.long)
    for row, n in enumerate(pads[:b]):
        ids[row, :n] = w.pad_token_id
        mask[row, :n] = 0
    return ids, mask


def same(sampler_cls, config_cls, w, pid, pm, graphs="static", **kw):
    """Generate with ``graphs=eager`` and with ``graphs``; assert equal outputs; return them."""
    outs = [
        sampler_cls(config_cls(**kw, graphs=g)).generate(
            w, pid, pm, record=REVEAL, generator=torch.Generator().manual_seed(7)
        )
        for g in ("eager", graphs)
    ]
    eager, static = outs
    assert torch.equal(static.response_ids, eager.response_ids)
    assert torch.equal(static.response_mask, eager.response_mask)
    assert torch.equal(static.reveal_step, eager.reveal_step)
    assert (static.nfe, static.num_steps) == (eager.nfe, eager.num_steps)
    return eager, static


FAST = [
    dict(decoding="quota"),
    dict(decoding="quota", temperature=0.8),
    dict(decoding="threshold", threshold=0.5),
    dict(decoding="threshold", threshold=0.7, temperature=1.0, stop_confidence="never"),
    dict(decoding="quota", cache="none", temperature=0.7, remasking="random", stop_confidence="zero"),
    dict(decoding="quota", refresh_every=3, temperature=0.9, suppress_eos=True),
]


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("kw", FAST, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_fast_static_steps_give_the_eager_tokens(family, kw):
    w = bundled(family)
    pid, pm = random_prompts(w)
    same(
        FastSampler,
        FastConfig,
        w,
        pid,
        pm,
        **{"gen_length": 16, "block_length": 8, "steps": 16, "temperature": 0.0, **kw},
    )


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_fast_static_on_sudoku_prompts_with_stop_tokens(family):
    """Left-padded trained prompts whose responses end with EOS (truncated response masks)."""
    w = bundled(family)
    pid, pm = sudoku_prompts(w)
    eager, _ = same(
        FastSampler,
        FastConfig,
        w,
        pid,
        pm,
        gen_length=40,
        block_length=8,
        steps=40,
        temperature=0.0,
        decoding="threshold",
        truncate_at_eos=True,
    )
    assert bool((eager.response_ids == w.eos_token_id).any())
    assert int(eager.response_mask.sum()) < eager.response_mask.numel()


def test_fast_captures_are_reused_and_reset():
    """A second call with other prompts of the same shape reuses the buffers and still gives
    the eager tokens; micro-batches of two shapes get one capture each."""
    w = bundled("llada")
    sampler = FastSampler(
        FastConfig(
            gen_length=16,
            block_length=8,
            steps=16,
            temperature=0.0,
            decoding="quota",
            graphs="static",
            micro_batch_size=2,
        )
    )
    eager = FastSampler(
        FastConfig(gen_length=16, block_length=8, steps=16, temperature=0.0, decoding="quota", graphs="eager")
    )
    for seed in (0, 1):
        pid, pm = random_prompts(w)
        pid = pid.roll(seed, dims=1).masked_fill(pm == 0, w.pad_token_id)
        assert torch.equal(sampler.generate(w, pid, pm).response_ids, eager.generate(w, pid, pm).response_ids)
    assert len(sampler._static_captures._items) == 2  # a 2-row and a 1-row chunk


class Spy:
    """Records the shapes of every ``forward_cached`` call of a wrapper."""

    def __init__(self, inner):
        self._inner, self.calls = inner, []

    def forward_cached(self, input_ids, **kw):
        past, mask = kw.get("past_key_values"), kw.get("attention_mask")
        self.calls.append(
            (
                tuple(input_ids.shape),
                None if not past else tuple(past[0][0].shape),
                None if mask is None else tuple(mask.shape),
                kw.get("use_cache"),
            )
        )
        return self._inner.forward_cached(input_ids, **kw)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def test_fast_static_steps_have_two_shapes():
    """Every forward of the static path is one of two fixed signatures (full, cached), whichever
    block it serves; the eager dual cache has the same two."""
    w = Spy(bundled("llada"))
    pid, pm = random_prompts(w)
    FastSampler(
        FastConfig(gen_length=24, block_length=8, steps=24, temperature=0.0, decoding="quota", graphs="static")
    ).generate(w, pid, pm)
    assert len(set(w.calls)) == 2 and len(w.calls) == 24


def test_block_static_steps_have_fixed_shapes():
    """Block steps and commits see the whole KV buffer (one shape each); only the prompt
    prefill and the one-token probe that sizes the buffer differ."""
    w = Spy(bundled("sdar"))
    pid, pm = random_prompts(w)
    BlockSampler(
        BlockRolloutConfig(gen_length=24, steps=4, temperature=0.0, stop_at_stop_token=False, graphs="static")
    ).generate(w, pid, pm)
    probe, prefill, *steps = w.calls
    assert probe[0][1] == 1 and prefill[1] is None
    assert len(set(steps)) == 2  # block logits, commit


BLOCK = [
    dict(),
    dict(temperature=0.8),
    dict(remasking="low_confidence_static", steps=2),
    dict(remasking="entropy_bounded", temperature=0.7, top_k=5),
    dict(remasking="sequential", temperature=1.0, top_p=0.9),
    dict(block_length=8, stop_at_stop_token=True),
]


@pytest.mark.parametrize(
    "family,kw",
    [("sdar", kw) for kw in BLOCK] + [("llada2", BLOCK[0]), ("llada2", BLOCK[3])],
    ids=lambda v: v if isinstance(v, str) else ",".join(f"{k}={x}" for k, x in v.items()) or "default",
)
def test_block_static_steps_give_the_eager_tokens(family, kw):
    w = bundled(family)
    pid, pm = random_prompts(w, p=13, pads=(3, 0, 9))
    same(
        BlockSampler,
        BlockRolloutConfig,
        w,
        pid,
        pm,
        **{"gen_length": 24, "steps": 4, "temperature": 0.0, "stop_at_stop_token": False, **kw},
    )


@pytest.mark.parametrize("family", ["sdar", "llada2"])
def test_block_static_stops_early_like_eager(family):
    """Sudoku prompts: every row emits a stop token, the remaining blocks are skipped."""
    w = bundled(family)
    pid, pm = sudoku_prompts(w)
    eager, _ = same(
        BlockSampler, BlockRolloutConfig, w, pid, pm, gen_length=64, steps=4, temperature=0.0, stop_at_stop_token=True
    )
    full = -(-(int((pm.sum(1) % w.block_size).max()) + 64) // w.block_size) * 4
    assert eager.num_steps < full


def test_block_static_resume_reproduces_the_uninterrupted_run():
    w = bundled("sdar")
    pid, pm = random_prompts(w, p=13, pads=(3, 0, 9))
    sampler = BlockSampler(
        BlockRolloutConfig(gen_length=24, steps=4, temperature=0.0, stop_at_stop_token=False, graphs="static")
    )
    full = sampler.generate(w, pid, pm)
    half = sampler.continue_from(
        w, pid, pm, torch.full_like(full.response_ids, w.mask_token_id), start_step=0, stop_step=10
    )
    rest = sampler.continue_from(w, pid, pm, half.response_ids, start_step=10, stop_step=sampler.total_steps(w, pm))
    assert torch.equal(rest.response_ids, full.response_ids)


# --------------------------------------------------------------------------- settings, errors
def test_graph_modes_and_errors():
    assert graph_mode("auto", torch.device("cpu")) == "eager"
    assert graph_mode("auto", torch.device("cuda", 0)) == "cuda_graph"
    assert graph_mode("static", torch.device("cpu")) == "static"
    hooked = torch.nn.Sequential(torch.nn.Linear(2, 2))
    hooked[0].register_forward_pre_hook(lambda module, args: None)
    assert graph_mode("auto", torch.device("cuda", 0), hooked) == "eager"  # e.g. FSDP2
    with pytest.raises(DareError, match="needs a CUDA device.*graphs=static"):
        graph_mode("cuda_graph", torch.device("cpu"))
    with pytest.raises(ValueError, match="cache 'prefix'.*cache to dual or none"):
        FastConfig(cache="prefix", graphs="static")
    assert FastConfig(cache="delayed", graphs="auto").graphs == "auto"  # runs eager
    with pytest.raises(ValueError, match="needs rollout.use_cache=true"):
        BlockRolloutConfig(use_cache=False, graphs="cuda_graph")


def test_cuda_graph_on_cpu_is_one_line_before_work():
    w = bundled("llada")
    pid, pm = random_prompts(w)
    with pytest.raises(DareError, match="needs a CUDA device"):
        FastSampler(FastConfig(gen_length=8, block_length=8, steps=8, graphs="cuda_graph")).generate(w, pid, pm)


def test_step_runs_uncaptured_off_cuda_and_captures_evict():
    calls = []
    step = Step(lambda a: (calls.append(1) or a + 1,), "static", torch.device("cpu"))
    assert step(torch.zeros(2))[0].tolist() == [1.0, 1.0] and len(calls) == 1
    captures = Captures(size=2)
    for key in "abc":
        captures.get(key, lambda k=key: k)
    assert list(captures._items) == ["b", "c"]


# --------------------------------------------------------------------------- CUDA graphs
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("kw", [FAST[1], FAST[2], FAST[5]], ids=["sampled", "threshold", "refresh"])
def test_fast_cuda_graphs_give_the_eager_tokens(family, kw):
    """Captured steps replay the static path: the eager tokens, twice (the second call replays
    the graphs captured by the first)."""
    w = bundled(family, "cuda")
    pid, pm = (t.cuda() for t in random_prompts(w))
    kw = {"gen_length": 16, "block_length": 8, "steps": 16, "temperature": 0.0, **kw}
    sampler = FastSampler(FastConfig(**kw, graphs="cuda_graph"))
    eager = FastSampler(FastConfig(**kw, graphs="eager"))
    for seed in (1, 2):
        ref = eager.generate(w, pid, pm, record=REVEAL, generator=torch.Generator().manual_seed(seed))
        out = sampler.generate(w, pid, pm, record=REVEAL, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(out.response_ids, ref.response_ids) and torch.equal(out.reveal_step, ref.reveal_step)
        assert out.nfe == ref.nfe
    assert all(
        step.graph is not None
        for ses in sampler._static_captures._items.values()
        for step in (ses.full, ses.cached)
        if step.inputs
    )


@cuda
@pytest.mark.parametrize("kw", [BLOCK[0], BLOCK[1], BLOCK[5]], ids=["greedy", "sampled", "stop"])
def test_block_cuda_graphs_give_the_eager_tokens(kw):
    w = bundled("sdar", "cuda")
    pid, pm = (t.cuda() for t in random_prompts(w, p=13, pads=(3, 0, 9)))
    kw = {"gen_length": 24, "steps": 4, "temperature": 0.0, "stop_at_stop_token": False, **kw}
    sampler = BlockSampler(BlockRolloutConfig(**kw, graphs="cuda_graph"))
    eager = BlockSampler(BlockRolloutConfig(**kw, graphs="eager"))
    for seed in (1, 2):
        ref = eager.generate(w, pid, pm, record=REVEAL, generator=torch.Generator().manual_seed(seed))
        out = sampler.generate(w, pid, pm, record=REVEAL, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(out.response_ids, ref.response_ids) and out.nfe == ref.nfe
    ses = next(iter(sampler._static_captures._items.values()))
    assert ses.logits_step.graph is not None and ses.commit_step.graph is not None


@cuda
def test_cuda_graphs_refuse_a_forward_that_synchronises():
    """LLaDA2's mixture of experts reads its per-expert token counts on the host in fp32:
    ``auto`` runs the static steps uncaptured with a warning, an explicit ``cuda_graph`` is a
    one-line error."""
    w = bundled("llada2", "cuda")
    pid, pm = (t.cuda() for t in random_prompts(w, p=13, pads=(3, 0, 9)))
    kw = {"gen_length": 16, "steps": 4, "temperature": 0.0, "stop_at_stop_token": False}
    ref = BlockSampler(BlockRolloutConfig(**kw, graphs="eager")).generate(w, pid, pm)
    with pytest.warns(UserWarning, match="cannot be captured, the model.s forward synchronises"):
        out = BlockSampler(BlockRolloutConfig(**kw, graphs="auto")).generate(w, pid, pm)
    assert torch.equal(out.response_ids, ref.response_ids)
    with pytest.raises(DareError, match="cannot be captured.*graphs=static"):
        BlockSampler(BlockRolloutConfig(**kw, graphs="cuda_graph")).generate(w, pid, pm)


# --------------------------------------------------------------------------- torch.compile
@pytest.mark.slow
def test_fast_compiled_steps_give_the_eager_tokens():
    w = bundled("llada")
    pid, pm = random_prompts(w)
    same(
        FastSampler,
        FastConfig,
        w,
        pid,
        pm,
        graphs="compile",
        gen_length=16,
        block_length=8,
        steps=16,
        temperature=0.8,
        decoding="quota",
    )


@pytest.mark.slow
def test_block_compiled_steps_give_the_eager_tokens():
    w = bundled("sdar")
    pid, pm = random_prompts(w, p=13, pads=(3, 0, 9))
    same(
        BlockSampler,
        BlockRolloutConfig,
        w,
        pid,
        pm,
        graphs="compile",
        gen_length=16,
        steps=4,
        temperature=0.8,
        stop_at_stop_token=False,
    )
