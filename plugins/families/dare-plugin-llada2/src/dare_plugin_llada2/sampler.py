"""LLaDA2's own samplers as rollout backends: 2.0 threshold decoding and 2.1 editing.

Both follow the ``generate`` methods of the published LLaDA2.0-mini / LLaDA2.1-mini modeling
files (LLaDA2.0, arXiv:2512.15745; LLaDA2.1, arXiv:2602.08676), batched:

* **Layout.** The published code runs one unpadded prompt at positions ``0..``. Here a batch of
  left-padded prompts is placed in a common column frame in which every row's block grid lines
  up: row ``b`` (``p_b`` real prompt tokens, ``n_b = p_b // B`` complete prompt blocks) starts at
  column ``(K - n_b) * B`` with ``K = max n_b``, so column block ``K`` is every row's first
  denoised block (the one holding its prompt tail, as in the published ``prefill_blocks``).
  Positions restart at 0 on each row's first real token; padding columns are never attended.
  Blocks are denoised left to right; each iteration forwards the window ``[0, block end)`` (no
  cache, like the published code) or, with ``use_cache``, only the current block on top of a KV
  cache of the finished blocks (exact for the block-causal mask: earlier blocks never see later
  ones). A row whose last needed block is done, or whose finished block holds a stop token,
  stops changing (the published 2.0 code also stops after a block containing EOS; 2.1 keeps
  going but truncates at the first EOS, which gives the same tokens because finished blocks
  never change).
* **Candidates.** ``x0`` and its probability from ``softmax(logits / T)`` after top-k / top-p
  (a multinomial draw from ``generator``), or argmax with the untempered probability at
  ``T = 0`` (2.1; in 2.0 only with ``zero_temperature = "greedy"``, the default — the published
  2.0 code samples at ``T = 0`` with unscaled logits, reproduced by ``"sample"``). The MASK token
  is never a candidate (its logit is set to ``-inf``; the published code would commit a
  predicted MASK and leave the position masked).
* **2.0 threshold** (``llada2_threshold``): per block at most ``steps`` iterations
  (``steps = min(steps, gen_length // minimal_topk)``) with the quota schedule of ``B`` tokens
  over ``steps`` (``B // steps`` each, the first ``B % steps`` one more); per row, if at least
  ``quota`` masked positions have probability ``> threshold`` all of those are committed, else
  the ``min(quota, #masked)`` most probable ones.
* **2.1 editing** (``llada2_editing``): per block, iterate: masked positions are committed as in
  2.0 with ``num_to_transfer`` in place of the schedule; in the same iteration every already
  decoded, non-prompt position of the block whose new candidate differs from its current token
  with probability ``> editing_threshold`` is re-written. Once no MASK is left the block is
  re-run while edits happen, at most ``max_post_steps`` times.
* **2.1's mask.** The published 2.1 code passes its block mask as 0/1 values in bf16, i.e. an
  *additive* +1 on visible keys and 0 elsewhere, which hides nothing (plugin README). The default
  here is the strict block-causal mask (as 2.0 and training use); ``mask_style = "additive_01"``
  reproduces the published behaviour (padding keys stay hidden with ``-inf``; not combinable
  with ``use_cache``).

Records: ``reveal_step`` (``[B, R]`` long) is the 0-based global iteration (forward index of
the batch, counted over all blocks) at which a response token got its *final* value — for a
token re-written by 2.1 editing, the iteration of its last edit; -1 where nothing was generated
(after a stop). ``nfe`` counts model forwards (with ``use_cache`` including one cache-commit
forward per finished block); ``num_steps`` = denoising iterations. The response is cut after the
first stop token: later positions are EOS with ``response_mask`` 0.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

from dare_core.api import DareError, RolloutBatch, for_device
from dare_nn.block import block_causal_mask
from dare_plugin_llada2.config import SUPPORTED_RECORDS, EditingConfig, ThresholdConfig

__all__ = [
    "ThresholdConfig",
    "EditingConfig",
    "ThresholdSampler",
    "EditingSampler",
    "SUPPORTED_RECORDS",
    "transfer_schedule",
    "sample_candidates",
]


# ----------------------------------------------------------------------------------- helpers
def transfer_schedule(block_length: int, steps: int) -> list[int]:
    """Published quota schedule: ``block_length // steps`` per step, the first ``block_length % steps``
    steps one more (e.g. ``(32, 5) -> [7, 7, 6, 6, 6]``, ``(4, 6) -> [1, 1, 1, 1, 0, 0]``)."""
    if steps <= 0:
        raise ValueError(f"steps must be positive, got {steps}")
    base, rem = divmod(block_length, steps)
    return [base + (1 if i < rem else 0) for i in range(steps)]


def sample_candidates(
    logits: torch.Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    greedy_at_zero: bool,
    generator: Optional[torch.Generator],
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x0, p)`` for float logits ``[..., V]`` (see the module docstring)."""
    logits = logits.float()
    if temperature == 0.0 and greedy_at_zero:
        x0 = logits.argmax(dim=-1)
        return x0, torch.softmax(logits, dim=-1).gather(-1, x0[..., None])[..., 0]
    shape = logits.shape[:-1]
    z = logits.reshape(-1, logits.shape[-1])
    if temperature > 0 and temperature != 1.0:
        z = z / temperature
    if top_k > 0:
        kth = torch.topk(z, min(top_k, z.shape[-1])).values[..., -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if top_p < 1.0:
        sorted_z, order = torch.sort(z, descending=True)
        cum = torch.softmax(sorted_z, dim=-1).cumsum(-1)
        drop = cum > top_p
        drop[..., 1:] = drop[..., :-1].clone()
        drop[..., 0] = False
        z = z.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), float("-inf"))
    probs = torch.softmax(z, dim=-1)
    x0 = torch.multinomial(probs, 1, generator=for_device(generator, probs.device))
    return x0.view(shape), probs.gather(-1, x0).view(shape)


def _top_quota(conf: torch.Tensor, eligible: torch.Tensor, quota: torch.Tensor) -> torch.Tensor:
    """Per row the ``min(quota, #eligible)`` eligible positions of highest confidence."""
    key = conf.masked_fill(~eligible, -math.inf)
    order = torch.argsort(key, dim=1, descending=True, stable=True)
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(conf.shape[1], device=conf.device).expand_as(order).contiguous())
    return (rank < quota[:, None]) & eligible


class _Frame:
    """The batched column frame (see the module docstring)."""

    def __init__(self, wrapper: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, gen: int, block: int):
        dev = prompt_ids.device
        b, p = prompt_ids.shape
        self.block = block
        lens = prompt_mask.long().sum(dim=1)
        if bool((lens == 0).any()):
            raise DareError("a prompt has no real token (its prompt_mask is all 0); drop it or fix the mask")
        full = lens // block
        self.first = int(full.max())
        self.offset = (self.first - full) * block  # column of position 0
        self.start = self.offset + lens  # first response column
        last_col = self.start + gen - 1
        self.last_block = torch.div(last_col, block, rounding_mode="floor")
        self.num_blocks = int(self.last_block.max()) + 1
        width = self.num_blocks * block
        cols = torch.arange(width, device=dev)[None].expand(b, width)
        self.valid = cols >= self.offset[:, None]
        self.pos = (cols - self.offset[:, None]).clamp_min(0)
        self.col_block = torch.div(cols, block, rounding_mode="floor")
        x = torch.full((b, width), int(wrapper.mask_token_id), dtype=torch.long, device=dev)
        x = x.masked_fill(~self.valid, int(wrapper.pad_token_id))
        rel = cols - self.offset[:, None]
        in_prompt = (rel >= 0) & (rel < lens[:, None])
        src = (p - lens)[:, None] + rel  # column in the left-padded prompt
        x = torch.where(in_prompt, prompt_ids.long().gather(1, src.clamp(0, p - 1)), x)
        self.x = x
        self.prompt = in_prompt | ~self.valid
        self.gen = gen
        self.reveal = torch.full((b, width), -1, dtype=torch.long, device=dev)

    def mask(self, hi: int, style: str = "strict") -> torch.Tensor:
        strict = block_causal_mask(self.col_block[:, :hi], self.valid[:, :hi].long())
        if style == "strict":
            return strict
        keys = self.valid[:, None, None, :hi]
        return torch.where(strict, 1.0, torch.where(keys, 0.0, float("-inf")))

    def response(self, x: torch.Tensor) -> torch.Tensor:
        idx = self.start[:, None] + torch.arange(self.gen, device=x.device)[None]
        return x.gather(1, idx)


class _BlockSampler:
    config_cls: type = ThresholdConfig
    mask_style = "strict"

    def __init__(self, config: Any):
        if not isinstance(config, self.config_cls):
            raise TypeError(f"{type(self).__name__} needs a {self.config_cls.__name__}, got {type(config).__name__}")
        self.config = config

    # -------------------------------------------------------------- public
    def generate(
        self,
        wrapper: Any,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        *,
        record: frozenset[str] = frozenset(),
        generator: Optional[torch.Generator] = None,
    ) -> RolloutBatch:
        record = frozenset(record)
        unknown = record - SUPPORTED_RECORDS
        if unknown:
            raise DareError(
                f"this rollout cannot record {', '.join(sorted(unknown))}; "
                f"supported: {', '.join(sorted(SUPPORTED_RECORDS))}"
            )
        if getattr(wrapper, "kind", None) != "block":
            raise DareError(
                f"the LLaDA2 samplers drive block-diffusion models (wrapper.kind 'block'), "
                f"got {getattr(wrapper, 'kind', None)!r}; choose another rollout backend"
            )
        if prompt_ids.dim() != 2 or prompt_mask.shape != prompt_ids.shape:
            raise DareError(
                f"prompt_ids and prompt_mask must both be [B, P], got {tuple(prompt_ids.shape)} "
                f"and {tuple(prompt_mask.shape)}"
            )
        cfg = self.config
        block = int(cfg.block_length or wrapper.block_size or 0)
        if block <= 0:
            raise DareError("rollout.block_length is 0 and the model has no block size; set rollout.block_length")
        batch = prompt_ids.shape[0]
        chunk = cfg.micro_batch_size if cfg.micro_batch_size > 0 else max(batch, 1)
        module = wrapper.module
        modes = [(m, m.training) for m in module.modules()]
        module.eval()
        try:
            with torch.no_grad():
                parts = [
                    self._generate(wrapper, prompt_ids[i : i + chunk], prompt_mask[i : i + chunk], block, generator)
                    for i in range(0, batch, chunk)
                ]
        finally:
            for m, training in modes:
                m.training = training
        dev = prompt_ids.device
        if parts:
            resp = torch.cat([p[0] for p in parts])
            rmask = torch.cat([p[1] for p in parts])
            reveal = torch.cat([p[2] for p in parts])
            nfe, steps = sum(p[3] for p in parts), max(p[4] for p in parts)
        else:
            resp = torch.empty(0, cfg.gen_length, dtype=torch.long, device=dev)
            rmask, reveal, nfe, steps = resp.clone(), resp.clone(), 0, 0
        return RolloutBatch(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            response_ids=resp,
            response_mask=rmask,
            reveal_step=reveal if "reveal_step" in record else None,
            num_steps=steps,
            nfe=nfe,
        )

    # -------------------------------------------------------------- internals
    def _generate(
        self,
        wrapper: Any,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        block: int,
        generator: Optional[torch.Generator],
    ) -> tuple:
        cfg = self.config
        fr = _Frame(wrapper, prompt_ids, prompt_mask, cfg.gen_length, block)
        mask_id, eos_id = int(wrapper.mask_token_id), int(wrapper.eos_token_id)
        stops = torch.tensor(sorted({int(t) for t in wrapper.stop_token_ids} | {eos_id}), device=fr.x.device)
        b = fr.x.shape[0]
        done = torch.zeros(b, dtype=torch.bool, device=fr.x.device)
        self._nfe, self._step = 0, 0
        cache = None
        style = getattr(cfg, "mask_style", "strict")
        if cfg.use_cache and fr.first > 0:
            cache = self._extend_cache(wrapper, fr, None, 0, fr.first * block)
        for k in range(fr.first, fr.num_blocks):
            lo, hi = k * block, (k + 1) * block
            active = ~done & (fr.last_block >= k)
            if not bool(active.any()):
                break
            self._denoise_block(wrapper, fr, lo, hi, active, cache, style, mask_id, generator)
            cols = torch.arange(lo, hi, device=fr.x.device)[None]
            in_resp = (cols >= fr.start[:, None]) & (cols < (fr.start + fr.gen)[:, None])
            hit = (torch.isin(fr.x[:, lo:hi], stops) & in_resp).any(dim=1)
            done |= active & (hit | (fr.last_block == k))
            if cfg.use_cache and k + 1 < fr.num_blocks and not bool(done.all()):
                cache = self._extend_cache(wrapper, fr, cache, lo, hi)
        resp = fr.response(fr.x)
        reveal = fr.response(fr.reveal)
        is_stop = torch.isin(resp, stops)
        first = torch.where(is_stop.any(1), is_stop.long().argmax(1), torch.full((b,), fr.gen, device=resp.device))
        keep = torch.arange(fr.gen, device=resp.device)[None] <= first[:, None]
        resp = torch.where(keep & (resp != mask_id), resp, torch.full_like(resp, eos_id))
        reveal = torch.where(keep, reveal, torch.full_like(reveal, -1))
        return resp, keep.long(), reveal, self._nfe, self._step

    def _extend_cache(self, wrapper: Any, fr: _Frame, cache: Optional[list], lo: int, hi: int) -> list:
        _, cache = wrapper.forward_cached(
            fr.x[:, lo:hi],
            position_ids=fr.pos[:, lo:hi],
            past_key_values=cache,
            attention_mask=self._cached_mask(fr, lo, hi, cache),
            use_cache=True,
        )
        self._nfe += 1
        return cache

    @staticmethod
    def _cached_mask(fr: _Frame, lo: int, hi: int, cache: Optional[list]) -> torch.Tensor:
        """Strict block-causal mask of queries ``[lo, hi)`` over keys ``[0, hi)``."""
        return block_causal_mask(
            fr.col_block[:, lo:hi],
            fr.valid[:, lo:hi].long(),
            key_block_ids=fr.col_block[:, :hi],
            key_mask=fr.valid[:, :hi].long(),
        )

    def _logits(self, wrapper: Any, fr: _Frame, lo: int, hi: int, cache: Optional[list], style: str) -> torch.Tensor:
        self._nfe += 1
        if cache is not None or self.config.use_cache:
            logits, _ = wrapper.forward_cached(
                fr.x[:, lo:hi],
                position_ids=fr.pos[:, lo:hi],
                past_key_values=cache,
                attention_mask=self._cached_mask(fr, lo, hi, cache),
                use_cache=False,
            )
            return logits.float()
        out = wrapper.module(input_ids=fr.x[:, :hi], attention_mask=fr.mask(hi, style), position_ids=fr.pos[:, :hi])
        return out.logits[:, lo:hi].float()

    def _candidates(
        self, logits: torch.Tensor, mask_id: int, generator: Optional[torch.Generator], greedy_at_zero: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.config
        if 0 <= mask_id < logits.shape[-1]:
            logits = logits.clone()
            logits[..., mask_id] = float("-inf")
        return sample_candidates(logits, cfg.temperature, cfg.top_k, cfg.top_p, greedy_at_zero, generator)

    def _denoise_block(self, *args: Any) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


class ThresholdSampler(_BlockSampler):
    """LLaDA2.0 threshold decoding (see the module docstring)."""

    config_cls = ThresholdConfig

    def _denoise_block(self, wrapper, fr, lo, hi, active, cache, style, mask_id, generator) -> None:
        cfg = self.config
        steps = max(1, min(cfg.steps, cfg.gen_length // cfg.minimal_topk))
        for quota in transfer_schedule(hi - lo, steps):
            masked = (fr.x[:, lo:hi] == mask_id) & active[:, None]
            if not bool(masked.any()):
                break
            logits = self._logits(wrapper, fr, lo, hi, cache, style)
            x0, prob = self._candidates(logits, mask_id, generator, cfg.zero_temperature == "greedy")
            conf = prob.masked_fill(~masked, -math.inf)
            high = conf > cfg.threshold
            q = torch.full((fr.x.shape[0],), quota, dtype=torch.long, device=fr.x.device)
            top = _top_quota(conf, masked, q)
            commit = torch.where((high.sum(1) >= quota)[:, None], high, top) & masked
            fr.x[:, lo:hi] = torch.where(commit, x0, fr.x[:, lo:hi])
            fr.reveal[:, lo:hi] = fr.reveal[:, lo:hi].masked_fill(commit, self._step)
            self._step += 1


class EditingSampler(_BlockSampler):
    """LLaDA2.1 threshold decoding with token editing (see the module docstring)."""

    config_cls = EditingConfig

    def _denoise_block(self, wrapper, fr, lo, hi, active, cache, style, mask_id, generator) -> None:
        cfg = self.config
        b = fr.x.shape[0]
        running = active.clone()
        post = torch.zeros(b, dtype=torch.long, device=fr.x.device)
        editable_cols = ~fr.prompt[:, lo:hi]
        q = torch.full((b,), cfg.num_to_transfer, dtype=torch.long, device=fr.x.device)
        while True:
            old = fr.x[:, lo:hi].clone()
            masked = old == mask_id
            no_mask = ~masked.any(dim=1)
            post += (no_mask & running).long()
            running &= ~(post > cfg.max_post_steps)
            if not bool(running.any()):
                break
            logits = self._logits(wrapper, fr, lo, hi, cache, style)
            x0, prob = self._candidates(logits, mask_id, generator, True)
            conf = prob.masked_fill(~masked, -math.inf)
            high = (conf > cfg.threshold) & masked
            top = _top_quota(conf, masked, q)
            fill = torch.where((high.sum(1) >= cfg.num_to_transfer)[:, None], high, top) & masked
            edit = ~masked & editable_cols & (prob > cfg.editing_threshold) & (x0 != old)
            commit = (fill | edit) & running[:, None]
            fr.x[:, lo:hi] = torch.where(commit, x0, old)
            fr.reveal[:, lo:hi] = fr.reveal[:, lo:hi].masked_fill(commit, self._step)
            self._step += 1
            running &= ~(no_mask & ~(edit & running[:, None]).any(dim=1))
