"""The ``deepspeed:`` section of the run config, and the DeepSpeed config a run trains with.

The run config decides what is computed: the optimizer's hyper-parameters (``trainer.*``), the
clipping norm, the micro-batch, the precision (``engine.precision``) and the ZeRO stage and
offloading (this section). A DeepSpeed JSON file given as ``deepspeed.config`` adds what only
DeepSpeed knows (bucket sizes, persistence thresholds, communication dtypes, ...). Each field of
that file which the run also sets may be ``"auto"`` (filled from the run), be left out (filled
too), or hold the run's own value; any other value contradicts the run and is refused in one line
that names the field. Other ``"auto"`` values (keys of Hugging Face's DeepSpeed integration that
DARE does not compute, such as ``reduce_bucket_size``) are dropped, so DeepSpeed's default applies.

Reference: DeepSpeed configuration JSON, https://www.deepspeed.ai/docs/config-json/
"""

from __future__ import annotations

import copy
import json
import math
import pathlib
from typing import Any, Literal, Optional

import attrs

from dare_core.api import DareError, option

SECTION = "deepspeed"
AUTO = "auto"

#: ``print`` period of DeepSpeed's own progress line (``steps_per_print``): never; the core logs
QUIET_STEPS = 2**31 - 1

#: optimizer types of a JSON ``optimizer`` section that run the trainer's AdamW update
ADAM_TYPES = ("adam", "adamw")


def _offload_param(inst: Any, attr: Any, value: str) -> None:
    if value != "none" and inst.zero_stage != 3:
        raise ValueError(
            f"{attr.name}={value} needs zero_stage=3 (stages 1 and 2 keep whole "
            f"parameters on every device), got zero_stage={inst.zero_stage}"
        )


@attrs.frozen
class DeepSpeedConfig:
    """DeepSpeed ZeRO (``engine.name=deepspeed``): what is partitioned over the processes, what
    lives in host memory, and an optional DeepSpeed JSON config."""

    zero_stage: Literal[1, 2, 3] = option(
        2,
        "ZeRO stage (Rajbhandari et al., arXiv:1910.02054): 1 = optimizer states and fp32 master "
        "weights partitioned over the processes; 2 = and gradients; 3 = and the parameters "
        "themselves, gathered module by module for each forward and backward.",
    )
    offload_optimizer: Literal["none", "cpu"] = option(
        "none",
        "cpu = optimizer states and fp32 master weights in host memory, stepped there by "
        "DeepSpeed's CPU Adam (ZeRO-Offload, arXiv:2101.06840); none = on the device.",
    )
    offload_param: Literal["none", "cpu"] = option(
        "none",
        "zero_stage=3 only: cpu = partitioned parameters kept in host memory between uses "
        "(ZeRO-Infinity, arXiv:2104.07857); none = on the device.",
        _offload_param,
    )
    config: Optional[str] = option(
        None,
        "Path to a DeepSpeed JSON config for DeepSpeed's own settings. Fields the run sets "
        "(train_micro_batch_size_per_gpu, gradient_accumulation_steps, train_batch_size, "
        "gradient_clipping, bf16.enabled, optimizer.params lr/betas/eps/weight_decay, "
        'zero_optimization stage/offload devices) may be "auto" or left out; a different '
        "value is refused. null = DARE's defaults only.",
    )


def _same(given: Any, wanted: Any) -> bool:
    """Whether a JSON value equals the run's (numbers by value, lists element-wise, strings
    case-insensitively)."""
    if isinstance(wanted, bool) or isinstance(given, bool):
        return given is wanted
    if isinstance(wanted, (int, float)):
        return isinstance(given, (int, float)) and math.isclose(float(given), float(wanted), rel_tol=1e-12, abs_tol=0.0)
    if isinstance(wanted, (list, tuple)):
        return (
            isinstance(given, (list, tuple))
            and len(given) == len(wanted)
            and all(_same(g, w) for g, w in zip(given, wanted))
        )
    if isinstance(wanted, str):
        return isinstance(given, str) and given.lower() == wanted.lower()
    return given == wanted


class _Filler:
    """Fills the run's values into a JSON tree, refusing a value that contradicts the run."""

    def __init__(self, tree: dict[str, Any], source: str):
        self.tree = tree
        self.source = source

    def _where(self, key: str) -> str:
        return f"deepspeed.config {self.source}: {key}" if self.source else key

    def _node(self, path: tuple[str, ...], create: bool) -> Optional[dict[str, Any]]:
        node = self.tree
        for i, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None or child == AUTO:
                if not create:
                    return None
                child = node[part] = {}
            if not isinstance(child, dict):
                raise DareError(f"{self._where('.'.join(path[: i + 1]))} must be a mapping, got {child!r}")
            node = child
        return node

    def fill(self, path: tuple[str, ...], value: Any, owner: str, *, add: bool = True) -> None:
        """``path`` takes the run's ``value`` (set by ``owner``): written where it is absent
        (``add``) or ``"auto"``, kept where it is equal, refused otherwise."""
        node = self._node(path, create=add)
        if node is None:
            return
        key = path[-1]
        if key not in node:
            if add:
                node[key] = value
            return
        given = node[key]
        if given == AUTO:
            node[key] = value
        elif _same(given, value):
            node[key] = value
        else:
            raise DareError(
                f"{self._where('.'.join(path))}={json.dumps(given)} contradicts {owner}="
                f'{json.dumps(value)}; write "auto" (or {json.dumps(value)}) there, or '
                f"change {owner}"
            )

    def default(self, path: tuple[str, ...], value: Any) -> None:
        """``path`` gets ``value`` unless the file sets it."""
        node = self._node(path, create=True)
        if node.get(path[-1], AUTO) == AUTO:
            node[path[-1]] = value

    def get(self, path: tuple[str, ...]) -> Any:
        node = self._node(path, create=False)
        return None if node is None else node.get(path[-1])

    def refuse(self, path: tuple[str, ...], why: str) -> None:
        raise DareError(f"{self._where('.'.join(path))}: {why}")


def _drop_auto(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _drop_auto(v) for k, v in tree.items() if v != AUTO}
    return tree


def read_json(path: str) -> dict[str, Any]:
    """The DeepSpeed JSON file ``path`` as a dict (a one-line error when it cannot be read)."""
    try:
        data = json.loads(pathlib.Path(path).read_text())
    except FileNotFoundError:
        raise DareError(f"deepspeed.config={path}: no such file") from None
    except (OSError, ValueError) as exc:
        raise DareError(f"deepspeed.config={path}: not a JSON file ({' '.join(str(exc).split())})") from None
    if not isinstance(data, dict):
        raise DareError(f"deepspeed.config={path}: expected a JSON object, got {type(data).__name__}")
    return data


def deepspeed_config(
    section: DeepSpeedConfig, trainer: Any, precision: str, world_size: int, device_type: str
) -> dict[str, Any]:
    """The DeepSpeed config of a run: the JSON file of ``section.config`` (if any) with the run's
    values filled in, checked against the run, plus the engine's fixed settings.

    The engine accumulates every micro-batch of a step itself and steps once per optimizer step,
    so DeepSpeed runs with ``gradient_accumulation_steps=1`` and
    ``managed_gradient_accumulation=false`` (``step()`` is the accumulation boundary, whatever
    the number of backward passes before it).
    """
    raw = read_json(section.config) if section.config else {}
    tree = copy.deepcopy(raw)
    f = _Filler(tree, section.config or "")
    micro = trainer.micro_batch_size
    own = "the deepspeed engine (it accumulates every micro-batch of a step itself)"

    if "scheduler" in tree:
        f.refuse(
            ("scheduler",),
            "DARE sets the learning rate of every step (trainer.lr, "
            "trainer.lr_schedule, trainer.warmup_ratio); remove the scheduler",
        )
    f.fill(("train_micro_batch_size_per_gpu",), micro, "trainer.micro_batch_size")
    f.fill(("gradient_accumulation_steps",), 1, own)
    f.fill(
        ("train_batch_size",),
        micro * world_size,
        f"trainer.micro_batch_size x {world_size} processes (one DeepSpeed micro-step per step)",
    )
    f.fill(("managed_gradient_accumulation",), False, own)
    f.fill(("gradient_clipping",), float(trainer.grad_clip), "trainer.grad_clip")

    bf16 = precision == "bf16-mixed"
    f.fill(("bf16", "enabled"), bf16, f"engine.precision={precision}")
    f.fill(("fp16", "enabled"), False, f"engine.precision={precision} (DARE does not train in fp16)", add=False)
    f.fill(
        ("torch_autocast", "enabled"),
        False,
        f"engine.precision={precision} (bf16-mixed is DeepSpeed's bf16 mode)",
        add=False,
    )
    if bf16:  # a non-finite gradient norm skips the step (bf16 ZeRO-1/2 checks only when asked)
        f.fill(("bf16", "check_grad_overflow"), True, "trainer.grad_clip (non-finite norms skip the step)")

    zero = ("zero_optimization",)
    f.fill(zero + ("stage",), section.zero_stage, "deepspeed.zero_stage")
    for name, device in (("offload_optimizer", section.offload_optimizer), ("offload_param", section.offload_param)):
        f.fill(zero + (name, "device"), device, f"deepspeed.{name}", add=device != "none")
        if device != "none":
            f.default(zero + (name, "pin_memory"), device_type == "cuda")
    f.fill(
        zero + ("compute_grad_norm",),
        True,
        "the engine (it reports each step's gradient norm and skips non-finite ones)",
        add=False,
    )
    if section.zero_stage != 2:  # DeepSpeed overlaps only ZeRO-2 reductions when step() is the boundary
        f.fill(
            zero + ("overlap_comm",),
            False,
            f"deepspeed.zero_stage={section.zero_stage} (DeepSpeed overlaps reductions with "
            f"managed_gradient_accumulation=false only under ZeRO-2)",
        )

    if "optimizer" in tree or section.offload_optimizer != "none":
        kind = f.get(("optimizer", "type"))
        if kind is not None and str(kind).lower() not in ADAM_TYPES:
            f.refuse(
                ("optimizer", "type"),
                f"{kind!r} is not AdamW; DARE trains with AdamW "
                f"(trainer.lr, beta1, beta2, adam_eps, weight_decay): use "
                f"AdamW or remove the optimizer section",
            )
        if f.get(("optimizer", "params", "adam_w_mode")) is False:
            f.refuse(
                ("optimizer", "params", "adam_w_mode"),
                "false makes Adam add weight decay to the gradient; DARE trains with AdamW "
                "(decoupled weight decay): remove it",
            )
        f.default(("optimizer", "type"), "AdamW")
        params = ("optimizer", "params")
        f.fill(params + ("lr",), float(trainer.lr), "trainer.lr")
        f.fill(params + ("betas",), [float(trainer.beta1), float(trainer.beta2)], "[trainer.beta1, trainer.beta2]")
        f.fill(params + ("eps",), float(trainer.adam_eps), "trainer.adam_eps")
        f.fill(params + ("weight_decay",), float(trainer.weight_decay), "trainer.weight_decay")

    f.default(("steps_per_print",), QUIET_STEPS)
    f.default(("wall_clock_breakdown",), False)
    return _drop_auto(tree)
