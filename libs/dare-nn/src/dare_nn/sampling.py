"""What rollout backends share: config fields, validation, ``generate`` checks and sampling steps.

The masked-diffusion backends (``low_confidence`` and ``fast`` of ``dare-plugin-samplers``, and
the samplers of family plugins) describe the same knobs — response length, blocks, temperature,
which candidates are committed, stop-token handling, the response mask rule, micro-batching —
with the same names, defaults, help texts and error messages; they are defined once here. Each
factory returns an attrs field with help text (``dare_core.api.option``); a backend whose wording
differs passes its own ``help``. Importable without torch (a backend's config module uses it when
its plugin registers); the sampling steps import torch when they run.
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

from dare_core.api import non_negative, one_of, option, positive

if TYPE_CHECKING:
    import torch

__all__ = [
    "REMASKING",
    "STOP_CONFIDENCE",
    "gen_length_option",
    "block_length_option",
    "steps_option",
    "temperature_option",
    "remasking_option",
    "suppress_eos_option",
    "stop_confidence_option",
    "truncate_at_eos_option",
    "micro_batch_size_option",
    "BlockCounts",
    "multiple_hint",
    "check_gen_length_blocks",
    "check_records",
    "check_prompt_shapes",
    "eval_mode",
    "ConfiguredSampler",
    "CandidateScoring",
    "run_micro_batches",
    "join_micro_batches",
    "mask_through_first_stop",
]

#: ``remasking`` values of the masked-diffusion backends.
REMASKING = ("low_confidence", "random")
#: ``stop_confidence`` values.
STOP_CONFIDENCE = ("keep", "zero", "never")

GEN_LENGTH_HELP = "Response length R: number of MASK tokens appended to each prompt."
BLOCK_LENGTH_HELP = "Length of the blocks denoised left to right (semi-autoregressive); must divide gen_length."
TEMPERATURE_HELP = (
    "Sampling temperature of the candidate tokens (Gumbel-max sample of softmax(logits / T)); 0 = greedy argmax."
)
TRUNCATE_AT_EOS_HELP = (
    "Response mask rule: false = every generated position counts; true = "
    "positions up to and including the first EOS count."
)


def gen_length_option(default: int = 256, help: str = GEN_LENGTH_HELP) -> Any:
    return option(default, help, positive)


def block_length_option(note: str, default: int = 32) -> Any:
    """``block_length`` of a semi-autoregressive sampler; ``note`` follows the common help text."""
    return option(default, f"{BLOCK_LENGTH_HELP} {note}", positive)


def steps_option(default: int, help: str) -> Any:
    return option(default, help, positive)


def temperature_option(default: float = 0.6, help: str = TEMPERATURE_HELP) -> Any:
    return option(default, help, non_negative)


def remasking_option(help: str, default: str = "low_confidence", choices: tuple = REMASKING) -> Any:
    return option(default, help, one_of(choices))


def suppress_eos_option(rest: str = ".") -> Any:
    """``suppress_eos``; ``rest`` ends the common help text."""
    return option(False, "Set the EOS logit to -inf so EOS is never a candidate" + rest)


def stop_confidence_option(rest: str) -> Any:
    """``stop_confidence``; ``rest`` (the 'zero' and 'never' cases) ends the common help text."""
    return option(
        "keep", "Confidence of candidates equal to a stop token: 'keep' = unchanged; " + rest, one_of(STOP_CONFIDENCE)
    )


def truncate_at_eos_option(default: bool = False, help: str = TRUNCATE_AT_EOS_HELP) -> Any:
    return option(default, help)


def micro_batch_size_option(rest: str) -> Any:
    """``micro_batch_size``; ``rest`` ends the common help text."""
    return option(
        0, "Generate in chunks of this many rows to bound memory; 0 = the whole batch at once" + rest, non_negative
    )


class BlockCounts:
    """``num_blocks`` and ``steps_per_block`` of a config with ``gen_length``, ``block_length``
    and ``steps`` (a mixin of the semi-autoregressive backends' configs)."""

    # the fields of the config it is mixed into (declared here for the type checker only)
    gen_length: int
    block_length: int
    steps: int

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block_length

    @property
    def steps_per_block(self) -> int:
        """Denoising steps per block (the quota schedule)."""
        return self.steps // self.num_blocks


def multiple_hint(value: int, base: int) -> str:
    """The multiples of ``base`` around ``value`` (``"8 or 12"``; ``"4"`` below the first one)."""
    lower = (value // base) * base
    upper = lower + base
    return f"{upper}" if lower == 0 else f"{lower} or {upper}"


def check_gen_length_blocks(gen_length: int, block_length: int) -> None:
    """``ValueError`` unless ``block_length`` divides ``gen_length`` (naming both fixes)."""
    if gen_length % block_length != 0:
        raise ValueError(
            f"rollout.gen_length ({gen_length}) must be a multiple of "
            f"rollout.block_length ({block_length}); set block_length to a divisor of "
            f"gen_length or gen_length to a multiple of block_length "
            f"(e.g. {multiple_hint(gen_length, block_length)})"
        )


def check_records(name: str, record: Any, supported: frozenset, error: type = ValueError) -> frozenset:
    """``record`` as a frozenset; ``error`` naming the rollout ``name`` when it asks for
    records outside ``supported``."""
    record = frozenset(record)
    unknown = record - supported
    if unknown:
        raise error(
            f"{name} cannot record {', '.join(sorted(unknown))}; supported records: {', '.join(sorted(supported))}"
        )
    return record


def check_prompt_shapes(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, error: type = ValueError) -> None:
    """``error`` unless ``prompt_ids`` and ``prompt_mask`` are both ``[B, P]``."""
    if prompt_ids.dim() != 2 or prompt_mask.shape != prompt_ids.shape:
        raise error(
            f"prompt_ids and prompt_mask must both be [B, P], got "
            f"{tuple(prompt_ids.shape)} and {tuple(prompt_mask.shape)}"
        )


@contextlib.contextmanager
def eval_mode(module: torch.nn.Module) -> Iterator[None]:
    """Run the body with every submodule in eval mode and gradients off; restore each
    submodule's training flag afterwards."""
    import torch

    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for m, training in modes:
            m.training = training


class ConfiguredSampler:
    """A rollout backend built from one config of the class ``config_cls`` (``TypeError`` for
    anything else); the config is ``self.config``."""

    config_cls: type = object

    def __init__(self, config: Any):
        if not isinstance(config, self.config_cls):
            raise TypeError(f"{type(self).__name__} needs a {self.config_cls.__name__}, got {type(config).__name__}")
        self.config = config


# -- candidates and confidences of the masked-diffusion samplers -----------------------------------
class CandidateScoring:
    """Candidate drawing and scoring of the masked-diffusion samplers; ``self.config`` has
    ``temperature``, ``remasking``, ``stop_confidence`` and ``suppress_eos``."""

    config: Any

    def _ban_mask(self, vocab: int, mask_id: int, eos_id: int, device: Any) -> torch.Tensor:
        """``[V]`` bool: the MASK token (never a candidate) and, with ``suppress_eos``, EOS."""
        import torch

        ban = torch.zeros(vocab, dtype=torch.bool, device=device)
        if 0 <= mask_id < vocab:
            ban[mask_id] = True
        if self.config.suppress_eos and 0 <= eos_id < vocab:
            ban[eos_id] = True
        return ban

    def _candidates(self, logits: torch.Tensor, generator: Optional[torch.Generator]) -> torch.Tensor:
        """A candidate token per position: Gumbel-max sample of ``softmax(logits / T)`` from
        ``[..., V]`` float64 uniforms (computed on ``logits - max``), plain argmax at ``T = 0``."""
        temp = float(self.config.temperature)
        if temp == 0.0:
            return logits.argmax(dim=-1)
        import torch

        from dare_core.api import for_device

        u = torch.rand(
            logits.shape, generator=for_device(generator, logits.device), dtype=torch.float64, device=logits.device
        )
        z = logits.double()
        z = (z - z.amax(dim=-1, keepdim=True)).exp()
        return (z / (-torch.log(u)) ** temp).argmax(dim=-1)

    def _confidence(
        self, logits: torch.Tensor, x0: torch.Tensor, generator: Optional[torch.Generator], stop_ids: torch.Tensor
    ) -> torch.Tensor:
        """float64 confidence of each candidate ``x0``: its untempered probability
        (``remasking='low_confidence'``) or a uniform draw (``'random'``); candidates equal to a
        stop id get 0 (``stop_confidence='zero'``) or ``-inf`` (``'never'``)."""
        import torch

        from dare_core.api import for_device

        cfg = self.config
        if cfg.remasking == "low_confidence":
            probs = torch.softmax(logits.float(), dim=-1)
            conf = probs.gather(-1, x0[..., None]).squeeze(-1).double()
        else:
            conf = torch.rand(
                x0.shape, generator=for_device(generator, x0.device), dtype=torch.float64, device=x0.device
            )
        if cfg.stop_confidence != "keep":
            value = 0.0 if cfg.stop_confidence == "zero" else -math.inf
            conf = conf.masked_fill(torch.isin(x0, stop_ids), value)
        return conf


def run_micro_batches(
    wrapper: Any,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    micro_batch_size: int,
    run: Callable[[torch.Tensor, torch.Tensor], Any],
) -> list:
    """``run(ids, mask)`` on consecutive chunks of ``micro_batch_size`` rows (0 = the whole
    batch at once) in eval mode without gradients; the list of their results."""
    batch = prompt_ids.shape[0]
    chunk = micro_batch_size if micro_batch_size > 0 else max(batch, 1)
    with eval_mode(wrapper.module):
        return [run(prompt_ids[i : i + chunk], prompt_mask[i : i + chunk]) for i in range(0, batch, chunk)]


def join_micro_batches(parts: list, gen_length: int, device: Any) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(response_ids, reveal_step, nfe)`` of the chunks' ``(response, reveal, nfe, ...)``
    results concatenated along the batch (empty ``[0, gen_length]`` tensors without chunks)."""
    import torch

    if not parts:
        empty = torch.empty(0, gen_length, dtype=torch.long, device=device)
        return empty, empty.clone(), 0
    return (torch.cat([p[0] for p in parts], dim=0), torch.cat([p[1] for p in parts], dim=0), sum(p[2] for p in parts))


def mask_through_first_stop(response_ids: torch.Tensor, stop_ids: Any, truncate: bool = True) -> torch.Tensor:
    """``[B, R]`` long mask of the response positions up to and including each row's first stop
    token (every position when a row has none, or when ``truncate`` is false); ``stop_ids`` a
    sequence or tensor of token ids."""
    import torch

    b, r = response_ids.shape
    if not truncate:
        return torch.ones(b, r, dtype=torch.long, device=response_ids.device)
    stops = torch.as_tensor(
        list(stop_ids) if not torch.is_tensor(stop_ids) else stop_ids,
        dtype=response_ids.dtype,
        device=response_ids.device,
    )
    is_stop = torch.isin(response_ids, stops)
    last = torch.where(
        is_stop.any(dim=1),
        is_stop.long().argmax(dim=1),
        torch.full((b,), r - 1, dtype=torch.long, device=response_ids.device),
    )
    return (torch.arange(r, device=response_ids.device)[None, :] <= last[:, None]).long()
