"""The DiffusionGemma model wrapper: transformers' ``DiffusionGemmaForBlockDiffusion`` behind DARE's
seams — uniform forward noise, the canvas training layout, loading and creation.

DiffusionGemma runs one Gemma 4 MoE stack in two modes: a causal *encoder* over the clean context
writes a KV cache, and a *decoder* (the same weights plus a self-conditioning MLP) denoises a canvas
of ``canvas_length`` tokens, attending bidirectionally within the canvas and read-only to the
cached prefix. Generation appends canvases one after another after the prompt; a canvas starts
from uniform random tokens (there is no MASK token).

**Training layout** (:meth:`DiffusionGemmaWrapper.token_logprobs` / :meth:`~DiffusionGemmaWrapper.denoise_logits`).
A ``[B, S]`` row is ``[left-padded prompt (P) | right-padded response]``. One call of the
library's forward runs

* the encoder over the clean row (``clean_ids``; causal, padding masked), positions ``0 .. S-1``
  (column indices, left padding included, as ``generate`` numbers them);
* the decoder over the noisy response ``noisy_ids[:, P:]`` read as canvases of ``canvas_length``
  aligned at ``P`` (canvas ``k`` = response columns ``[kC, (k+1)C)``), decoder positions = the
  columns. A query of canvas ``k`` (first column ``s_k = P + kC``) sees the valid encoder keys of
  columns ``< s_k`` (the prompt and the earlier clean canvases; sliding-window layers only the
  last ``sliding_window - 1`` of them, what generate's sliding cache holds) and the valid keys of
  its own canvas; every query also sees itself (no empty softmax row).

So canvas ``k`` is denoised exactly as ``generate`` denoises it after the prompt and the earlier
canvases (the layout NeMo AutoModel's DiffusionGemma SFT recipe trains with). Gradients reach the
weights through both passes (the cache is not detached). The likelihoods are those of the first
denoising step: no self-conditioning signal (zero, what the decoder uses before any logits exist).
Logits and log-probabilities are returned for every column; the prompt columns hold 0 (no
prediction). ``prompt_len`` is required.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

import torch

from dare_core.api import DareError, HFDiffusionWrapper, gather_logprobs
from dare_nn.checkpoints import (
    config_or_tokenizer_id,
    load_module,
    padded_vocab_size,
    save_new_checkpoint,
    tiny_params,
    tokenizer_token_id,
)
from dare_plugin_diffusiongemma.config import BUNDLED, CAPABILITIES, MODEL_TYPE  # noqa: F401 (BUNDLED: re-exported)

#: DiffusionGemma has no MASK token; the wrapper's ``mask_token_id`` is this sentinel (not a
#: vocabulary id), never written into an input: components that need a MASK token require the
#: ``mask_token`` capability, which this family does not declare.
NO_MASK_TOKEN = -1
TURN_END = "<turn|>"
#: attention implementations whose masks the training layout builds (the module supports no flash kernel)
ATTENTION = ("sdpa", "eager")


class DiffusionGemmaWrapper(HFDiffusionWrapper):
    """DARE's view of a ``DiffusionGemmaForBlockDiffusion`` (module docstring)."""

    # the decoder's text-stack projections (the encoder shares these weights)
    lora_target_modules = r".*decoder\.layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)"

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        text = self.module.config.text_config
        self.vocab_size = int(text.vocab_size)
        self.sliding_window = getattr(text, "sliding_window", None)
        self.sliding = "sliding_attention" in set(text.layer_types)

    # -- noise -------------------------------------------------------------------------------
    def noise(self, ids: torch.Tensor, where: torch.Tensor, generator: Optional[torch.Generator]) -> torch.Tensor:
        """The uniform kernel (D3PM-uniform, arXiv:2107.03006; the canvas initialisation and
        renoising of ``generate``): a token drawn uniformly from ``[0, vocab_size)`` at ``where``
        (broadcast shape), drawn on the CPU from ``generator``."""
        shape = torch.broadcast_shapes(ids.shape, where.shape)
        draw = torch.randint(0, self.vocab_size, shape, generator=generator, dtype=torch.long).to(ids.device)
        return torch.where(where, draw, ids)

    # -- training layout ---------------------------------------------------------------------
    def _decoder_masks(self, valid: torch.Tensor, prompt_len: int) -> dict[str, torch.Tensor]:
        """``{"full_attention", "sliding_attention"}`` masks ``[B, 1, R, S + R]`` (keys: the
        encoder columns, then the canvas) in the form the attention implementation takes."""
        B, S = valid.shape
        R, C, dev = S - prompt_len, int(self.block_size), valid.device
        q = torch.arange(R, device=dev)
        start = prompt_len + (q // C) * C
        col = torch.arange(S, device=dev)
        before = (col[None, :] < start[:, None])[None] & valid[:, None, :]
        own = ((q[:, None] // C) == (q[None, :] // C))[None] & valid[:, None, prompt_len:]
        own = own | torch.eye(R, dtype=torch.bool, device=dev)[None]
        masks = {"full_attention": torch.cat([before, own], -1)}
        if self.sliding:
            window = col[None, :] >= start[:, None] - (int(self.sliding_window) - 1)
            masks["sliding_attention"] = torch.cat([before & window[None], own], -1)
        if self.module.config._attn_implementation == "eager":
            low = torch.finfo(self.module.dtype).min
            return {k: torch.where(m, 0.0, low).to(self.module.dtype)[:, None] for k, m in masks.items()}
        return {k: m[:, None] for k, m in masks.items()}

    def _response_logits(
        self,
        noisy_ids: torch.Tensor,
        attention_mask: Optional[torch.Tensor],
        clean_ids: Optional[torch.Tensor],
        prompt_len: Optional[int],
    ) -> torch.Tensor:
        """``[B, R, V]`` float32 logits of the response columns (module docstring)."""
        from transformers import DynamicCache

        if prompt_len is None:
            raise DareError(
                "the diffusiongemma family denoises the response as canvases after the prompt "
                "and needs prompt_len (the first response column); pass prompt_len=P"
            )
        clean = noisy_ids if clean_ids is None else clean_ids
        B, S = noisy_ids.shape
        P = int(prompt_len)
        if not 0 <= P <= S:
            raise ValueError(f"prompt_len must be in [0, {S}], got {P}")
        if P == S:
            return torch.zeros(B, 0, self.vocab_size, device=noisy_ids.device)
        valid = (
            torch.ones(B, S, dtype=torch.bool, device=noisy_ids.device)
            if attention_mask is None
            else attention_mask.bool()
        )
        pos = torch.arange(S, device=noisy_ids.device)[None].expand(B, S)
        out = self.module(
            input_ids=clean,
            attention_mask=self._padding_mask(attention_mask),
            position_ids=pos,
            cache=DynamicCache(),  # full layers: every encoder key is kept, the masks select them
            decoder_input_ids=noisy_ids[:, P:],
            decoder_attention_mask=self._decoder_masks(valid, P),
            decoder_position_ids=pos[:, P:],
        )
        return out.logits

    def denoise_logits(
        self,
        noisy_ids: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        clean_ids: Optional[torch.Tensor] = None,
        prompt_len: Optional[int] = None,
    ) -> torch.Tensor:
        """``[B, S, V]``: the decoder's logits of the response canvases (module docstring); 0 on the
        prompt columns. Without ``clean_ids`` the encoder reads ``noisy_ids``."""
        logits = self._response_logits(noisy_ids, attention_mask, clean_ids, prompt_len)
        B, P = noisy_ids.shape[0], int(prompt_len)
        return torch.cat([logits.new_zeros(B, P, logits.shape[-1]), logits], 1)

    def token_logprobs(
        self,
        noisy_ids: torch.Tensor,
        targets: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        clean_ids: Optional[torch.Tensor] = None,
        prompt_len: Optional[int] = None,
    ) -> torch.Tensor:
        """``[B, S]`` float32 ``log p(targets | noisy)`` on the response columns, 0 on the prompt's."""
        logits = self._response_logits(noisy_ids, attention_mask, clean_ids, prompt_len)
        lp = gather_logprobs(logits, targets[:, int(prompt_len) :])
        return torch.cat([lp.new_zeros(lp.shape[0], int(prompt_len)), lp], 1)

    def logits(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The decoder over ``input_ids`` read as canvases from column 0, each conditioned (through the
        encoder) on the columns before it: :meth:`denoise_logits` with ``prompt_len = 0``."""
        return self.denoise_logits(input_ids, attention_mask, clean_ids=input_ids, prompt_len=0)

    def decoder_layers(self) -> list[torch.nn.Module]:
        """The decoder's layers (the encoder's share their weights and write the cache, so they are
        never recomputed)."""
        return list(self.module.model.decoder.layers)

    # -- persistence -------------------------------------------------------------------------
    def save_pretrained(self, path: str, state_dict: Optional[dict] = None) -> None:
        super().save_pretrained(path, state_dict)
        self.module.generation_config.save_pretrained(path)


def token_ids(path: str, config: Any, tokenizer: Any) -> dict[str, Any]:
    """eos / pad / stop ids from the checkpoint (text config, generation_config.json, tokenizer)."""
    text = config.text_config
    eos = config_or_tokenizer_id(text.eos_token_id, tokenizer.eos_token_id)
    if eos is None:
        raise DareError(f"{path!r}: no eos_token_id in config.json (text_config) or the tokenizer")
    gen: dict[str, Any] = {}
    if os.path.isfile(gen_file := os.path.join(path, "generation_config.json")):
        with open(gen_file) as fh:
            gen = json.load(fh)
    g = gen.get("eos_token_id")
    stops = [int(t) for t in (g if isinstance(g, list) else [g] if g is not None else [])]
    if not stops:
        stops = [t for t in (eos, tokenizer_token_id(tokenizer, TURN_END)) if t is not None]
    pad = next(
        (int(p) for p in (text.pad_token_id, gen.get("pad_token_id"), tokenizer.pad_token_id, eos) if p is not None)
    )
    return {
        "mask_token_id": NO_MASK_TOKEN,
        "eos_token_id": int(eos),
        "pad_token_id": pad,
        "stop_token_ids": tuple(dict.fromkeys(stops)),
    }


def load(
    path: str, dtype: torch.dtype = torch.float32, device: str = "cpu", attn_implementation: Optional[str] = None
) -> DiffusionGemmaWrapper:
    """Load a ``diffusion_gemma`` checkpoint (``DiffusionGemmaForBlockDiffusion.from_pretrained``,
    single file or sharded safetensors), its tokenizer and its generation config."""
    from transformers import DiffusionGemmaForBlockDiffusion

    if attn_implementation not in (None, *ATTENTION):
        raise DareError(
            f"model.attn_implementation={attn_implementation}: the diffusiongemma family runs "
            f"{' or '.join(ATTENTION)}; choose one of them"
        )
    module, tokenizer = load_module(
        DiffusionGemmaForBlockDiffusion, path, dtype, device, attn_implementation, model_type=MODEL_TYPE
    )
    canvas = module.config.canvas_length or 256
    return DiffusionGemmaWrapper(
        family="diffusiongemma",
        module=module,
        tokenizer=tokenizer,
        kind="block",
        capabilities=CAPABILITIES,
        block_size=int(canvas),
        **token_ids(path, module.config, tokenizer),
    )


#: tiny text stack: 2 layers (sliding then full attention), 4 experts top-2, Gemma 4's
#: per-layer-type head sizes (sliding head_dim / full global_head_dim, one global KV head)
TINY_TEXT = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    global_head_dim=32,
    num_global_key_value_heads=1,
    sliding_window=64,
    max_position_embeddings=2048,
    num_experts=4,
    top_k_experts=2,
    moe_intermediate_size=32,
    vocab_size=512,
)
#: the vision tower transformers requires, as small as it builds (1 layer, hidden 16)
TINY_VISION = dict(
    model_type="gemma4_vision",
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=8,
    patch_size=4,
    position_embedding_size=16,
    pooling_kernel_size=1,
)
#: the sampler defaults transformers applies when a checkpoint sets none
GENERATION = dict(
    max_denoising_steps=48, t_min=0.4, t_max=0.8, entropy_bound=0.1, stability_threshold=1, confidence_threshold=0.005
)


def create(out_dir: str, texts: list[str], **sizes: Any) -> None:
    """Write a randomly initialised DiffusionGemma checkpoint with a Gemma-4-style BPE tokenizer
    trained on ``texts`` (:mod:`dare_plugin_diffusiongemma.tokenizer`).

    ``sizes`` override the tiny text config (published ``text_config`` field names, e.g.
    ``hidden_size=96``, ``num_hidden_layers=4``, ``layer_types=...``), ``canvas_length`` (default
    32) and the sampler fields of ``generation_config.json`` (:data:`GENERATION`). ``vocab_size`` is
    the tokenizer's target size (the embedding is rounded up to a multiple of 64). The last layer
    is a full-attention layer, the others sliding-window (unless ``layer_types`` is given).
    """
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion
    from transformers.models.diffusion_gemma.configuration_diffusion_gemma import DiffusionGemmaTextConfig
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
        DiffusionGemmaGenerationConfig,
        EntropyBoundSamplerConfig,
    )

    from dare_plugin_diffusiongemma import tokenizer as tok

    sizes = dict(sizes)
    canvas = int(sizes.pop("canvas_length", 32))
    gen = {k: sizes.pop(k, v) for k, v in GENERATION.items()}
    known = {*DiffusionGemmaTextConfig().to_dict(), "global_head_dim", "num_global_key_value_heads"}
    text = tiny_params(TINY_TEXT, sizes, known, "diffusion_gemma text")
    n = int(text["num_hidden_layers"])
    text.setdefault("layer_types", ["sliding_attention"] * (n - 1) + ["full_attention"])
    tokenizer = tok.build_tokenizer(texts, vocab_size=int(text.pop("vocab_size")))
    ids = {
        name: tokenizer.convert_tokens_to_ids(t)
        for name, t in (
            ("boi_token_id", tok.IMAGE_START),
            ("eoi_token_id", tok.IMAGE_END),
            ("image_token_id", tok.IMAGE),
        )
    }
    text.update(
        vocab_size=padded_vocab_size(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    config = DiffusionGemmaConfig(text_config=text, vision_config=dict(TINY_VISION), canvas_length=canvas, **ids)
    module = DiffusionGemmaForBlockDiffusion(config)
    stops = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(tok.TURN_END)]
    module.generation_config = DiffusionGemmaGenerationConfig(
        max_denoising_steps=int(gen["max_denoising_steps"]),
        t_min=float(gen["t_min"]),
        t_max=float(gen["t_max"]),
        sampler_config=EntropyBoundSamplerConfig(entropy_bound=float(gen["entropy_bound"])),
        stability_threshold=int(gen["stability_threshold"]),
        confidence_threshold=float(gen["confidence_threshold"]),
        eos_token_id=stops,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    save_new_checkpoint(out_dir, module, tokenizer)
    module.generation_config.save_pretrained(out_dir)
