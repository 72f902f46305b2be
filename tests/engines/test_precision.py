"""The precision policy: bf16-mixed updates reach fp32 master weights; pure bf16 is refused
unless its update is compensated, and the compensated update keeps small steps that plain bf16
rounding loses."""

import pytest
import torch

from dare_core.config import RunConfig
from dare_core.config.schema import EngineConfig, ModelConfig, TrainerConfig
from dare_core.engines import SingleProcessEngine
from dare_core.engines.common import adamw
from dare_core.errors import DareError
from dare_core.testing.engines import TINY, train_run


def _changed_fraction(rounding: str, steps: int = 10, lr: float = 5e-7) -> tuple[float, torch.Tensor, torch.Tensor]:
    """AdamW on 4096 x 64 weights (std 0.02) in bf16 with ``rounding``, next to the same steps
    in fp32; returns the fraction of bf16 weights that changed, and both results."""
    gen = torch.Generator().manual_seed(0)
    w32 = torch.nn.Parameter(torch.randn(4096, 64, generator=gen) * 0.02)
    w16 = torch.nn.Parameter(w32.detach().to(torch.bfloat16))
    ref = torch.nn.Parameter(w16.detach().float())  # the fp32 run from the same bf16 start
    tr = TrainerConfig(lr=lr, weight_decay=0.0)
    opt16, opt32 = adamw([w16], tr, rounding), adamw([ref], tr)
    start = w16.detach().clone()
    for _ in range(steps):
        g = 1.0 + 0.1 * torch.randn(4096, 64, generator=gen)  # a consistent direction
        w16.grad, ref.grad = g.to(torch.bfloat16), g.clone()
        opt16.step()
        opt32.step()
    effective = w16.detach().float()
    if rounding == "kahan":
        effective = effective + opt16.state[w16]["comp"].float()
    return float((w16.detach() != start).float().mean()), effective, ref.detach()


def test_plain_bf16_adamw_loses_small_updates_and_compensation_keeps_them():
    """10 AdamW steps at lr 5e-7 on weights of std 0.02 (each step ~1/250 of a bf16 ulp): plain
    bf16 rounding keeps almost none of the update, Kahan compensation tracks fp32, stochastic
    rounding matches it on average."""
    start = _changed_fraction("none", steps=0)[1]
    lost, plain, fp32 = _changed_fraction("none")
    update = float((fp32 - start).mean())  # about -lr * steps
    assert update == pytest.approx(-5e-6, rel=0.05)
    assert lost < 0.05 and abs(float((plain - start).mean())) < 0.05 * abs(update)
    _, kahan, _ = _changed_fraction("kahan")
    assert float((kahan - fp32).abs().max()) < 0.05 * abs(update)
    _, stochastic, _ = _changed_fraction("stochastic")
    assert float((stochastic - start).mean()) == pytest.approx(update, rel=0.05)


def test_uncompensated_pure_bf16_is_refused_in_one_line():
    cfg = RunConfig(model=ModelConfig(device="cpu"), engine=EngineConfig(precision="bf16"))
    with pytest.raises(DareError) as info:
        SingleProcessEngine(cfg)
    assert "\n" not in str(info.value) and "engine.bf16_update=kahan" in str(info.value)
    engine = SingleProcessEngine(
        RunConfig(model=ModelConfig(device="cpu"), engine=EngineConfig(precision="bf16", bf16_update="kahan"))
    )
    assert engine.precision == "bf16"
    assert SingleProcessEngine(RunConfig(model=ModelConfig(device="cpu"))).precision == "fp32"  # auto on CPU


@pytest.mark.parametrize("precision", ["bf16-mixed"])
def test_training_at_a_small_learning_rate_moves_the_weights_as_fp32_does(tmp_path, precision):
    """The toy model trained 3 steps at lr 5e-7: under bf16-mixed (fp32 master weights) and
    compensated pure bf16 every weight fp32 moves, moves."""
    common = [
        *TINY,
        f"model.path={tmp_path / 'ckpt'}",
        f"output_dir={tmp_path}",
        "trainer.lr=5e-7",
        "trainer.save_every=0",
    ]
    start = train_run((), "sup_test", [*common, "run_name=start", "trainer.steps=1", "trainer.lr=1e-30"])
    fp32 = train_run((), "sup_test", [*common, "run_name=fp32"])
    low = train_run(
        (),
        "sup_test",
        [
            *common,
            f"run_name={precision}",
            f"engine.precision={precision}",
            "engine.bf16_update=kahan",
            "model.dtype=float32",
        ],
    )
    for name, w0 in start["weights"].items():
        if not w0.is_floating_point():
            continue
        moved32 = fp32["weights"][name] != w0
        moved = low["weights"][name] != w0
        # the export is in model.dtype (float32): weights whose update reached the master copy differ
        assert float(moved.float().mean()) >= 0.9 * float(moved32.float().mean()), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grad_norm_clips_every_gradient_and_returns_the_norm_before(dtype):
    """The norm is the global fp32 L2 norm before clipping; every gradient is scaled by
    ``max_norm / norm`` when the norm exceeds ``max_norm`` and left alone otherwise."""
    from dare_core.engines.common import grad_norm

    params = [torch.nn.Parameter(torch.zeros(3, dtype=dtype)), torch.nn.Parameter(torch.zeros(4, dtype=dtype))]
    params[0].grad = torch.tensor([3.0, 0.0, 0.0], dtype=dtype)
    params[1].grad = torch.tensor([0.0, 4.0, 0.0, 0.0], dtype=dtype)
    assert float(grad_norm(params, 10.0)) == pytest.approx(5.0)
    assert params[0].grad[0].item() == 3.0
    assert float(grad_norm(params, 1.0)) == pytest.approx(5.0)
    assert params[0].grad[0].item() == pytest.approx(0.6, rel=1e-2)
    assert params[1].grad[1].item() == pytest.approx(0.8, rel=1e-2)
    assert float(grad_norm(params, 0.0)) == pytest.approx(1.0, rel=1e-2)
