"""Accelerated rollout backend ``fast``: block KV caches and confidence-threshold parallel decoding.

The procedure is the semi-autoregressive masked-diffusion sampler of
:mod:`dare_plugin_samplers.low_confidence` (same blocks, candidates, confidences, quota schedule,
stop handling, records and random stream), made cheaper in two independent ways, following Wu et
al. 2025, "Training-free acceleration of diffusion LLMs by enabling KV cache and parallel
decoding" (arXiv:2505.22618):

**Approximate KV caches** (``cache``). A bidirectional model's keys and values change whenever
any token changes, so exact reuse is impossible; between two blocks they change little. Every
block starts with one full forward over ``[prompt | response]`` (exactly the uncached
computation, so the block's first step commits the same tokens as without a cache) that also
returns every position's keys/values. The block's later steps reuse them:

* ``prefix``: the cache holds the positions before the block; each step recomputes the block
  and everything after it (``x[:, block_start:]``);
* ``dual``: the cache holds the positions before *and after* the block; each step recomputes
  only the block's ``block_length`` tokens;
* ``delayed``: ``dual``, and in addition the keys/values of the block's committed tokens are
  cached once they have been encoded with their token, one step after the commit (the delayed
  caching of dKV-Cache-Decode, Ma et al. 2025, arXiv:2505.15781): each step queries only the
  block positions that are still masked plus those committed on the previous step, i.e. about
  half the block on average at one token per step. The cache holds every position (by
  position); superseded entries are masked out of the attention and overwritten with the new
  keys/values after the step. Needs ``logit_shift = 0`` (its queries are not contiguous);
* ``none``: every step is a full forward (with ``decoding: quota`` this is exactly the
  reference sampler; the equivalence is tested).

``refresh_every = k > 0`` also reruns the full forward (refreshing the cache) on every k-th step
of a block, for long blocks whose cached keys would otherwise stay those of the block start.

**Parallel decoding** (``decoding``). ``quota`` commits, per row, the reference quota schedule
(``steps // num_blocks`` steps per block; ``steps = gen_length`` is one token per step).
``threshold`` commits every still-masked position of the block whose confidence (untempered
probability of its candidate) is at least ``threshold``, and always at least the row's most
confident one, so every step makes progress and a block takes at most ``block_length`` steps;
the block ends as soon as no row has a MASK left in it.

The model is driven only through ``wrapper.forward_cached`` (capability ``kv_cache``), with
explicit position ids ``0 .. P+R-1`` (what ``wrapper.logits`` uses, so the cache-free path
reproduces it bit for bit) and, whenever a prompt is left padded, a key-padding mask that keeps
the padding out of every attention row — also on the cached steps, where the mask lists the
cached positions first, then the new ones. A family with ``wrapper.logit_shift = s`` (aligned
logit ``i`` = raw logit ``i - s``) gets queries that start ``s`` positions before the block, and
those look-behind positions are kept out of the cache.

Records: ``reveal_step`` = global 0-based step at which each response token was committed
(quota decoding: ``block * steps_per_block + local step``, like the reference sampler; threshold
decoding: the running count of executed steps over all blocks, so ``num_steps`` = the number of
steps the batch took), -1 where the position was EOS-filled. ``nfe`` counts forward calls
(the block-start full forward is the first step's forward, not an extra one).

Not supported here: classifier-free guidance and the ``step_states`` record (predictions at
every position each step need full-sequence logits, which the caches avoid); use the reference
sampler for those.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

from dare_core.api import RolloutBatch
import dare_plugin_samplers.common as common
from dare_plugin_samplers.config import FAST_RECORDS, FastConfig
from dare_plugin_samplers.low_confidence import _commit_mask, mask_through_first_stop, num_transfer_tokens

__all__ = ["FastConfig", "FastSampler", "SUPPORTED_RECORDS"]

SUPPORTED_RECORDS = FAST_RECORDS


class _BlockForward:
    """Logits of one block's columns, with the cache policy of ``cache`` (one per block).

    ``x`` is updated in place by the caller between calls; the first call of a block is a full
    forward (the uncached computation) that also fills the cache.
    """

    def __init__(self, wrapper: Any, cache: str, x: torch.Tensor, valid: torch.Tensor,
                 padded: bool, pos: torch.Tensor, lo: int, hi: int, shift: int,
                 refresh_every: int = 0):
        self.wrapper, self.cache, self.x, self.valid = wrapper, cache, x, valid
        self.padded, self.pos, self.lo, self.hi, self.shift = padded, pos, lo, hi, shift
        self.refresh_every = refresh_every
        self.mask_id = int(wrapper.mask_token_id)
        self.calls = 0
        self.past: Optional[list] = None
        self.mask: Optional[torch.Tensor] = None
        self.q_hi = hi
        self.settled: Optional[torch.Tensor] = None  # delayed: [B, W] cache entry has the token

    def __call__(self) -> torch.Tensor:
        lo, hi, s = self.lo, self.hi, self.shift
        refresh = self.refresh_every > 0 and self.calls % self.refresh_every == 0
        self.calls += 1
        if self.cache == "none" or self.past is None or refresh:
            want = self.cache != "none"
            logits, present = self.wrapper.forward_cached(
                self.x, position_ids=self.pos, past_key_values=None,
                attention_mask=self.valid.long() if self.padded else None, use_cache=want,
            )
            if want:
                self._keep(present)
            # aligned logits cover columns s .. L-1
            return logits[:, lo - s : hi - s].float()
        if self.cache == "delayed":
            return self._delayed_step()
        logits, _ = self.wrapper.forward_cached(
            self.x[:, lo - s : self.q_hi], position_ids=self.pos[:, lo - s : self.q_hi],
            past_key_values=self.past, attention_mask=self.mask, use_cache=False,
        )
        return logits[:, : hi - lo].float()

    def _delayed_step(self) -> torch.Tensor:
        """Query the block positions whose cache entry lacks their current token (still masked,
        or committed since the last forward), padded per row with settled ones to a common
        count; attend to the whole cache minus the superseded entries; store the new keys and
        values by position. Returns ``[B, W, V]`` logits (zero at positions not queried, which
        are committed and never eligible)."""
        lo, hi = self.lo, self.hi
        b, length = self.x.shape
        width = hi - lo
        need = ~self.settled
        q = int(need.sum(dim=1).max())
        order = torch.arange(width, device=self.x.device).expand(b, width) + (~need).long() * width
        idx = order.argsort(dim=1)[:, :q]  # needed positions first, in position order
        cols = idx + lo
        q_ids = self.x.gather(1, cols)
        keep = self.valid.clone()
        keep.scatter_(1, cols, False)  # the stale entries of the queried positions
        mask = torch.cat([keep, torch.ones(b, q, dtype=torch.bool, device=keep.device)], dim=1)
        logits, present = self.wrapper.forward_cached(
            q_ids, position_ids=self.pos.gather(1, cols), past_key_values=self.past,
            attention_mask=mask.long(), use_cache=True,
        )
        for (k, v), (pk, pv) in zip(self.past, present):
            index = cols[:, None, :, None].expand(b, k.shape[1], q, k.shape[3])
            k.scatter_(2, index, pk[:, :, length:].to(k.dtype))
            v.scatter_(2, index, pv[:, :, length:].to(v.dtype))
        self.settled.scatter_(1, idx, q_ids != self.mask_id)
        out = logits.new_zeros(b, width, logits.shape[-1])
        out.scatter_(1, idx[..., None].expand(b, q, logits.shape[-1]), logits)
        return out.float()

    def _keep(self, present: list) -> None:
        lo, hi, s = self.lo, self.hi, self.shift
        q_lo = lo - s
        if self.cache == "delayed":  # every position, by position; block entries of MASKs
            self.past = [(k.contiguous(), v.contiguous()) for k, v in present]
            self.settled = self.x[:, lo:hi] != self.mask_id
            return
        if self.cache == "prefix":
            self.past = [(k[:, :, :q_lo], v[:, :, :q_lo]) for k, v in present]
            self.q_hi = self.x.shape[1]
            keys = self.valid  # cache [0, q_lo) then new [q_lo, L): the natural order
        else:  # dual: everything except the query columns [q_lo, hi)
            self.past = [
                (torch.cat([k[:, :, :q_lo], k[:, :, hi:]], dim=2),
                 torch.cat([v[:, :, :q_lo], v[:, :, hi:]], dim=2))
                for k, v in present
            ]
            self.q_hi = hi
            keys = torch.cat(
                [self.valid[:, :q_lo], self.valid[:, hi:], self.valid[:, q_lo:hi]], dim=1
            )
        self.mask = keys.long() if self.padded else None


class FastSampler(common.ConfiguredSampler, common.CandidateScoring):
    """Cached, parallel-decoding masked-diffusion sampler (see the module docstring).

    :param config: :class:`FastConfig`.
    """

    config_cls = FastConfig

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

        :param wrapper: a masked-diffusion wrapper with the ``kv_cache`` capability.
        :param prompt_ids: ``[B, P]`` long, left padded.
        :param prompt_mask: ``[B, P]``, 0 on padding.
        :param record: subset of :data:`SUPPORTED_RECORDS` (see the module docstring).
        :param generator: random stream for sampling and random remasking.
        :returns: a :class:`~dare_core.interfaces.RolloutBatch`; ``nfe`` = forward calls summed
            over micro-batches; ``num_steps`` = ``steps`` (quota) or the largest number of
            steps a micro-batch took (threshold).
        """
        cfg = self.config
        record = common.check_records("the fast rollout", record, SUPPORTED_RECORDS)
        kind = getattr(wrapper, "kind", None)
        if kind != "masked":
            raise ValueError(
                f"the fast rollout drives bidirectional masked-diffusion models (wrapper.kind "
                f"'masked'), got kind {kind!r}; choose a rollout backend that supports {kind!r}"
            )
        if "kv_cache" not in getattr(wrapper, "capabilities", frozenset()):
            raise ValueError(
                f"the fast rollout needs the model capability kv_cache, which the "
                f"{getattr(wrapper, 'family', '?')!r} wrapper lacks; use rollout.backend="
                f"low_confidence"
            )
        common.check_prompt_shapes(prompt_ids, prompt_mask)
        shift = int(getattr(wrapper, "logit_shift", 0))
        if shift and cfg.cache == "delayed":
            raise ValueError(
                f"rollout.cache 'delayed' queries non-contiguous positions, which a model whose "
                f"logits are shifted (logit_shift = {shift}) cannot align; use rollout.cache=dual"
            )
        if prompt_ids.shape[1] < shift:
            raise ValueError(
                f"the prompt must have at least logit_shift = {shift} column(s), got "
                f"{prompt_ids.shape[1]}"
            )

        parts = common.run_micro_batches(
            wrapper, prompt_ids, prompt_mask, cfg.micro_batch_size,
            lambda ids, mask: self._generate_chunk(wrapper, ids, mask, generator, shift))
        response_ids, reveal, nfe = common.join_micro_batches(parts, cfg.gen_length, prompt_ids.device)
        taken = max((p[3] for p in parts), default=0)
        return RolloutBatch(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            response_ids=response_ids,
            response_mask=mask_through_first_stop(response_ids, [wrapper.eos_token_id],
                                                  cfg.truncate_at_eos),
            reveal_step=reveal if "reveal_step" in record else None,
            num_steps=cfg.steps if cfg.decoding == "quota" else taken,
            nfe=nfe,
        )

    # ------------------------------------------------------------------ internals

    def _generate_chunk(
        self,
        wrapper: Any,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        generator: Optional[torch.Generator],
        shift: int,
    ) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        cfg = self.config
        device = prompt_ids.device
        b, p = prompt_ids.shape
        r, width = cfg.gen_length, cfg.block_length
        mask_id, eos_id = int(wrapper.mask_token_id), int(wrapper.eos_token_id)
        quota_mode = cfg.decoding == "quota"

        x = torch.cat(
            [prompt_ids.long(), torch.full((b, r), mask_id, dtype=torch.long, device=device)],
            dim=1,
        )
        valid = torch.cat(
            [prompt_mask.bool(), torch.ones(b, r, dtype=torch.bool, device=device)], dim=1
        )
        padded = not bool(valid.all())
        pos = torch.arange(p + r, device=device)[None].expand(b, p + r)
        stop_ids = torch.tensor(
            sorted({int(t) for t in wrapper.stop_token_ids} | {eos_id}),
            dtype=torch.long, device=device,
        )
        ban = None

        pending = torch.ones(b, r, dtype=torch.bool, device=device)
        reveal = torch.full((b, r), -1, dtype=torch.long, device=device)
        nfe = 0
        executed = 0  # threshold decoding: global step counter
        one = torch.ones(b, dtype=torch.long, device=device)
        for blk in range(cfg.num_blocks):
            lo, hi = blk * width, (blk + 1) * width
            forward = _BlockForward(wrapper, cfg.cache, x, valid, padded, pos, p + lo, p + hi,
                                    shift, cfg.refresh_every)
            if quota_mode:
                quota = num_transfer_tokens(pending[:, lo:hi].sum(dim=1), cfg.steps_per_block)
                n_steps = cfg.steps_per_block
            else:
                n_steps = width  # at least one commit per row and step
            for step in range(n_steps):
                eligible = pending[:, lo:hi]
                if quota_mode:
                    k = quota[:, step]
                    if not bool((k > 0).any()):
                        continue  # nobody commits: the forward would change nothing
                elif not bool(eligible.any()):
                    break  # the block is complete in every row
                logits = forward()
                nfe += 1
                if ban is None:
                    ban = self._ban_mask(logits.shape[-1], mask_id, eos_id, device)
                logits = logits.masked_fill(ban, -math.inf)
                x0 = self._candidates(logits, generator)
                conf = self._confidence(logits, x0, generator, stop_ids)
                if quota_mode:
                    commit = _commit_mask(conf, eligible, k)
                    at = blk * cfg.steps_per_block + step
                else:
                    commit = _commit_mask(conf, eligible, one) | (
                        eligible & (conf >= cfg.threshold)
                    )
                    at = executed
                executed += 1
                x[:, p + lo : p + hi] = torch.where(commit, x0, x[:, p + lo : p + hi])
                pending[:, lo:hi] &= ~commit
                reveal[:, lo:hi] = reveal[:, lo:hi].masked_fill(commit, at)
        response = x[:, p:].masked_fill(pending, eos_id)
        return response, reveal, nfe, executed


# --------------------------------------------------------------------------- registration
