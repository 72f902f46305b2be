"""Dream's reference sampler (``diffusion_generate`` of Dream's ``generation_utils.py``) as a
DARE rollout backend.

The whole response window is denoised at once (no blocks):

1. ``x = [prompt | MASK * gen_length]``; prompts are left padded and the padding is never
   attended (a key-padding mask is passed to ``wrapper.logits`` whenever a prompt is padded);
2. ``timesteps = linspace(1, eps, steps + 1)``; step ``i`` goes from ``t = timesteps[i]`` to
   ``s = timesteps[i + 1]`` with one full forward (aligned logits: for Dream the wrapper applies
   the AR shift, ``aligned[i] = raw[i - 1]``);
3. candidate tokens and confidences (``sample_tokens``): logits ``/ temperature`` (when > 0), then
   the top-p filter (keep the smallest prefix of the sorted distribution whose mass reaches
   ``top_p``, the token crossing it included), then the top-k filter, then ``probs = softmax``;
   ``temperature > 0``: the candidate is drawn from ``probs``, ``temperature = 0``: argmax.
   Confidence: ``maskgit_plus`` = probability of the candidate, ``topk_margin`` = top-1 minus
   top-2 probability, ``entropy`` = ``sum p log(p + 1e-10)`` (negative entropy);
4. ``alg = origin``: every masked position is committed independently with probability
   ``1 - s / t`` (1 at the last step) with its sampled candidate; other algorithms commit
   ``n = int(mean_b(#masked_b) * (1 - s / t))`` positions per row (all remaining ones at the last
   step), the ``n`` most confident masked positions (``alg_temp = 0``) or ``n`` positions drawn
   without replacement from ``softmax(confidence / alg_temp)`` (``alg_temp > 0``).

Example quota schedule: 64 masks over 8 steps -> ``[7, 8, 8, 8, 8, 8, 8, 9]``.

Random stream (``generator``), per executed step: for ``origin`` first the ``[B, R]`` float32
uniforms of the transfer draw, then one categorical draw per committed position (``T > 0``);
for the other algorithms one categorical draw per masked position (``T > 0``), then (``alg_temp >
0``) the multinomial draw of the positions. Steps of a confidence algorithm whose quota is 0 are
skipped (no forward, no draws): they change nothing.

Deliberate differences from the reference procedure (none changes what a model that never
predicts its own MASK token generates in a batch of equal-length responses):

* the MASK token is never a candidate (its logit is set to ``-inf``), so a committed position
  always holds a real token (the reference can "commit" a MASK, which then stays masked);
* commits are restricted to still-masked response positions (with ``topk`` over a whole row the
  reference can overwrite prompt or committed tokens with MASK when a row has fewer masks than the
  batch-mean quota);
* MASKs left at the end (only possible through the previous two cases) become EOS;
* the reference's ``confidence_threshold`` algorithm (batch size 1 only) is not provided.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

from dare_core.api import RolloutBatch, for_device
from dare_nn.sampling import (
    ConfiguredSampler,
    check_prompt_shapes,
    check_records,
    join_micro_batches,
    mask_through_first_stop,
    run_micro_batches,
)
from dare_plugin_dream.config import ALGORITHMS, SUPPORTED_RECORDS, DreamSamplerConfig

__all__ = [
    "ALGORITHMS",
    "DreamSamplerConfig",
    "DreamSampler",
    "SUPPORTED_RECORDS",
    "sample_tokens",
    "top_p_filter",
    "top_k_filter",
    "transfer_counts",
]

_ENTROPY_EPS = 1e-10


# --------------------------------------------------------------------------- token sampling
def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the most probable tokens up to and including the one whose cumulative probability
    first exceeds ``top_p``; the others get the dtype's lowest value."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
    drop_sorted = cum > top_p
    drop_sorted[..., 1:] = drop_sorted[..., :-1].clone()
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, torch.finfo(logits.dtype).min)


def top_k_filter(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep the ``top_k`` largest logits (ties with the k-th kept); 0 = no filter."""
    if top_k <= 0:
        return logits
    k = min(int(top_k), logits.shape[-1])
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, torch.finfo(logits.dtype).min)


def sample_tokens(
    logits: torch.Tensor,
    *,
    temperature: float,
    top_p: float = 1.0,
    top_k: int = 0,
    confidence: str = "maskgit_plus",
    generator: Optional[torch.Generator] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidates and confidences for ``logits`` ``[N, V]`` (float32) -> ``(conf [N], x0 [N])``.

    ``confidence``: ``maskgit_plus`` (probability of ``x0``), ``topk_margin`` (top-1 minus top-2
    probability) or ``entropy`` (``sum p log(p + 1e-10)``), all under the filtered, tempered
    distribution.
    """
    z = logits.float()
    if temperature > 0:
        z = z / temperature
    z = top_k_filter(top_p_filter(z, top_p), top_k)
    probs = torch.softmax(z, dim=-1)
    if temperature > 0 and probs.shape[0] > 0:
        x0 = torch.multinomial(probs, 1, generator=for_device(generator, probs.device)).squeeze(-1)
        conf = probs.gather(-1, x0[:, None]).squeeze(-1)
    else:
        conf, x0 = probs.max(dim=-1)
    if confidence == "topk_margin":
        top2 = torch.topk(probs, 2, dim=-1).values
        conf = top2[:, 0] - top2[:, 1]
    elif confidence == "entropy":
        conf = (probs * torch.log(probs + _ENTROPY_EPS)).sum(dim=-1)
    elif confidence != "maskgit_plus":
        raise ValueError(f"unknown confidence {confidence!r}")
    return conf, x0


def transfer_counts(mask_count: int, steps: int, eps: float = 1e-3) -> list[int]:
    """The per-step quota of the confidence algorithms for ``mask_count`` masks per row.

    ``n_i = int(m_i * (1 - s_i / t_i))`` with ``m_i`` the masks left before step ``i`` (all of
    them at the last step). E.g. ``(64, 8) -> [7, 8, 8, 8, 8, 8, 8, 9]``.
    """
    ts = torch.linspace(1, eps, steps + 1)
    left, out = int(mask_count), []
    for i in range(steps):
        n = int(torch.tensor(float(left)) * (1 - ts[i + 1] / ts[i])) if i < steps - 1 else left
        n = min(n, left)
        out.append(n)
        left -= n
    return out


# --------------------------------------------------------------------------- sampler
class DreamSampler(ConfiguredSampler):
    """Dream's whole-window diffusion sampler (see the module docstring).

    :param config: :class:`DreamSamplerConfig`.
    """

    config_cls = DreamSamplerConfig

    def generate(
        self,
        wrapper: Any,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        *,
        record: frozenset[str] = frozenset(),
        generator: Optional[torch.Generator] = None,
    ) -> RolloutBatch:
        """Generate ``gen_length`` tokens after every (left-padded) prompt.

        :param wrapper: a masked-diffusion :class:`~dare_core.interfaces.ModelWrapper` (its
            ``logits`` are aligned: position ``i`` predicts token ``i``).
        :param prompt_ids: ``[B, P]`` long, left padded.
        :param prompt_mask: ``[B, P]``, 0 on padding.
        :param record: subset of :data:`SUPPORTED_RECORDS`; ``"reveal_step"`` fills
            ``RolloutBatch.reveal_step`` with the 0-based step at which each response token was
            committed (-1 where a leftover MASK was replaced by EOS).
        :param generator: random stream (the global one if ``None``).
        :returns: a :class:`~dare_core.interfaces.RolloutBatch`; ``nfe`` counts forward calls summed
            over micro-batches, ``num_steps = steps``.
        """
        cfg = self.config
        record = check_records("the dream_generate rollout", record, SUPPORTED_RECORDS)
        kind = getattr(wrapper, "kind", None)
        if kind != "masked":
            raise ValueError(
                f"the dream_generate rollout drives bidirectional masked-diffusion models "
                f"(wrapper.kind 'masked'), got kind {kind!r}"
            )
        check_prompt_shapes(prompt_ids, prompt_mask)
        parts = run_micro_batches(
            wrapper,
            prompt_ids,
            prompt_mask,
            cfg.micro_batch_size,
            lambda ids, mask: self._generate_chunk(wrapper, ids, mask, generator),
        )
        response, reveal, nfe = join_micro_batches(parts, cfg.gen_length, prompt_ids.device)
        return RolloutBatch(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            response_ids=response,
            response_mask=mask_through_first_stop(response, [wrapper.eos_token_id], self.config.truncate_at_eos),
            reveal_step=reveal if "reveal_step" in record else None,
            num_steps=cfg.steps,
            nfe=nfe,
        )

    # ------------------------------------------------------------------ internals
    def _generate_chunk(
        self, wrapper: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, generator: Optional[torch.Generator]
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        cfg = self.config
        device = prompt_ids.device
        b, p = prompt_ids.shape
        r = cfg.gen_length
        mask_id, eos_id = int(wrapper.mask_token_id), int(wrapper.eos_token_id)
        x = torch.cat([prompt_ids.long(), torch.full((b, r), mask_id, dtype=torch.long, device=device)], dim=1)
        attn = None
        if not bool(prompt_mask.bool().all()):
            attn = torch.cat([prompt_mask.long(), torch.ones(b, r, dtype=torch.long, device=device)], dim=1)
        pending = torch.ones(b, r, dtype=torch.bool, device=device)
        reveal = torch.full((b, r), -1, dtype=torch.long, device=device)
        timesteps = torch.linspace(1, cfg.eps, cfg.steps + 1, device=device)
        nfe = 0
        for i in range(cfg.steps):
            if not bool(pending.any()):
                break
            last = i == cfg.steps - 1
            t, s = timesteps[i], timesteps[i + 1]
            if cfg.alg != "origin":
                # float32 arithmetic as in the reference: int(mean_b(#masked) * (1 - s / t))
                mean_masks = pending.sum(dtype=torch.float32) / b
                n = int(mean_masks) if last else int(mean_masks * (1 - s / t))
                if n <= 0:
                    continue
            logits = wrapper.logits(x, attn)[:, p:].float()
            nfe += 1
            if 0 <= mask_id < logits.shape[-1]:
                logits[..., mask_id] = -math.inf
            if cfg.alg == "origin":
                commit, tokens = self._origin_step(logits, pending, 1.0 if last else float(1 - s / t), generator)
            else:
                commit, tokens = self._confidence_step(logits, pending, n, generator)
            region = x[:, p:]
            x[:, p:] = torch.where(commit, tokens, region)
            pending &= ~commit
            reveal = torch.where(commit, torch.full_like(reveal, i), reveal)
        response = x[:, p:].masked_fill(pending, eos_id)
        return response, reveal, nfe

    def _origin_step(
        self, logits: torch.Tensor, pending: torch.Tensor, p_transfer: float, generator: Optional[torch.Generator]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.config
        u = torch.rand(pending.shape, generator=for_device(generator, pending.device), device=pending.device)
        commit = pending & (u < p_transfer)
        tokens = torch.zeros_like(pending, dtype=torch.long)
        if bool(commit.any()):
            _, x0 = sample_tokens(
                logits[commit], temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, generator=generator
            )
            tokens[commit] = x0
        return commit, tokens

    def _confidence_step(
        self, logits: torch.Tensor, pending: torch.Tensor, n: int, generator: Optional[torch.Generator]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.config
        conf, x0 = sample_tokens(
            logits[pending],
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            top_k=cfg.top_k,
            confidence=cfg.alg,
            generator=generator,
        )
        full = torch.full(pending.shape, -math.inf, dtype=torch.float32, device=pending.device)
        full[pending] = conf.float()
        tokens = torch.zeros_like(pending, dtype=torch.long)
        tokens[pending] = x0
        k = min(n, pending.shape[1])
        if cfg.alg_temp > 0:
            weights = torch.softmax(full / cfg.alg_temp, dim=-1)
            # rows with fewer masks than k: only their masked positions can be drawn
            counts = pending.sum(dim=1)
            picks = torch.zeros_like(pending)
            gen = for_device(generator, weights.device)
            for row in range(pending.shape[0]):
                kr = min(k, int(counts[row]))
                if kr > 0:
                    idx = torch.multinomial(weights[row], kr, replacement=False, generator=gen)
                    picks[row, idx] = True
        else:
            idx = torch.topk(full, k, dim=-1).indices
            picks = torch.zeros_like(pending).scatter(1, idx, True)
        return picks & pending, tokens
