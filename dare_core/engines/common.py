"""What every engine shares: the precision policy, the learning-rate schedule, the optimizer
(with the compensated pure-bf16 update) and the clipped step."""

from __future__ import annotations

import contextlib
import math
from typing import Any, Iterable, Optional

import torch

from dare_core.errors import DareError

PRECISIONS = ("fp32", "bf16-mixed", "bf16")


def resolve_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise DareError("model.device=cuda but no CUDA device is available; use model.device=cpu")
    return name


def resolve_precision(engine_cfg: Any, device: torch.device, supported: Iterable[str] = PRECISIONS) -> str:
    """``engine.precision`` with ``auto`` resolved (bf16-mixed on CUDA, fp32 elsewhere); refuses
    an uncompensated pure-bf16 policy and one the engine does not implement."""
    name = engine_cfg.precision
    if name == "auto":
        name = "bf16-mixed" if device.type == "cuda" else "fp32"
    if name == "bf16" and engine_cfg.bf16_update == "none":
        raise DareError(
            "engine.precision=bf16 with engine.bf16_update=none would lose every update smaller "
            "than bf16's resolution (most updates at RL learning rates); set "
            "engine.bf16_update=kahan (or stochastic), or engine.precision=bf16-mixed"
        )
    if name not in set(supported):
        raise DareError(
            f"engine {engine_cfg.name!r} does not implement engine.precision={name}; "
            f"it implements: {', '.join(sorted(supported))}"
        )
    return name


def cast_for_precision(module: torch.nn.Module, precision: str, trainable: bool) -> None:
    """fp32: every parameter fp32. bf16-mixed: trainable parameters fp32 (the master weights the
    optimizer updates; frozen ones keep their storage dtype, autocast computes in bf16). bf16:
    every floating parameter bf16. Inference only (``trainable=False``): unchanged."""
    if not trainable:
        return
    for p in module.parameters():
        keep = precision not in ("fp32", "bf16") and not p.requires_grad  # frozen under bf16-mixed
        want = torch.bfloat16 if precision == "bf16" else torch.float32
        if p.is_floating_point() and not keep and p.dtype != want:
            p.data = p.data.to(want)


def autocast_for(precision: str, device: torch.device) -> Any:
    bf16 = precision == "bf16-mixed"
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()


def lr_at(trainer: Any, step: int) -> float:
    """The learning rate of optimizer-schedule step ``step`` (0-based): linear warm-up over
    ``warmup_ratio · steps``, then constant or cosine to 0 at ``steps``."""
    warmup = int(round(trainer.warmup_ratio * trainer.steps))
    if warmup and step < warmup:
        return trainer.lr * (step + 1) / warmup
    if trainer.lr_schedule == "cosine":
        progress = (step - warmup) / max(1, trainer.steps - warmup)
        return trainer.lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return trainer.lr


def trainable_parameters(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        raise DareError("the model has no trainable parameters")
    return params


def adamw(params: list[torch.nn.Parameter], trainer: Any, bf16_update: str = "none") -> torch.optim.Optimizer:
    """AdamW with the trainer's hyper-parameters; with ``bf16_update`` kahan/stochastic the
    compensated pure-bf16 variant (:class:`CompensatedAdamW`)."""
    kw = dict(
        lr=trainer.lr, betas=(trainer.beta1, trainer.beta2), eps=trainer.adam_eps, weight_decay=trainer.weight_decay
    )
    if bf16_update in ("kahan", "stochastic"):
        return CompensatedAdamW(params, rounding=bf16_update, **kw)
    return torch.optim.AdamW(params, **kw)


def _stochastic_round_bf16(x: torch.Tensor, generator: Optional[torch.Generator]) -> torch.Tensor:
    """fp32 → bf16 rounding up or down with probability proportional to the distance (unbiased:
    E[round(x)] = x), by adding uniform noise below bf16's last bit and truncating."""
    bits = x.contiguous().view(torch.int32)
    noise = torch.randint(0, 1 << 16, x.shape, dtype=torch.int32, device="cpu", generator=generator)
    return ((bits + noise.to(x.device)) & -65536).view(torch.float32).to(torch.bfloat16)


class CompensatedAdamW(torch.optim.Optimizer):
    """AdamW on bf16 weights whose small updates are not lost to rounding.

    The step is computed in fp32 (fp32 moments) on ``w + c`` and rounded back to bf16 by
    ``rounding``: ``kahan`` keeps the rounding error in a bf16 buffer ``c`` added to the next
    step (Kahan summation, arXiv:2010.06192); ``stochastic`` rounds up or down
    with probability proportional to the distance (unbiased in expectation, arXiv:1502.02551).
    """

    def __init__(
        self, params, lr: float, betas: tuple[float, float], eps: float, weight_decay: float, rounding: str = "kahan"
    ):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.rounding = rounding
        self._noise = torch.Generator().manual_seed(0)

    @torch.no_grad()
    def step(self, closure=None):  # noqa: D102 (torch.optim.Optimizer.step)
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
                    st["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
                    if self.rounding == "kahan":
                        st["comp"] = torch.zeros_like(p)
                st["step"] += 1
                g = p.grad.float()
                st["exp_avg"].lerp_(g, 1 - b1)
                st["exp_avg_sq"].mul_(b2).addcmul_(g, g, value=1 - b2)
                denom = (st["exp_avg_sq"] / (1 - b2 ** st["step"])).sqrt_().add_(group["eps"])
                w = p.float()
                if self.rounding == "kahan":
                    w += st["comp"].float()
                w.mul_(1 - group["lr"] * group["weight_decay"])
                w.addcdiv_(st["exp_avg"], denom, value=-group["lr"] / (1 - b1 ** st["step"]))
                if self.rounding == "kahan":
                    p.copy_(w)
                    st["comp"].copy_(w - p.float())
                else:
                    p.copy_(_stochastic_round_bf16(w, self._noise))

    def state_dict(self) -> dict[str, Any]:
        """torch's optimizer state, plus the stochastic rounding's generator state."""
        state = super().state_dict()
        if self.rounding == "stochastic":
            state["rounding_stream"] = self._noise.get_state()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's load, which casts floating state to the parameter's dtype, with the saved
        dtypes restored (fp32 moments next to bf16 weights) and the rounding stream continued."""
        super().load_state_dict(state_dict)
        saved = [state_dict["state"].get(i, {}) for g in state_dict["param_groups"] for i in g["params"]]
        for p, st in zip([p for g in self.param_groups for p in g["params"]], saved):
            self.state[p].update({k: v.to(p.device) for k, v in st.items() if torch.is_tensor(v) and k != "step"})
        if "rounding_stream" in state_dict:
            self._noise.set_state(state_dict["rounding_stream"].cpu())


def grad_norm(params: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """The global L2 norm of the gradients, accumulated in fp32 whatever their dtype (a bf16 norm
    would depend on how the tensors are sharded), clipping them to ``max_norm`` when it is > 0."""
    with_grad = [p for p in params if p.grad is not None]
    if not with_grad:
        return torch.zeros(())
    norms = [torch.linalg.vector_norm(p.grad, dtype=torch.float32) for p in with_grad]
    total = torch.linalg.vector_norm(torch.stack(norms))
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(with_grad, max_norm, total)
    return total


def set_lr(optimizer: Any, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
