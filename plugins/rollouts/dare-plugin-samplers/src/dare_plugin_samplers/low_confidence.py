"""Reference rollout backend: semi-autoregressive low-confidence remasking.

The sampler drives any bidirectional masked-diffusion wrapper (``wrapper.kind == "masked"``):

1. ``x = [prompt | MASK * gen_length]``; prompts are left padded and the padding is never attended
   (the attention mask is passed to ``wrapper.logits`` whenever some prompt position is padding).
2. The response is split into ``gen_length // block_length`` blocks denoised left to right; each
   block gets ``steps // num_blocks`` steps and, per row, the quota schedule of
   :func:`num_transfer_tokens` over the masks the block holds when it starts.
3. Every step runs one full forward (no cache; two with classifier-free guidance), draws a
   candidate token for every position of the current block (Gumbel-max sample of
   ``softmax(logits / T)``, plain argmax at ``T = 0``), scores it (untempered probability of the
   candidate, or a uniform draw for ``remasking="random"``) and commits, per row, the
   ``quota[row, step]`` most confident still-masked positions of the block.
4. MASKs left after the last block become EOS.

Random stream (``generator``): per executed step, first the ``[B, block_length, V]`` float64
uniforms of the Gumbel-max sample (only when ``temperature > 0``), then the ``[B, block_length]``
float64 uniforms of random remasking (only when ``remasking == "random"``). Steps in which no row
has anything to commit are skipped (no forward, no draws). Generating in micro-batches
(``micro_batch_size > 0``) therefore consumes the stream in a different order than one batch does,
so sampled outputs depend on the chunking; greedy low-confidence decoding does not.

Deliberate differences from the reference procedure (none changes greedy decoding of a model that
never predicts its own MASK token):

* the MASK token is never a candidate (its logit is set to ``-inf``), so a committed position
  always holds a real token;
* only the current block's logits are sampled and scored, since no other position can be
  committed (saves memory and random draws);
* the Gumbel-max ratio is computed on ``logits - max(logits)`` (the same argmax, no overflow);
* a confidence of ``-inf`` (``stop_confidence="never"``) means "ranked last": such a candidate is
  committed only if its row's quota cannot be met otherwise, and positions that are not masked or
  lie outside the current block are never committed, whatever the quota.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

import dare_nn.sampling as common
from dare_core.api import RolloutBatch
from dare_nn.sampling import mask_through_first_stop
from dare_plugin_samplers.config import LOW_CONFIDENCE_RECORDS, LowConfidenceConfig

__all__ = [
    "LowConfidenceConfig",
    "LowConfidenceSampler",
    "SUPPORTED_RECORDS",
    "num_transfer_tokens",
]

SUPPORTED_RECORDS = LOW_CONFIDENCE_RECORDS


# --------------------------------------------------------------------------- schedule


def num_transfer_tokens(mask_count: torch.Tensor, steps: int) -> torch.Tensor:
    """Per-step commit quota: ``n`` masks over ``steps`` steps.

    Every step gets ``n // steps`` tokens and the first ``n % steps`` steps one more, so the row
    sums to ``n``. E.g. ``(32, 5) -> [7, 7, 6, 6, 6]``, ``(3, 5) -> [1, 1, 1, 0, 0]``.

    :param mask_count: ``[B]`` integer number of masks per row.
    :param steps: number of steps (> 0).
    :returns: ``[B, steps]`` long.
    """
    if steps <= 0:
        raise ValueError(f"steps must be positive, got {steps}")
    n = torch.as_tensor(mask_count).long().reshape(-1)
    base = torch.div(n, steps, rounding_mode="floor")
    rem = n - base * steps
    idx = torch.arange(steps, device=n.device)
    return base[:, None] + (idx[None, :] < rem[:, None]).long()


def _commit_mask(conf: torch.Tensor, eligible: torch.Tensor, quota: torch.Tensor) -> torch.Tensor:
    """Per row, the ``quota`` eligible positions of highest confidence.

    ``-inf`` confidences still rank above ineligible positions; a quota larger than the number of
    eligible positions commits all of them. Ties are broken by position (earlier first).

    :param conf: ``[B, W]`` float confidences.
    :param eligible: ``[B, W]`` bool, positions that may be committed.
    :param quota: ``[B]`` long.
    :returns: ``[B, W]`` bool.
    """
    b, w = conf.shape
    key = conf.masked_fill(~eligible, -math.inf)
    order = torch.argsort(key, dim=1, descending=True, stable=True)
    # eligible positions (even at -inf) before ineligible ones, keeping the confidence order
    elig_sorted = eligible.gather(1, order).to(torch.int8)
    order = order.gather(1, torch.argsort(elig_sorted, dim=1, descending=True, stable=True))
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(w, device=conf.device).expand(b, w).contiguous())
    return (rank < quota[:, None]) & eligible


# --------------------------------------------------------------------------- sampler
class LowConfidenceSampler(common.ConfiguredSampler, common.CandidateScoring):
    """Semi-autoregressive low-confidence remasking sampler (see the module docstring).

    :param config: :class:`LowConfidenceConfig`.
    """

    config_cls = LowConfidenceConfig

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

        :param wrapper: a masked-diffusion :class:`~dare_core.interfaces.ModelWrapper`.
        :param prompt_ids: ``[B, P]`` long, left padded.
        :param prompt_mask: ``[B, P]``, 0 on padding.
        :param record: subset of :data:`SUPPORTED_RECORDS`; ``"reveal_step"`` fills
            ``RolloutBatch.reveal_step`` with the global 0-based step (block ``b``, local step
            ``s`` -> ``b * steps_per_block + s``) at which each response token was committed,
            -1 where the position was EOS-filled after the last block.
            ``"step_states"`` fills ``extras`` with three ``[B, steps, R]`` tensors, one entry per
            denoising step: ``step_inputs`` (the response before the step's commits),
            ``step_predictions`` (the step's prediction of the clean response: the sampled
            candidate in the current block, the argmax elsewhere, committed tokens kept) and
            ``step_confidence`` (untempered probability of that prediction). With this record
            every step runs a forward, also steps whose quota is 0 for every row.
        :param generator: random stream for sampling and random remasking (the global one if
            ``None``).
        :returns: a :class:`~dare_core.interfaces.RolloutBatch`; ``nfe`` counts model forward
            calls summed over micro-batches (a guided step counts 2), ``num_steps = steps``.
        """
        cfg = self.config
        record = common.check_records("the low_confidence rollout", record, SUPPORTED_RECORDS)
        kind = getattr(wrapper, "kind", None)
        if kind != "masked":
            raise ValueError(
                f"the low_confidence rollout drives bidirectional masked-diffusion models "
                f"(wrapper.kind 'masked'), got kind {kind!r}; choose a rollout backend that "
                f"supports {kind!r} models"
            )
        common.check_prompt_shapes(prompt_ids, prompt_mask)

        want_reveal = "reveal_step" in record
        want_states = "step_states" in record
        parts = common.run_micro_batches(
            wrapper,
            prompt_ids,
            prompt_mask,
            cfg.micro_batch_size,
            lambda ids, mask: self._generate_chunk(wrapper, ids, mask, generator, want_states),
        )
        response_ids, reveal, nfe = common.join_micro_batches(parts, cfg.gen_length, prompt_ids.device)
        states = {k: torch.cat([p[3][k] for p in parts], dim=0) for k in parts[0][3]} if parts and want_states else {}

        return RolloutBatch(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            response_ids=response_ids,
            response_mask=self._response_mask(response_ids, wrapper.eos_token_id),
            reveal_step=reveal if want_reveal else None,
            num_steps=cfg.steps,
            nfe=nfe,
            extras=states,
        )

    def total_steps(self, wrapper: Any, prompt_mask: torch.Tensor) -> int:
        """Global denoising steps of a full run: ``steps`` (the end of :meth:`continue_from`)."""
        return self.config.steps

    def continue_from(
        self,
        wrapper: Any,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        response: torch.Tensor,
        *,
        start_step: int,
        stop_step: int,
        generator: Optional[torch.Generator] = None,
    ) -> RolloutBatch:
        """Resume denoising partial responses over the global steps ``[start_step, stop_step)``.

        ``response`` ``[B, gen_length]`` holds committed tokens and the mask token where still to
        decode (e.g. the state another call left after ``start_step`` steps). A block entered in
        the middle spreads its remaining masks over its remaining steps. Positions still masked
        at the end stay masked unless ``stop_step`` is the last step (then they become EOS).
        ``reveal_step`` holds the global step of the tokens committed by this call, -1 elsewhere;
        ``response_mask`` follows the backend's rule. Same random stream order as
        :meth:`generate` for the steps run.
        """
        cfg = self.config
        if not 0 <= start_step <= stop_step <= cfg.steps:
            raise ValueError(f"need 0 <= start_step <= stop_step <= steps={cfg.steps}, got {start_step}, {stop_step}")
        if response.shape != (prompt_ids.shape[0], cfg.gen_length):
            raise ValueError(
                f"response must be [B, gen_length] = "
                f"{(prompt_ids.shape[0], cfg.gen_length)}, got {tuple(response.shape)}"
            )
        with common.eval_mode(wrapper.module):
            out, reveal, nfe, _ = self._generate_chunk(
                wrapper, prompt_ids, prompt_mask, generator, False, response, start_step, stop_step
            )
        return RolloutBatch(
            prompt_ids,
            prompt_mask,
            out,
            self._response_mask(out, wrapper.eos_token_id),
            reveal_step=reveal,
            num_steps=cfg.steps,
            nfe=nfe,
        )

    # ------------------------------------------------------------------ internals
    def _response_mask(self, response_ids: torch.Tensor, eos_id: int) -> torch.Tensor:
        return mask_through_first_stop(response_ids, [eos_id], self.config.truncate_at_eos)

    def _generate_chunk(
        self,
        wrapper: Any,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        generator: Optional[torch.Generator],
        want_states: bool = False,
        response: Optional[torch.Tensor] = None,
        start: int = 0,
        stop: Optional[int] = None,
    ) -> tuple[torch.Tensor, torch.Tensor, int, dict[str, torch.Tensor]]:
        cfg = self.config
        device = prompt_ids.device
        b, p = prompt_ids.shape
        r, width, spb = cfg.gen_length, cfg.block_length, cfg.steps_per_block
        mask_id, eos_id = int(wrapper.mask_token_id), int(wrapper.eos_token_id)

        if response is None:
            response = torch.full((b, r), mask_id, dtype=torch.long, device=device)
        x = torch.cat([prompt_ids.long(), response.long()], dim=1)
        stop = cfg.steps if stop is None else stop
        prompt_valid = prompt_mask.bool()
        attn = None
        if not bool(prompt_valid.all()):
            attn = torch.cat([prompt_valid.long(), torch.ones(b, r, dtype=torch.long, device=device)], dim=1)
        stop_ids = torch.tensor(
            sorted({int(t) for t in wrapper.stop_token_ids} | {eos_id}),
            dtype=torch.long,
            device=device,
        )

        pending = x[:, p:] == mask_id
        reveal = torch.full((b, r), -1, dtype=torch.long, device=device)
        nfe = 0
        inputs, preds, confs = [], [], []
        for blk in range(cfg.num_blocks):
            lo, hi = blk * width, (blk + 1) * width
            first, last = max(start, blk * spb), min(stop, (blk + 1) * spb)
            if first >= last:
                continue  # this block's steps lie outside [start, stop)
            # quota over the block's remaining steps (all of them when the block starts fresh)
            quota = num_transfer_tokens(pending[:, lo:hi].sum(dim=1), (blk + 1) * spb - first)
            for step in range(first - blk * spb, last - blk * spb):
                k = quota[:, step - (first - blk * spb)]
                if not want_states and not bool((k > 0).any()):
                    continue  # nobody commits: the forward would change nothing
                if want_states:
                    full, calls = self._block_logits(wrapper, x, attn, prompt_valid, p, p + r, mask_id)
                    full = self._ban(full, mask_id, eos_id)
                    logits = full[:, lo:hi]
                else:
                    logits, calls = self._block_logits(wrapper, x, attn, prompt_valid, p + lo, p + hi, mask_id)
                    logits = self._ban(logits, mask_id, eos_id)
                nfe += calls
                x0 = self._candidates(logits, generator)
                if want_states:
                    cur = x[:, p:].clone()
                    pred = full.argmax(dim=-1)
                    pred[:, lo:hi] = x0
                    pconf = torch.softmax(full, dim=-1).gather(-1, pred[..., None]).squeeze(-1)
                    inputs.append(cur)
                    preds.append(torch.where(cur == mask_id, pred, cur))
                    confs.append(pconf)
                conf = self._confidence(logits, x0, generator, stop_ids)
                commit = _commit_mask(conf, pending[:, lo:hi], k)
                x[:, p + lo : p + hi] = torch.where(commit, x0, x[:, p + lo : p + hi])
                pending[:, lo:hi] &= ~commit
                reveal[:, lo:hi] = torch.where(commit, torch.full_like(k, blk * spb + step)[:, None], reveal[:, lo:hi])
        response = x[:, p:].masked_fill(pending, eos_id) if stop >= cfg.steps else x[:, p:]
        states: dict[str, torch.Tensor] = {}
        if want_states:
            states = {
                "step_inputs": torch.stack(inputs, 1),
                "step_predictions": torch.stack(preds, 1),
                "step_confidence": torch.stack(confs, 1),
            }
        return response, reveal, nfe, states

    def _block_logits(
        self,
        wrapper: Any,
        x: torch.Tensor,
        attn: Optional[torch.Tensor],
        prompt_valid: torch.Tensor,
        lo: int,
        hi: int,
        mask_id: int,
    ) -> tuple[torch.Tensor, int]:
        """Float32 logits of columns ``[lo, hi)`` and the number of forward calls it cost."""
        scale = self.config.cfg_scale
        if scale <= 0:
            return wrapper.logits(x, attn)[:, lo:hi].float(), 1
        p = prompt_valid.shape[1]
        uncond = x.clone()
        uncond[:, :p] = uncond[:, :p].masked_fill(prompt_valid, mask_id)
        both_attn = None if attn is None else torch.cat([attn, attn], dim=0)
        out = wrapper.logits(torch.cat([x, uncond], dim=0), both_attn)[:, lo:hi].float()
        cond, un = out[: x.shape[0]], out[x.shape[0] :]
        return un + (scale + 1.0) * (cond - un), 2

    def _ban(self, logits: torch.Tensor, mask_id: int, eos_id: int) -> torch.Tensor:
        return logits.masked_fill(self._ban_mask(logits.shape[-1], mask_id, eos_id, logits.device), -math.inf)


# --------------------------------------------------------------------------- registration
