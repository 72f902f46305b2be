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

**Static steps** (``graphs``, :mod:`dare_plugin_samplers.graphs`). With ``cache`` ``dual`` or
``none`` the steps can run at fixed shapes on buffers that keep their addresses
(:class:`_StaticFast`), captured as CUDA graphs on a GPU (``graphs=auto``); they give the eager
path's tokens, reveal steps and ``nfe`` (tested). ``prefix`` and ``delayed`` change their query
width from block to block or step to step and always run eager.

Not supported here: classifier-free guidance and the ``step_states`` record (predictions at
every position each step need full-sequence logits, which the caches avoid); use the reference
sampler for those.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

import dare_nn.sampling as common
from dare_core.api import RolloutBatch
from dare_nn.sampling import mask_through_first_stop
from dare_plugin_samplers.config import FAST_RECORDS, STATIC_CACHES, FastConfig
from dare_plugin_samplers.graphs import Captures, Step, graph_mode, graph_pool, weights_key
from dare_plugin_samplers.low_confidence import _commit_mask, num_transfer_tokens

__all__ = ["FastConfig", "FastSampler", "SUPPORTED_RECORDS"]

SUPPORTED_RECORDS = FAST_RECORDS


class _BlockForward:
    """Logits of one block's columns, with the cache policy of ``cache`` (one per block).

    ``x`` is updated in place by the caller between calls; the first call of a block is a full
    forward (the uncached computation) that also fills the cache.
    """

    def __init__(
        self,
        wrapper: Any,
        cache: str,
        x: torch.Tensor,
        valid: torch.Tensor,
        padded: bool,
        pos: torch.Tensor,
        lo: int,
        hi: int,
        shift: int,
        refresh_every: int = 0,
    ):
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
                self.x,
                position_ids=self.pos,
                past_key_values=None,
                attention_mask=self.valid.long() if self.padded else None,
                use_cache=want,
            )
            if want:
                self._keep(present)
            # aligned logits cover columns s .. L-1
            return logits[:, lo - s : hi - s].float()
        if self.cache == "delayed":
            return self._delayed_step()
        logits, _ = self.wrapper.forward_cached(
            self.x[:, lo - s : self.q_hi],
            position_ids=self.pos[:, lo - s : self.q_hi],
            past_key_values=self.past,
            attention_mask=self.mask,
            use_cache=False,
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
            q_ids,
            position_ids=self.pos.gather(1, cols),
            past_key_values=self.past,
            attention_mask=mask.long(),
            use_cache=True,
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
                (torch.cat([k[:, :, :q_lo], k[:, :, hi:]], dim=2), torch.cat([v[:, :, :q_lo], v[:, :, hi:]], dim=2))
                for k, v in present
            ]
            self.q_hi = hi
            keys = torch.cat([self.valid[:, :q_lo], self.valid[:, hi:], self.valid[:, q_lo:hi]], dim=1)
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
                f"the prompt must have at least logit_shift = {shift} column(s), got {prompt_ids.shape[1]}"
            )

        mode = graph_mode(cfg.graphs, prompt_ids.device, wrapper.module) if cfg.cache in STATIC_CACHES else "eager"
        chunk = self._generate_chunk if mode == "eager" else self._static_chunk
        parts = common.run_micro_batches(
            wrapper,
            prompt_ids,
            prompt_mask,
            cfg.micro_batch_size,
            lambda ids, mask: chunk(wrapper, ids, mask, generator, shift),
        )
        response_ids, reveal, nfe = common.join_micro_batches(parts, cfg.gen_length, prompt_ids.device)
        taken = max((p[3] for p in parts), default=0)
        return RolloutBatch(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            response_ids=response_ids,
            response_mask=mask_through_first_stop(response_ids, [wrapper.eos_token_id], cfg.truncate_at_eos),
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
        valid = torch.cat([prompt_mask.bool(), torch.ones(b, r, dtype=torch.bool, device=device)], dim=1)
        padded = not bool(valid.all())
        pos = torch.arange(p + r, device=device)[None].expand(b, p + r)
        stop_ids = torch.tensor(
            sorted({int(t) for t in wrapper.stop_token_ids} | {eos_id}),
            dtype=torch.long,
            device=device,
        )
        ban = None

        pending = torch.ones(b, r, dtype=torch.bool, device=device)
        reveal = torch.full((b, r), -1, dtype=torch.long, device=device)
        nfe = 0
        executed = 0  # threshold decoding: global step counter
        one = torch.ones(b, dtype=torch.long, device=device)
        for blk in range(cfg.num_blocks):
            lo, hi = blk * width, (blk + 1) * width
            forward = _BlockForward(wrapper, cfg.cache, x, valid, padded, pos, p + lo, p + hi, shift, cfg.refresh_every)
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
                    commit = _commit_mask(conf, eligible, one) | (eligible & (conf >= cfg.threshold))
                    at = executed
                executed += 1
                x[:, p + lo : p + hi] = torch.where(commit, x0, x[:, p + lo : p + hi])
                pending[:, lo:hi] &= ~commit
                reveal[:, lo:hi] = reveal[:, lo:hi].masked_fill(commit, at)
        response = x[:, p:].masked_fill(pending, eos_id)
        return response, reveal, nfe, executed

    def _static_chunk(
        self,
        wrapper: Any,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        generator: Optional[torch.Generator],
        shift: int,
    ) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        """:meth:`_generate_chunk` through the static steps of :class:`_StaticFast` (``graphs``):
        the same blocks, steps, random draws and commits; the host only counts steps and, with
        threshold decoding, reads whether the block is complete after each step."""
        cfg = self.config
        b, p = prompt_ids.shape
        valid_prompt = prompt_mask.bool()
        padded = not bool(valid_prompt.all())
        key = (weights_key(wrapper.module), id(wrapper), b, p, shift, padded, str(prompt_ids.device))
        captures = self.__dict__.setdefault("_static_captures", Captures())
        ses = captures.get(key, lambda: _StaticFast(self, wrapper, b, p, shift, padded, prompt_ids.device))
        ses.reset(prompt_ids, valid_prompt)
        width, quota_mode = cfg.block_length, cfg.decoding == "quota"
        # a block starts with every position pending, so every row has the same quota schedule
        quota = num_transfer_tokens(torch.tensor([width]), cfg.steps_per_block)[0].tolist() if quota_mode else []
        nfe = executed = 0
        for blk in range(cfg.num_blocks):
            lo, hi = blk * width, (blk + 1) * width
            ses.enter(blk)
            calls, past = 0, None
            for step in range(cfg.steps_per_block if quota_mode else width):
                if quota_mode:
                    if quota[step] == 0:
                        continue  # nobody commits: the forward would change nothing
                    ses.k.fill_(quota[step])
                    ses.at.fill_(blk * cfg.steps_per_block + step)
                elif not bool(ses.pending[:, lo:hi].any()):
                    break  # the block is complete in every row
                else:
                    ses.at.fill_(executed)
                ses.draw(generator)
                refresh = cfg.refresh_every > 0 and calls % cfg.refresh_every == 0
                calls += 1
                if cfg.cache == "none" or past is None or refresh:
                    out = ses.full(*ses.full_args)
                    past = out[3:] if cfg.cache != "none" else None
                else:
                    out = ses.cached(*ses.cached_args, *past)
                nfe += 1
                executed += 1
                ses.x[:, p + lo : p + hi].copy_(out[0])
                ses.pending[:, lo:hi].copy_(out[1])
                ses.reveal[:, lo:hi].copy_(out[2])
        response = ses.x[:, p:].masked_fill(ses.pending, int(wrapper.eos_token_id))
        return response, ses.reveal.clone(), nfe, executed


class _StaticFast:
    """The static path of :class:`FastSampler` for one chunk shape (``b`` rows, ``p`` prompt
    columns, ``shift``, padded or not): buffers that keep their addresses across blocks, steps
    and ``generate`` calls, and two step kinds (:class:`~dare_plugin_samplers.graphs.Step`).

    * ``full``: the full forward ``[B, P + R]`` (the uncached computation), the block's logits
      picked by the index tensor ``lcols``, and with a cache the dual cache built by
      ``index_select`` of the columns ``kcols`` (fixed count ``P + R - W - shift`` in every block);
    * ``cached``: the forward of the ``W + shift`` query columns ``qcols`` on that cache, the key
      mask listing ``kcols`` then ``qcols`` (the eager dual cache's order, so its logits are the
      same);

    both followed by the same candidate / confidence / commit computation as the eager path, on
    random numbers drawn beforehand into ``u`` / ``ur`` by the same calls. Each returns the
    block's new tokens, pending flags and reveal steps (and ``full`` the cache), which the caller
    writes back.
    """

    def __init__(
        self, sampler: "FastSampler", wrapper: Any, b: int, p: int, shift: int, padded: bool, device: torch.device
    ):
        cfg = sampler.config
        self.sampler, self.wrapper, self.padded, self.shift = sampler, wrapper, padded, shift
        self.mask_id, self.eos_id = int(wrapper.mask_token_id), int(wrapper.eos_token_id)
        r, width, s = cfg.gen_length, cfg.block_length, shift
        length = p + r
        self.p = p
        self.x = torch.zeros(b, length, dtype=torch.long, device=device)
        self.valid = torch.ones(b, length, dtype=torch.bool, device=device)
        self.pos = torch.arange(length, device=device)[None].expand(b, length).contiguous()
        self.pending = torch.ones(b, r, dtype=torch.bool, device=device)
        self.reveal = torch.full((b, r), -1, dtype=torch.long, device=device)
        self.k = torch.zeros(b, dtype=torch.long, device=device)
        self.at = torch.zeros((), dtype=torch.long, device=device)
        self.stop_ids = torch.tensor(
            sorted({int(t) for t in wrapper.stop_token_ids} | {self.eos_id}), dtype=torch.long, device=device
        )
        self.u = self.ur = None
        if cfg.temperature > 0:  # the vocabulary size, from a one-token forward
            probe = torch.zeros(b, s + 1, dtype=torch.long, device=device)
            logits, _ = wrapper.forward_cached(probe, position_ids=self.pos[:, : s + 1], use_cache=False)
            self.u = torch.empty(b, width, logits.shape[-1], dtype=torch.float64, device=device)
        if cfg.remasking == "random":
            self.ur = torch.empty(b, width, dtype=torch.float64, device=device)
        # per-block column indices: the tables, and the buffers the steps read (``enter``)
        tables: dict[str, list] = {"bcols": [], "rcols": [], "lcols": [], "qcols": [], "kcols": []}
        for blk in range(cfg.num_blocks):
            lo, hi = p + blk * width, p + (blk + 1) * width
            block = torch.arange(lo, hi, device=device)
            tables["bcols"].append(block)
            tables["rcols"].append(block - p)
            tables["lcols"].append(block - s)
            tables["qcols"].append(torch.arange(lo - s, hi, device=device))
            tables["kcols"].append(
                torch.cat([torch.arange(0, lo - s, device=device), torch.arange(hi, length, device=device)])
            )
        self.tables = {name: torch.stack(rows) for name, rows in tables.items()}
        self.cur = {name: rows[0].clone() for name, rows in self.tables.items()}
        self.keys = torch.cat([self.cur["kcols"], self.cur["qcols"]])
        c = self.cur
        select = (
            self.x,
            self.pending,
            self.reveal,
            c["bcols"],
            c["rcols"],
            self.k,
            self.at,
            self.u,
            self.ur,
            self.stop_ids,
        )
        self.full_args = (self.pos, self.valid, c["lcols"], c["kcols"]) + select
        self.cached_args = (self.pos, self.valid, c["qcols"], self.keys) + select
        mode = graph_mode(cfg.graphs, device, wrapper.module)
        pool = graph_pool(mode)
        auto = cfg.graphs == "auto"
        self.full = Step(self._full_step, mode, device, pool, auto)
        self.cached = Step(self._cached_step, mode, device, pool, auto)

    def reset(self, prompt_ids: torch.Tensor, valid_prompt: torch.Tensor) -> None:
        self.x[:, : self.p].copy_(prompt_ids)
        self.x[:, self.p :].fill_(self.mask_id)
        self.valid[:, : self.p].copy_(valid_prompt)
        self.pending.fill_(True)
        self.reveal.fill_(-1)

    def enter(self, blk: int) -> None:
        for name, rows in self.tables.items():
            self.cur[name].copy_(rows[blk])
        self.keys.copy_(torch.cat([self.cur["kcols"], self.cur["qcols"]]))

    def draw(self, generator: Optional[torch.Generator]) -> None:
        """The eager step's random draws, in its order: the candidates' uniforms, then the
        'random' confidences."""
        from dare_core.api import for_device

        for buf in (self.u, self.ur):
            if buf is not None:
                torch.rand(
                    buf.shape,
                    generator=for_device(generator, buf.device),
                    dtype=torch.float64,
                    device=buf.device,
                    out=buf,
                )

    def _mask(self, valid: torch.Tensor, keys: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
        if not self.padded:
            return None
        return (valid if keys is None else valid.index_select(1, keys))[:, None, None, :]

    def _full_step(self, pos, valid, lcols, kcols, *select):
        want = self.sampler.config.cache != "none"
        logits, present = self.wrapper.forward_cached(
            select[0], position_ids=pos, past_key_values=None, attention_mask=self._mask(valid), use_cache=want
        )
        out = self._select(logits.index_select(1, lcols).float(), *select)
        if not want:
            return out
        return out + tuple(t.index_select(2, kcols) for kv in present for t in kv)

    def _cached_step(self, pos, valid, qcols, keys, *rest):
        select, flat = rest[:10], rest[10:]
        past = [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]
        logits, _ = self.wrapper.forward_cached(
            select[0].index_select(1, qcols),
            position_ids=pos.index_select(1, qcols),
            past_key_values=past,
            attention_mask=self._mask(valid, keys),
            use_cache=False,
        )
        return self._select(logits.float(), *select)

    def _select(self, logits, x, pending, reveal, bcols, rcols, k, at, u, ur, stop_ids):
        """The eager step's candidates, confidences and commits at fixed shapes."""
        sampler, cfg = self.sampler, self.sampler.config
        logits = logits.masked_fill(
            sampler._ban_mask(logits.shape[-1], self.mask_id, self.eos_id, logits.device), -math.inf
        )
        if u is None:
            x0 = logits.argmax(dim=-1)
        else:  # the Gumbel-max draw of CandidateScoring._candidates
            z = logits.double()
            z = (z - z.amax(dim=-1, keepdim=True)).exp()
            x0 = (z / (-torch.log(u)) ** float(cfg.temperature)).argmax(dim=-1)
        if ur is None:
            conf = sampler._confidence(logits, x0, None, stop_ids)
        else:  # 'random' confidences, stop handling of CandidateScoring._confidence
            conf = ur
            if cfg.stop_confidence != "keep":
                value = 0.0 if cfg.stop_confidence == "zero" else -math.inf
                conf = conf.masked_fill(torch.isin(x0, stop_ids), value)
        eligible = pending.index_select(1, rcols)
        if cfg.decoding == "quota":
            commit = _commit_mask(conf, eligible, k)
        else:
            commit = _commit_mask(conf, eligible, torch.ones_like(k)) | (eligible & (conf >= cfg.threshold))
        block = torch.where(commit, x0, x.index_select(1, bcols))
        return block, eligible & ~commit, torch.where(commit, at, reveal.index_select(1, rcols))


# --------------------------------------------------------------------------- registration
