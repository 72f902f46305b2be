"""Generic block-diffusion rollout backend ``block`` (semi-autoregressive, block KV cache).

Drives any wrapper of kind ``block`` through its public members only (``block_size``,
``mask_token_id``, ``stop_token_ids``, ``logits`` and, with the cache, ``forward_cached``). The
procedure is the published block-diffusion generation loop (Cheng et al. 2025, arXiv:2510.06303;
Bie et al. 2025, arXiv:2512.15745; docs/block_diffusion.md), batched:

1. **Canvas.** Every row's real prompt tokens are laid out so that their blocks
   (``position // block_size``, positions counted from the row's first real token) line up across
   the batch: row ``b`` with ``n_b`` prompt tokens gets ``s_b`` left padding columns, ``s_b`` a
   multiple of the block size, so that the block holding its prompt tail (or, if the prompt fills
   whole blocks, the first free block) starts at the same column ``C0`` in every row. Padding is
   never attended. The response of row ``b`` occupies the ``gen_length`` columns after its prompt;
   the canvas is rounded up to whole blocks and initialised with MASK.
2. **Prefill.** The complete prompt blocks (columns ``< C0``) run once with the block-causal mask
   and their keys/values are kept (``use_cache``). A trailing partial prompt block is decoded
   together with the first generated tokens; its prompt tokens are not MASKs and never change.
3. **Blocks.** For every following block, up to ``steps`` iterations: forward only the block
   (attending to the cache and bidirectionally inside the block), draw a candidate for every
   position (``temperature``/``top_k``/``top_p``; greedy argmax at ``T = 0``), score it with the
   probability of the candidate under the *unfiltered* tempered softmax, and reveal masked positions
   by ``remasking``:

   * ``sequential`` — the leftmost ``k`` masked positions;
   * ``low_confidence_static`` — the ``k`` most confident;
   * ``low_confidence_dynamic`` — every position with confidence ``> confidence_threshold`` if
     there are at least ``k`` of them, else the ``k`` most confident;
   * ``entropy_bounded`` — sorted by entropy, the largest prefix whose entropy sum minus its largest
     entropy stays ``<= eb_threshold`` (at least ``k``);

   where ``k`` is the schedule ``block_size // steps`` (+1 for the first ``block_size % steps``
   steps). When the block has no MASK left it is committed to the cache with one more forward of
   the clean block (skipped after the last block).
4. **Stop.** After a block, a row whose response so far contains a stop id (``wrapper.stop_token_ids``)
   is finished: its later positions are filled with EOS and no longer decoded. Generation ends when
   every row is finished or the canvas is full.

``use_cache=False`` replaces steps 2-3's cached forwards by a full ``wrapper.logits`` forward of
the canvas up to the end of the current block (same tokens under greedy decoding).

``graphs`` (:mod:`dare_plugin_samplers.graphs`): with the cache, the block and commit forwards can
run at fixed shapes on a KV buffer of fixed capacity (:class:`_StaticBlock`), captured as CUDA
graphs on a GPU (``graphs=auto``); the tokens are the eager cache's up to the rounding of
attention over the buffer's masked slots.

Random stream (``generator``): per iteration with ``temperature > 0`` one ``torch.multinomial``
draw over the ``[B * block, V]`` filtered probabilities.

Deliberate differences from the published loop (none changes greedy decoding of a model that never
predicts its own MASK token): the MASK token is never a candidate; a scheduled count larger than the
number of MASKs left commits only MASK positions (the published static/dynamic top-k could overwrite
a prompt token of a partial prompt block); ``entropy_bounded`` commits at least the scheduled count
so every block finishes within ``steps`` iterations; the last block is not committed to the cache.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

from dare_core.api import CapabilityError, DareError, RolloutBatch, for_device
from dare_nn.block import block_causal_mask, block_index
from dare_nn.sampling import ConfiguredSampler, check_prompt_shapes, check_records, eval_mode, mask_through_first_stop
from dare_plugin_samplers.config import BLOCK_RECORDS, BlockRolloutConfig
from dare_plugin_samplers.graphs import Captures, Step, graph_mode, graph_pool, weights_key

__all__ = ["BlockRolloutConfig", "BlockSampler", "SUPPORTED_RECORDS", "block_schedule"]

SUPPORTED_RECORDS = BLOCK_RECORDS


def block_schedule(block: int, steps: int) -> list[int]:
    """Tokens revealed per iteration: ``block // steps``, +1 for the first ``block % steps``.

    E.g. ``(4, 4) -> [1, 1, 1, 1]``, ``(4, 3) -> [2, 1, 1]``, ``(4, 6) -> [1, 1, 1, 1, 0, 0]``.
    """
    if steps <= 0 or block <= 0:
        raise ValueError(f"block ({block}) and steps ({steps}) must be positive")
    base, rem = divmod(block, steps)
    return [base + (1 if i < rem else 0) for i in range(steps)]


def _filter_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, -math.inf)


def _filter_top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
    drop = cum > p
    drop[..., 1:] = drop[..., :-1].clone()  # keep the token that crosses p
    drop[..., 0] = False
    return logits.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), -math.inf)


class BlockSampler(ConfiguredSampler):
    """The ``block`` rollout backend (see the module docstring)."""

    config_cls = BlockRolloutConfig

    # ------------------------------------------------------------------ public
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

        :param record: subset of :data:`SUPPORTED_RECORDS`; ``"reveal_step"`` fills
            ``RolloutBatch.reveal_step`` with the global 0-based iteration at which each response
            token was revealed: ``i * steps + s`` for iteration ``s`` of the row's ``i``-th decoded
            block (the block holding its prompt tail or first response token is ``i = 0``); -1 for
            positions filled with EOS after a stop. ``num_steps`` is ``steps`` times the number of
            decoded blocks; ``reveal_step % steps + 1`` is the 1-based block-local step.
        :returns: :class:`~dare_core.interfaces.RolloutBatch`; ``nfe`` counts model forward calls
            (prefill and cache commits included).
        """
        record = check_records("the block rollout", record, SUPPORTED_RECORDS)
        self._check_wrapper(wrapper, prompt_ids, prompt_mask)
        bs = self._block_size(wrapper)
        with eval_mode(wrapper.module):
            resp, reveal, nfe, nblocks = self._generate(wrapper, prompt_ids, prompt_mask, bs, generator)
        return RolloutBatch(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            response_ids=resp,
            response_mask=self._response_mask(resp, wrapper),
            reveal_step=reveal if "reveal_step" in record else None,
            num_steps=nblocks * self.config.steps,
            nfe=nfe,
        )

    def total_steps(self, wrapper: Any, prompt_mask: torch.Tensor) -> int:
        """Global iterations of a full run on these prompts: ``steps`` per decoded block, the
        blocks counted from the one holding the longest prompt tail (``num_steps`` of
        :meth:`generate` when no row stops early)."""
        return self._layout(prompt_mask, self._block_size(wrapper))[-1] * self.config.steps

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
        """Resume partial responses over the global iterations ``[start_step, stop_step)``.

        Global iteration ``i * steps + s`` is iteration ``s`` of the ``i``-th decoded block (as
        ``reveal_step`` of :meth:`generate`; :meth:`total_steps` is the end). ``response``
        ``[B, gen_length]`` is the state another call left after ``start_step`` iterations:
        blocks before the current one complete, MASK where still to decode. The block KV cache
        of the finished blocks is rebuilt as :meth:`generate` builds it (prefill, then one
        commit forward per block), the current block continues with the rest of its reveal
        schedule, and the random stream is drawn as :meth:`generate` draws it, so resuming where
        a run stopped reproduces the uninterrupted run — except inside a row's last block, whose
        columns past the response end are not part of the state (they are EOS there, not
        re-decoded). Positions still masked at ``stop_step < total_steps`` stay MASK;
        ``reveal_step`` holds the global iteration of the tokens committed by this call, -1
        elsewhere.
        """
        self._check_wrapper(wrapper, prompt_ids, prompt_mask)
        bs = self._block_size(wrapper)
        total = self.total_steps(wrapper, prompt_mask)
        if not 0 <= start_step <= stop_step <= total:
            raise ValueError(f"need 0 <= start_step <= stop_step <= total_steps={total}, got {start_step}, {stop_step}")
        if response.shape != (prompt_ids.shape[0], self.config.gen_length):
            raise ValueError(
                f"response must be [B, gen_length] = "
                f"{(prompt_ids.shape[0], self.config.gen_length)}, got {tuple(response.shape)}"
            )
        with eval_mode(wrapper.module):
            resp, reveal, nfe, _ = self._generate(
                wrapper, prompt_ids, prompt_mask, bs, generator, response.to(prompt_ids.device), start_step, stop_step
            )
        return RolloutBatch(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            response_ids=resp,
            response_mask=self._response_mask(resp, wrapper),
            reveal_step=reveal,
            num_steps=total,
            nfe=nfe,
        )

    def _check_wrapper(self, wrapper: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> None:
        kind = getattr(wrapper, "kind", None)
        if kind != "block":
            raise CapabilityError(
                f"the block rollout drives block-diffusion models (wrapper.kind 'block'), got kind "
                f"{kind!r}; choose a rollout backend that supports {kind!r} models"
            )
        check_prompt_shapes(prompt_ids, prompt_mask)
        if self.config.use_cache:
            if not hasattr(wrapper, "forward_cached"):
                raise CapabilityError(
                    f"{type(wrapper).__name__} has no forward_cached (KV cache); set rollout.use_cache=false"
                )
            if int(getattr(wrapper, "logit_shift", 0)) != 0:
                raise CapabilityError(
                    "the block rollout's cache path needs unshifted logits (wrapper.logit_shift 0); "
                    "set rollout.use_cache=false"
                )

    def _block_size(self, wrapper: Any) -> int:
        bs = self.config.block_length or getattr(wrapper, "block_size", None)
        if not bs:
            raise DareError("the model declares no block size; set rollout.block_length")
        return int(bs)

    # ------------------------------------------------------------------ internals
    def _layout(self, prompt_mask: torch.Tensor, bs: int):
        """The canvas of step 1 of the module docstring: real prompt tokens ``n`` per row, their
        complete blocks ``full_blocks``, the first decoded column ``c0``, the prompt tokens
        ``tail`` in the first decoded block, and the number of decoded blocks."""
        n = prompt_mask.bool().sum(1)
        full_blocks = torch.div(n, bs, rounding_mode="floor")
        c0 = int(full_blocks.max().item()) * bs if n.numel() else 0
        tail = n - full_blocks * bs
        nblocks = -(-(int(tail.max().item()) + self.config.gen_length) // bs) if n.numel() else 0
        return n, full_blocks, c0, tail, nblocks

    def _capacity(self, prompt_width: int, bs: int) -> int:
        """Canvas columns of any ``generate`` on prompts ``prompt_width`` wide: at most
        ``prompt_width // bs`` complete prompt blocks, then the blocks a tail of at most ``bs - 1``
        prompt tokens and ``gen_length`` response tokens need (the static KV capacity)."""
        return (prompt_width // bs) * bs + -(-(bs - 1 + self.config.gen_length) // bs) * bs

    def _stop_ids(self, wrapper: Any, device) -> torch.Tensor:
        ids = {int(t) for t in getattr(wrapper, "stop_token_ids", ())} | {int(wrapper.eos_token_id)}
        return torch.tensor(sorted(ids), dtype=torch.long, device=device)

    def _response_mask(self, resp: torch.Tensor, wrapper: Any) -> torch.Tensor:
        return mask_through_first_stop(resp, self._stop_ids(wrapper, resp.device), self.config.truncate_at_eos)

    def _generate(self, wrapper, prompt_ids, prompt_mask, bs, generator, response=None, start=0, stop=None):
        """The loop of the module docstring over the global iterations ``[start, stop)`` (all of
        them by default), from ``response`` (all MASK by default)."""
        cfg = self.config
        device = prompt_ids.device
        B = prompt_ids.shape[0]
        R = cfg.gen_length
        mask_id, eos_id = int(wrapper.mask_token_id), int(wrapper.eos_token_id)
        stop_ids = self._stop_ids(wrapper, device)
        valid_prompt = prompt_mask.bool()
        n, full_blocks, c0, tail, nblocks = self._layout(prompt_mask, bs)
        shift = c0 - full_blocks * bs  # left padding columns, multiples of bs
        resp_start = c0 + tail  # column of the first response token
        total = c0 + nblocks * bs

        cols = torch.arange(total, device=device)
        canvas = torch.full((B, total), mask_id, dtype=torch.long, device=device)
        canvas.masked_fill_(cols[None] < shift[:, None], int(wrapper.pad_token_id))
        for b in range(B):
            s, k = int(shift[b]), int(n[b])
            canvas[b, s : s + k] = prompt_ids[b][valid_prompt[b]]
        valid = cols[None] >= shift[:, None]
        pos = (cols[None] - shift[:, None]).clamp_min(0)
        blocks = block_index(pos, bs)
        in_resp = (cols[None] >= resp_start[:, None]) & (cols[None] < resp_start[:, None] + R)
        i0, s0 = divmod(start, cfg.steps)  # the block and iteration to resume at
        if response is not None:
            canvas.scatter_(1, resp_start[:, None] + torch.arange(R, device=device)[None], response.long())
            # columns past a row's response end in its last block are no part of the state:
            # MASK (as generate has them) until that block is entered, EOS once it has been
            last = c0 + torch.div(resp_start + R - 1 - c0, bs, rounding_mode="floor") * bs
            entered = (last < c0 + i0 * bs) | ((last == c0 + i0 * bs) & (s0 > 0))
            past = (cols[None] >= (resp_start + R)[:, None]) & entered[:, None]
            canvas.masked_fill_(past, eos_id)
        reveal = torch.full((B, total), -1, dtype=torch.long, device=device)
        active = torch.ones(B, dtype=torch.bool, device=device)
        sched = block_schedule(bs, cfg.steps)
        nfe = 0

        cache = None
        static = None
        if cfg.use_cache and graph_mode(cfg.graphs, device, wrapper.module) != "eager":
            key = (weights_key(wrapper.module), id(wrapper), B, prompt_ids.shape[1], bs, str(device))
            captures = self.__dict__.setdefault("_static_captures", Captures())
            static = captures.get(
                key, lambda: _StaticBlock(self, wrapper, B, self._capacity(prompt_ids.shape[1], bs), bs, device)
            )
            static.reset(valid)
        if cfg.use_cache and c0 > 0:
            m = block_causal_mask(blocks[:, :c0], valid[:, :c0].long())
            _, cache = wrapper.forward_cached(
                canvas[:, :c0], position_ids=pos[:, :c0], past_key_values=None, attention_mask=m, use_cache=True
            )
            nfe += 1
            if static is not None:
                static.prefill(cache)
                cache = None  # the buffer holds it

        stop = nblocks * cfg.steps if stop is None else stop
        decoded, halted = 0, False
        for i in range(nblocks):
            lo, hi = c0 + i * bs, c0 + (i + 1) * bs
            first = s0 if i == i0 else 0
            if i >= i0 and i * cfg.steps + first >= stop:
                halted = True
                break
            if i > 0 and static is not None:
                static.commit(canvas, pos, lo - bs)
                nfe += 1
            elif i > 0 and cfg.use_cache:  # commit the finished block before to the cache
                kmask = torch.cat([valid[:, : lo - bs], torch.ones(B, bs, dtype=torch.bool, device=device)], 1)
                _, cache = wrapper.forward_cached(
                    canvas[:, lo - bs : lo],
                    position_ids=pos[:, lo - bs : lo],
                    past_key_values=cache,
                    use_cache=True,
                    attention_mask=kmask[:, None, None, :].expand(B, 1, bs, lo),
                )
                nfe += 1
            decoded = i + 1
            cur = canvas[:, lo:hi]  # a view: writes go to the canvas
            cur.masked_fill_(~active[:, None] & (cur == mask_id), eos_id)
            for step in range(first if i >= i0 else cfg.steps, cfg.steps):
                if i * cfg.steps + step >= stop:
                    halted = True
                    break
                masked = cur == mask_id
                if not bool(masked.any()):
                    break
                if static is not None:
                    logits = static.logits(canvas, pos, lo)
                else:
                    logits = self._block_logits(wrapper, canvas, valid, pos, blocks, lo, hi, cache)
                nfe += 1
                x0, conf, ent = self._sample(logits, mask_id, generator)
                commit = self._select(conf, ent, masked, sched[step])
                cur.copy_(torch.where(commit, x0, cur))
                reveal[:, lo:hi] = torch.where(commit, torch.full_like(x0, i * cfg.steps + step), reveal[:, lo:hi])
            if halted:
                break
            if bool((cur == mask_id).any()):
                if response is None:  # cannot happen: the schedule sums to the block size
                    raise RuntimeError("block rollout left MASK tokens in a finished block")
                raise ValueError(
                    f"the response to resume has more MASK tokens in decoded block {i} than its "
                    f"iterations from global step {start} reveal; pass the state a run left "
                    f"after start_step iterations"
                )
            if cfg.stop_at_stop_token:
                seen = torch.isin(canvas[:, :hi], stop_ids) & in_resp[:, :hi]
                active &= ~seen.any(1)
            # rows past their response end need nothing more
            active &= (resp_start + R) > hi
            if not bool(active.any()):
                break

        gather = resp_start[:, None] + torch.arange(R, device=device)[None]
        resp = canvas.gather(1, gather)
        if not halted:  # blocks never reached (stopped rows); a halted run keeps its MASKs
            resp = resp.masked_fill(resp == mask_id, eos_id)
        rev = reveal.gather(1, gather)
        return resp, rev, nfe, decoded

    def _block_logits(self, wrapper, canvas, valid, pos, blocks, lo, hi, cache):
        B = canvas.shape[0]
        if not self.config.use_cache:
            return wrapper.logits(canvas[:, :hi], valid[:, :hi].long())[:, lo:hi].float()
        bs = hi - lo
        if cache is None:  # nothing cached before the first block
            keys = torch.ones(B, bs, dtype=torch.bool, device=canvas.device)
        else:
            keys = torch.cat([valid[:, :lo], torch.ones(B, bs, dtype=torch.bool, device=canvas.device)], 1)
        mask = keys[:, None, None, :].expand(B, 1, bs, keys.shape[1])
        logits, _ = wrapper.forward_cached(
            canvas[:, lo:hi], position_ids=pos[:, lo:hi], past_key_values=cache, attention_mask=mask, use_cache=False
        )
        return logits.float()

    def _sample(self, logits: torch.Tensor, mask_id: int, generator):
        """Candidates, their confidence (unfiltered tempered softmax) and entropies."""
        cfg = self.config
        vocab = logits.shape[-1]
        if 0 <= mask_id < vocab:
            logits = logits.clone()
            logits[..., mask_id] = -math.inf
        temp = float(cfg.temperature)
        scaled = logits / temp if temp > 0 else logits
        probs = torch.softmax(scaled, dim=-1)
        if temp == 0:
            x0 = logits.argmax(-1)
        else:
            filtered = _filter_top_p(_filter_top_k(scaled, cfg.top_k), cfg.top_p)
            fp = torch.softmax(filtered, dim=-1).reshape(-1, vocab)
            x0 = torch.multinomial(fp, 1, generator=for_device(generator, fp.device)).reshape(logits.shape[:-1])
        conf = probs.gather(-1, x0[..., None]).squeeze(-1)
        ent = None
        if cfg.remasking == "entropy_bounded":
            ent = -(probs * torch.log(probs.clamp_min(1e-30))).sum(-1)
        return x0, conf, ent

    def _select(self, conf: torch.Tensor, ent: Optional[torch.Tensor], masked: torch.Tensor, k: int) -> torch.Tensor:
        """Positions to reveal: ``[B, W]`` bool, only masked ones, per the remasking strategy."""
        cfg = self.config
        B, W = masked.shape
        idx = torch.arange(W, device=masked.device).expand(B, W)
        if cfg.remasking == "sequential":
            rank = torch.where(masked, masked.long().cumsum(1) - 1, W)
            return masked & (rank < k)
        if cfg.remasking == "entropy_bounded":
            key = torch.where(masked, ent, math.inf)
            order = torch.argsort(key, dim=1, stable=True)
            e = key.gather(1, order)
            finite = torch.isfinite(e)
            e0 = torch.where(finite, e, 0.0)
            cum = e0.cumsum(1)
            ok = finite & (cum - e0 <= cfg.eb_threshold)  # sorted ascending: the max is the last
            ok = ok & (ok.long().cumprod(1) > 0)
            pos_rank = torch.arange(W, device=masked.device).expand(B, W)
            ok = ok | (finite & (pos_rank < max(k, 1)))
            out = torch.zeros_like(masked)
            return out.scatter(1, order, ok) & masked
        key = torch.where(masked, conf.double(), -math.inf)
        order = torch.argsort(key, dim=1, descending=True, stable=True)
        rank = torch.empty_like(order).scatter_(1, order, idx.contiguous())
        top = masked & (rank < k)
        if cfg.remasking == "low_confidence_static":
            return top
        high = masked & (conf > cfg.confidence_threshold)
        use_high = high.sum(1, keepdim=True) >= k
        return torch.where(use_high, high, top)


class _StaticBlock:
    """The static path of :class:`BlockSampler` (``graphs``) for ``b`` rows and a canvas of at
    most ``cap`` columns: a KV buffer per layer ``[B, n_kv_heads, cap, head_dim]`` whose slot
    ``c`` holds canvas column ``c`` (zero where nothing was written: such slots are masked out),
    and two step kinds (:class:`~dare_plugin_samplers.graphs.Step`) of fixed shapes:

    * ``logits``: the block's ``bs`` tokens on the whole buffer, the key mask letting them see the
      valid slots before the block and the block itself (the eager cache holds exactly those);
    * ``commit``: the same forward of a finished block with ``use_cache``, its keys/values written
      into the block's slots (``index_copy_``).

    The prompt prefill (its width depends on the prompts) stays eager and is copied into the
    buffer. The candidates and the reveal rule run on the step's logits as on the eager path
    (fixed shapes, no host synchronisation; the sampled draw stays outside the captured step, so
    the random stream is the eager one). The logits differ from the eager cache's only by the
    rounding of attention over the masked slots.
    """

    def __init__(self, sampler: BlockSampler, wrapper: Any, b: int, cap: int, bs: int, device: Any):
        self.wrapper, self.cap, self.bs = wrapper, cap, bs
        self.valid = torch.zeros(b, cap, dtype=torch.bool, device=device)
        self.slots = torch.arange(cap, device=device)
        self.ids = torch.zeros(b, bs, dtype=torch.long, device=device)
        self.pos = torch.zeros(b, bs, dtype=torch.long, device=device)
        self.keys = torch.ones(b, cap + bs, dtype=torch.bool, device=device)
        self.cids, self.cpos, self.ckeys = self.ids.clone(), self.pos.clone(), self.keys.clone()
        self.cols = torch.zeros(bs, dtype=torch.long, device=device)
        # buffer shapes and dtype from a one-token forward
        _, present = wrapper.forward_cached(
            self.ids[:, :1],
            position_ids=self.pos[:, :1],
            past_key_values=None,
            use_cache=True,
            attention_mask=torch.ones(b, 1, 1, 1, dtype=torch.bool, device=device),
        )
        self.kv = [
            torch.zeros(*t.shape[:2], cap, t.shape[3], dtype=t.dtype, device=device) for pair in present for t in pair
        ]
        self.lo = -1
        config = sampler.config
        mode = graph_mode(config.graphs, device, wrapper.module)
        pool = graph_pool(mode)
        auto = config.graphs == "auto"
        self.logits_step = Step(self._logits_step, mode, device, pool, auto)
        self.commit_step = Step(self._commit_step, mode, device, pool, auto)

    def reset(self, valid: torch.Tensor) -> None:
        self.valid.zero_()
        self.valid[:, : valid.shape[1]].copy_(valid)
        self.lo = -1

    def prefill(self, present: list) -> None:
        for buf, t in zip(self.kv, (t for pair in present for t in pair)):
            buf[:, :, : t.shape[2]].copy_(t)

    def _visible(self, keys: torch.Tensor, lo: int) -> None:
        """``keys``: the valid slots before column ``lo``, then the ``bs`` new tokens."""
        keys[:, : self.cap] = self.valid & (self.slots < lo)

    def commit(self, canvas: torch.Tensor, pos: torch.Tensor, lo: int) -> None:
        """Write the keys/values of the finished block at columns ``[lo, lo + bs)``."""
        self.cids.copy_(canvas[:, lo : lo + self.bs])
        self.cpos.copy_(pos[:, lo : lo + self.bs])
        self._visible(self.ckeys, lo)
        torch.arange(lo, lo + self.bs, out=self.cols)
        self.commit_step(self.cids, self.cpos, self.ckeys, self.cols, *self.kv)

    def logits(self, canvas: torch.Tensor, pos: torch.Tensor, lo: int) -> torch.Tensor:
        if lo != self.lo:
            self.lo = lo
            self.pos.copy_(pos[:, lo : lo + self.bs])
            self._visible(self.keys, lo)
        self.ids.copy_(canvas[:, lo : lo + self.bs])
        return self.logits_step(self.ids, self.pos, self.keys, *self.kv)[0]

    def _forward(self, ids, pos, keys, kv, use_cache):
        b, q = ids.shape
        past = [(kv[i], kv[i + 1]) for i in range(0, len(kv), 2)]
        return self.wrapper.forward_cached(
            ids,
            position_ids=pos,
            past_key_values=past,
            use_cache=use_cache,
            attention_mask=keys[:, None, None, :].expand(b, 1, q, keys.shape[1]),
        )

    def _logits_step(self, ids, pos, keys, *kv):
        return (self._forward(ids, pos, keys, kv, False)[0].float(),)

    def _commit_step(self, ids, pos, keys, cols, *kv):
        _, present = self._forward(ids, pos, keys, kv, True)
        for buf, t in zip(kv, (t for pair in present for t in pair)):
            buf.index_copy_(2, cols, t[:, :, self.cap :].to(buf.dtype))
        return ()
