"""A base class for wrappers around Hugging Face style dLLM modules.

A family plugin subclasses :class:`HFDiffusionWrapper` and overrides only what differs for its
family (``_raw_logits`` for the forward call, ``align`` for a logit shift, ``denoise_logits`` for a
block-diffusion training layout). Everything else — log-probabilities in float32, prompt
rendering, saving — is shared.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from typing import Any, Callable, Iterator, Optional, Protocol, cast

import torch

from dare_core.ops.fused_ce import DEFAULT_CHUNK_ELEMENTS, fused_token_logprobs
from dare_core.ops.packing import PackPlan, plan_packing


class _HFModule(Protocol):
    """The methods of a family's HF module the wrapper calls beyond ``torch.nn.Module``'s: the
    native modules' ``forward_hidden`` (``[B, S]`` ids -> ``[B, S, D]`` final hidden states) and
    output head (``supports_fused_ce`` checks both), and the checkpoint export."""

    def forward_hidden(
        self,
        input_ids: torch.Tensor,
        *,
        attention_mask: Optional[torch.Tensor] = ...,
        position_ids: Optional[torch.Tensor] = ...,
    ) -> torch.Tensor: ...

    def get_output_embeddings(self) -> torch.nn.Linear: ...

    def save_pretrained(self, path: str, *, state_dict: Optional[dict] = ...) -> None: ...


def gather_logprobs(logits: torch.Tensor, targets: torch.Tensor, chunk: int = 4096) -> torch.Tensor:
    """``log softmax(logits)[target]`` in float32 without a full-vocabulary float32 copy at once.

    ``logits`` ``[..., V]``, ``targets`` ``[...]`` → ``[...]``. Rows are processed in chunks so
    the float32 up-cast of bf16 logits stays bounded.
    """
    shape = targets.shape
    flat = logits.reshape(-1, logits.shape[-1])
    tgt = targets.reshape(-1)
    out = []
    for start in range(0, flat.shape[0], chunk):
        block = flat[start : start + chunk].float()
        t = tgt[start : start + chunk]
        picked = block.gather(-1, t[:, None]).squeeze(-1)
        out.append(picked - torch.logsumexp(block, dim=-1))
    if not out:
        return logits.new_zeros(shape, dtype=torch.float32)
    return torch.cat(out).reshape(shape)


class HFDiffusionWrapper:
    """Common implementation of :class:`dare_core.interfaces.ModelWrapper`.

    :param family: registered family name.
    :param module: the HF module; ``module(input_ids=..., attention_mask=...)`` returns ``.logits``.
    :param tokenizer: the checkpoint's tokenizer (provides the chat template).
    :param kind: ``masked`` or ``block``.
    Token ids must come from the checkpoint's config/tokenizer, never literals.
    """

    #: LoRA's default targets (module-name suffixes or a regular expression); None = every linear
    lora_target_modules: Any = None

    def __init__(
        self,
        *,
        family: str,
        module: torch.nn.Module,
        tokenizer: Any,
        kind: str,
        mask_token_id: int,
        eos_token_id: int,
        pad_token_id: int,
        stop_token_ids: tuple[int, ...] = (),
        capabilities: frozenset[str] = frozenset(),
        block_size: Optional[int] = None,
    ):
        self.family = family
        self.module = module
        self.tokenizer = tokenizer
        self.kind = kind
        self.mask_token_id = int(mask_token_id)
        self.eos_token_id = int(eos_token_id)
        self.pad_token_id = int(pad_token_id)
        self.stop_token_ids = tuple(int(t) for t in (stop_token_ids or (eos_token_id,)))
        self.capabilities = frozenset(capabilities)
        self.block_size = block_size

    #: How many positions before the first wanted position a cached query must start: 0 for
    #: unshifted families, 1 for families whose aligned logit at ``i`` is the raw logit at
    #: ``i - 1`` (autoregressively initialised; their ``align`` shifts right by one). A shifted
    #: family's wrapper only sets ``logit_shift = 1`` (and keeps ``align``); ``forward_cached``
    #: below then drops the last raw logit so the result lines up with ``input_ids[:, 1:]``.
    logit_shift: int = 0

    # -- forward ------------------------------------------------------------------------------
    #: where inputs go, when an engine keeps the weights elsewhere (e.g. offloaded to the CPU)
    placed: Optional[torch.device] = None

    @property
    def _hf(self) -> _HFModule:
        """``module`` as the HF module it is, for the methods ``torch.nn.Module`` does not declare."""
        return cast(_HFModule, self.module)

    @property
    def device(self) -> torch.device:
        return self.placed or next(self.module.parameters()).device

    @staticmethod
    def _padding_mask(attention_mask: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """A 2-D key-padding mask, or ``None`` when nothing is padded."""
        if attention_mask is None or (attention_mask.dim() == 2 and bool(attention_mask.bool().all())):
            return None
        return attention_mask

    def _raw_logits(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor]) -> torch.Tensor:
        return self.module(input_ids=input_ids, attention_mask=attention_mask).logits

    def align(self, logits: torch.Tensor) -> torch.Tensor:
        """Make position ``i`` predict token ``i`` (identity unless the family is shifted)."""
        return logits

    def logits(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.align(self._raw_logits(input_ids, self._padding_mask(attention_mask)))

    def forward_cached(
        self,
        input_ids: torch.Tensor,
        *,
        position_ids: torch.Tensor,
        past_key_values: Optional[list] = None,
        attention_mask: Optional[torch.Tensor] = None,
        use_cache: bool = True,
    ) -> tuple[torch.Tensor, Optional[list]]:
        """Inference forward of ``Q`` new tokens on top of a KV cache (cached rollouts).

        Needs the ``kv_cache`` capability: the native module takes ``position_ids``,
        ``past_key_values`` (``None`` or one ``(k, v)`` per layer, ``[B, n_kv_heads, P,
        head_dim]``, keys after RoPE, cached positions in any order) and ``use_cache``.

        :param input_ids: ``[B, Q]``; with ``logit_shift = s`` the first ``s`` of them are
            look-behind tokens whose own logits are not wanted (they must not also be in
            ``past_key_values``).
        :param position_ids: ``[B, Q]`` absolute positions of the new tokens.
        :param past_key_values: the cache, or ``None``.
        :param attention_mask: ``None``; a 2-D ``[B, P + Q]`` key-padding mask (cache first,
            then the new tokens; an all-ones mask is dropped); or bool ``[B, 1, Q, P + Q]``
            (True = may attend).
        :param use_cache: also return the new cache (``P + Q`` positions per layer).
        :returns: ``(logits, present)``: aligned logits ``[B, Q - s, V]`` for
            ``input_ids[:, s:]`` and the new cache (``None`` unless ``use_cache``).
        """
        out = self.module(
            input_ids=input_ids,
            attention_mask=self._padding_mask(attention_mask),
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=use_cache,
        )
        raw = out.logits
        shift = int(self.logit_shift)
        # raw position j of a shifted family predicts token j + 1: aligned logits of
        # input_ids[:, s:] are raw[:, : Q - s] (what ``align`` computes for a full sequence)
        logits = raw[:, : raw.shape[1] - shift] if shift else raw
        if not use_cache:
            return logits, None
        # transformers 5 output classes call the field ``cache`` (``past_key_values`` warns)
        present = getattr(out, "cache", None)
        return logits, (present if present is not None else out.past_key_values)

    def noise(self, ids: torch.Tensor, where: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """The absorbing kernel: the MASK token at ``where``."""
        return torch.where(where, torch.full_like(ids, self.mask_token_id), ids)

    def denoise_logits(
        self,
        noisy_ids: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        clean_ids: Optional[torch.Tensor] = None,
        prompt_len: Optional[int] = None,
    ) -> torch.Tensor:
        if self.kind != "masked":
            raise NotImplementedError(f"{type(self).__name__} must implement denoise_logits for {self.kind} diffusion")
        return self.logits(noisy_ids, attention_mask)

    # -- training paths (chosen by dare_core.ops.paths.configure_training_paths) ---------------
    #: ``padded`` or ``packed``: how ``token_logprobs`` lays out a padded micro-batch.
    train_attention: str = "padded"
    #: kernel of the packed path (:data:`dare_core.ops.attention.KERNELS`).
    attention_kernel: str = "sdpa_mask"
    #: compute ``token_logprobs`` from hidden states with the chunked (logits-free) head.
    fused_ce: bool = False
    #: bound on the logits one chunk of the fused head holds (rows x vocabulary).
    ce_chunk_elements: int = DEFAULT_CHUNK_ELEMENTS
    #: the packed path runs a micro-batch only when its packed rows hold at most this fraction
    #: of the padded batch's slots (otherwise packing saves too little and it runs padded).
    packing_max_slots: float = 0.9

    def supports_fused_ce(self) -> bool:
        """The native module exposes ``forward_hidden`` and ``get_output_embeddings`` and the
        training layout is the default one (or the family provides ``denoise_hidden``)."""
        mod = self.module
        if not (
            callable(getattr(mod, "forward_hidden", None)) and callable(getattr(mod, "get_output_embeddings", None))
        ):
            return False
        cls = type(self)
        if cls.denoise_hidden is not HFDiffusionWrapper.denoise_hidden:
            return True
        return (
            self.kind == "masked"
            and cls.denoise_logits is HFDiffusionWrapper.denoise_logits
            and cls._raw_logits is HFDiffusionWrapper._raw_logits
        )

    def supports_packing(self) -> bool:
        """``packed_varlen`` capability (the module takes ``position_ids``, 4-D boolean masks and
        :class:`~dare_core.ops.attention.DocumentMask`) and the default masked-diffusion training
        layout."""
        cls = type(self)
        return (
            "packed_varlen" in self.capabilities
            and self.kind == "masked"
            and cls.denoise_logits is HFDiffusionWrapper.denoise_logits
            and cls._raw_logits is HFDiffusionWrapper._raw_logits
            and cls.token_logprobs is HFDiffusionWrapper.token_logprobs
        )

    def output_head(self) -> tuple[torch.Tensor, Optional[torch.Tensor], float]:
        """``(weight [V, D], bias [V] or None, logit multiplier)`` of the output head."""
        head = self._hf.get_output_embeddings()
        return head.weight, getattr(head, "bias", None), float(getattr(self.module, "logit_scale", 1.0))

    def denoise_hidden(
        self,
        noisy_ids: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        clean_ids: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Aligned final hidden states ``[B, S, D]`` (the head not applied): what
        ``denoise_logits`` computes before the head. Block layouts override this."""
        if self.kind != "masked":
            raise NotImplementedError(f"{type(self).__name__} must implement denoise_hidden for {self.kind} diffusion")
        hidden = self._hf.forward_hidden(noisy_ids, attention_mask=self._padding_mask(attention_mask))
        return self.align(hidden)

    def token_logprobs(
        self,
        noisy_ids: torch.Tensor,
        targets: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        clean_ids: Optional[torch.Tensor] = None,
        prompt_len: Optional[int] = None,
    ) -> torch.Tensor:
        if (
            self.train_attention == "packed"
            and attention_mask is not None
            and attention_mask.dim() == 2
            and not bool(attention_mask.bool().all())
        ):
            plan = plan_packing(attention_mask)
            if plan.rows * plan.width <= self.packing_max_slots * attention_mask.numel():
                return self._packed_token_logprobs(noisy_ids, targets, attention_mask, plan)
        if self.fused_ce:  # the head is read after the forward (a sharding engine gathers it there)
            hidden = self.denoise_hidden(noisy_ids, attention_mask, clean_ids)
            weight, bias, scale = self.output_head()
            return fused_token_logprobs(
                hidden, weight, targets, bias, scale=scale, chunk_elements=self.ce_chunk_elements
            )
        logits = self.denoise_logits(noisy_ids, attention_mask, clean_ids)
        return gather_logprobs(logits, targets)

    def _align_padded(self, values: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """``align`` on an unpacked ``[B, S, *]`` tensor, given the padding mask where the
        family's ``align`` takes one (sequence starts after left padding)."""
        try:
            takes_mask = len(inspect.signature(self.align).parameters) >= 2
        except (TypeError, ValueError):
            takes_mask = False
        if not takes_mask:
            return self.align(values)
        return cast(Callable[..., torch.Tensor], self.align)(values, attention_mask)  # the family's, inspected

    def _packed_token_logprobs(
        self,
        noisy_ids: torch.Tensor,
        targets: torch.Tensor,
        attention_mask: torch.Tensor,
        plan: Optional[PackPlan] = None,
    ) -> torch.Tensor:
        """Pack the valid tokens into rows (document mask, per-document positions), run the
        module once, unpack; ``log p`` at valid positions, 0 at padding."""
        plan = plan_packing(attention_mask) if plan is None else plan
        ids = plan.pack(noisy_ids, self.pad_token_id)
        mask, positions = plan.attention_mask(self.attention_kernel), plan.position_ids
        if self.fused_ce:
            out = self._hf.forward_hidden(ids, attention_mask=mask, position_ids=positions)
        else:
            out = self.module(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        where: tuple[torch.Tensor, ...]
        if type(self).align is HFDiffusionWrapper.align:
            # unshifted: read the valid rows straight from the packed output (padded row-major order)
            where = (plan.src_batch, plan.src_col)
            rows = out[plan.dst_row, plan.dst_slot]
        else:
            where = torch.nonzero(attention_mask.bool(), as_tuple=True)
            rows = self._align_padded(plan.unpack(out), attention_mask)[where]
        if self.fused_ce:
            weight, bias, scale = self.output_head()
            picked = fused_token_logprobs(
                rows, weight, targets[where], bias, scale=scale, chunk_elements=self.ce_chunk_elements
            )
        else:
            picked = gather_logprobs(rows, targets[where])
        return picked.new_zeros(targets.shape).index_put(where, picked)

    def decoder_layers(self) -> list[torch.nn.Module]:
        """The repeated blocks of the network, in order (what sharding engines wrap one by one and
        activation checkpointing recomputes): modules whose class the HF model lists in
        ``_no_split_modules``, else the children of its longest ``ModuleList``."""
        mods = list(self.module.modules())
        names: set[str] = set()
        for m in mods:
            names.update(getattr(m, "_no_split_modules", None) or ())
        layers = [m for m in mods if type(m).__name__ in names]
        if layers:
            return layers
        lists = [m for m in mods if isinstance(m, torch.nn.ModuleList)]
        longest: Optional[torch.nn.ModuleList] = max(lists, key=len) if lists else None
        return list(longest) if longest is not None else []

    # -- text ---------------------------------------------------------------------------------
    def render_prompt(self, messages: list[dict[str, str]]) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    # -- persistence --------------------------------------------------------------------------
    def save_pretrained(self, path: str, state_dict: Optional[dict] = None) -> None:
        os.makedirs(path, exist_ok=True)
        with no_hf_progress_bar():
            self._hf.save_pretrained(path, state_dict=state_dict)
        self.tokenizer.save_pretrained(path)


@contextlib.contextmanager
def no_hf_progress_bar() -> Iterator[None]:
    """transformers' progress bars off inside the block, restored after: ``from_pretrained``'s
    "Loading weights" and ``save_pretrained``'s "Writing model shards" bars on every load and save
    (DARE's own log lines report both)."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            hf_logging.enable_progress_bar()
