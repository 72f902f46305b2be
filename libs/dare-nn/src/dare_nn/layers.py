"""Building blocks shared by the native transformer modules of the family plugins.

Every family plugin ships a native (no ``trust_remote_code``) re-implementation of its published
modeling file. Where the mathematics is the same across families it lives here once; what is
particular to a family (its parameter names, fused projections, q/k norms, partial rotary
embeddings, routers, logit alignment, which masks it accepts) stays in the plugin and is built
from these pieces. Nothing here changes a parameter or buffer name: modules that own parameters
(:class:`RMSNorm`, :class:`SwiGLU`) use the names every published checkpoint uses for them
(``weight``; ``gate_proj`` / ``up_proj`` / ``down_proj``).

Numerics are part of the contract (checkpoints must give the same outputs bit for bit), so the
places where published models differ are options, not silent choices:

* :class:`RMSNorm` normalises in float32 and casts back; ``weight_in_fp32`` multiplies the weight
  before the cast (fused-kernel style) instead of after it (HF-Llama style);
* :func:`rotary_cos_sin` computes the angles in float32 and casts ``cos``/``sin`` to ``dtype`` when
  given; :func:`apply_rotary` either computes in the input's dtype or, with ``upcast``, in float32;
* :func:`eager_attention` forms the scores in the activation dtype (``fp32_scores=False``) or in
  float32 before the scale (``fp32_scores=True``); the softmax is always float32.

Shapes: hidden states ``[B, L, D]``; per-head tensors ``[B, heads, L, head_dim]``; attention masks
``[B|1, heads|1, Q, K]``, boolean (True = may attend) or additive float.

KV cache (the DARE contract of native modules): ``past_key_values`` is ``None`` or a list with one
``(k, v)`` per layer, ``[B, kv_heads, P, head_dim]``, keys after RoPE (and any q/k norm); the new
``Q`` tokens attend to the ``P`` cached positions first, then to themselves; the cache returned with
``use_cache`` holds ``P + Q`` positions (cache, then the new tokens).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NoReturn, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from dare_core.api import DareError, DocumentMask
from dare_nn.attention import document_attention

__all__ = [
    "ModelInputError",
    "AttentionMaskError",
    "KVCacheError",
    "RMSNorm",
    "SwiGLU",
    "swiglu",
    "rotary_cos_sin",
    "rotate_half",
    "apply_rotary",
    "repeat_kv",
    "eager_attention",
    "sdpa_attention",
    "ATTENTION_IMPLEMENTATIONS",
    "attention",
    "split_heads",
    "merge_heads",
    "append_kv",
    "attend",
    "pre_norm_residual",
    "key_padding_mask",
    "check_4d_mask",
    "prepare_attention_mask",
    "check_kv_cache",
    "position_ids_or_default",
    "embed_inputs",
    "decoder_inputs",
    "run_layers",
    "reject_options",
    "init_weights",
    "NativeModelDefaults",
    "EmbeddingAccessors",
    "config_error",
    "check_positive_ints",
    "check_heads",
    "check_no_dropout",
    "check_rope_theta",
    "check_attn_implementation",
    "attn_implementation_kwargs",
]

Past = Optional[Sequence[tuple[torch.Tensor, torch.Tensor]]]


# --------------------------------------------------------------------------------------- errors
class ModelInputError(DareError, ValueError):
    """A native model's forward got an input it cannot read (shape, dtype, missing argument)."""


class AttentionMaskError(ModelInputError):
    """A missing or malformed attention mask."""


class KVCacheError(ModelInputError):
    """A ``past_key_values`` that does not follow the DARE KV-cache contract."""


# --------------------------------------------------------------------------------------- norm / MLP
class RMSNorm(nn.Module):
    """``weight * x / sqrt(mean(x**2) + eps)`` over the last dimension.

    The normalisation is computed in float32 (autocast off). By default the result is cast back
    to the input dtype and then multiplied by ``weight`` (HF-Llama); with ``weight_in_fp32`` the
    weight is applied in float32 before the cast (a fused-kernel style; differs in bf16).
    The only parameter is ``weight`` ``[dim]`` (initialised to ones).
    """

    def __init__(self, dim: int, eps: float = 1e-6, *, weight_in_fp32: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.weight_in_fp32 = weight_in_fp32
        self.weight = nn.Parameter(torch.ones(dim))

    @property
    def variance_epsilon(self) -> float:
        """HF name of :attr:`eps`."""
        return self.eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        with torch.autocast(device_type=x.device.type, enabled=False):
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
            if self.weight_in_fp32:
                return (h * self.weight.float()).to(dtype)
        return self.weight * h.to(dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def swiglu(x: torch.Tensor, gate: nn.Module, up: nn.Module, down: nn.Module) -> torch.Tensor:
    """``down(silu(gate(x)) * up(x))``."""
    return down(F.silu(gate(x)) * up(x))


class SwiGLU(nn.Module):
    """SwiGLU MLP with the llama parameter names ``gate_proj``, ``up_proj``, ``down_proj`` (no biases)."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return swiglu(x, self.gate_proj, self.up_proj, self.down_proj)


def pre_norm_residual(
    x: torch.Tensor,
    attn_norm: Callable,
    attn: Callable,
    mlp_norm: Callable,
    mlp: Callable,
    *attn_args: Any,
    keep_present: bool = True,
) -> tuple[torch.Tensor, Any]:
    """A pre-norm decoder layer: ``h = x + attn(attn_norm(x), *attn_args)``, ``h + mlp(mlp_norm(h))``.

    ``attn`` returns ``(output, present)``; the result is ``(layer output, present)``, or
    ``(layer output, None)`` without ``keep_present``: a layer that is not caching returns no
    ``(k, v)``, which are views of its projections (FSDP2 warns about a module returning views).
    """
    a, present = attn(attn_norm(x), *attn_args)
    h = x + a
    return h + mlp(mlp_norm(h)), (present if keep_present else None)


# --------------------------------------------------------------------------------------- RoPE
def rotary_cos_sin(
    position_ids: torch.Tensor, dim: int, theta: float, dtype: Optional[torch.dtype] = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` ``[B, 1, L, dim]`` of rotate-half (NeoX) RoPE for ``position_ids`` ``[B, L]``.

    ``inv_freq[j] = 1 / theta ** (2j / dim)`` for ``j < dim / 2``; both halves of the rotated dims
    use the same frequencies. Angles are computed in float32 (autocast off); ``cos``/``sin`` are
    cast to ``dtype`` when it is given, else stay float32.
    """
    exponent = torch.arange(0, dim, 2, dtype=torch.int64, device=position_ids.device).float() / dim
    inv_freq = 1.0 / (float(theta) ** exponent)
    with torch.autocast(device_type=position_ids.device.type, enabled=False):
        angles = position_ids.float()[..., None] * inv_freq
        angles = torch.cat((angles, angles), dim=-1)[:, None]
        cos, sin = angles.cos(), angles.sin()
    if dtype is not None:
        cos, sin = cos.to(dtype), sin.to(dtype)
    return cos, sin


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] -> [-x2, x1]`` over the last dimension (split in two equal halves)."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, upcast: bool = False) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` for ``x`` ``[B, heads, L, dim]``.

    Computed as given (torch type promotion), or with ``upcast`` in float32 with autocast off and
    cast back to ``x``'s dtype.
    """
    if upcast:
        with torch.autocast(device_type=x.device.type, enabled=False):
            xf = x.float()
            return (xf * cos + rotate_half(xf) * sin).to(x.dtype)
    return x * cos + rotate_half(x) * sin


# --------------------------------------------------------------------------------------- attention
def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """``[B, kv, L, hd] -> [B, kv * groups, L, hd]``; query head ``h`` uses kv head ``h // groups``."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def eager_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: Optional[torch.Tensor],
    scale: float,
    *,
    fp32_scores: bool = False,
) -> torch.Tensor:
    """``softmax(q kᵀ · scale + mask) v`` for ``[B, H, Q, hd]`` / ``[B, H, K, hd]`` tensors.

    ``mask``: ``None``, boolean (True = may attend) or additive float, broadcastable to
    ``[B, H, Q, K]``. Scores are formed in the activation dtype, or with ``fp32_scores`` cast to
    float32 before the scale; the softmax runs in float32 and the probabilities are cast to
    ``v``'s dtype. A query that may attend to no key outputs zeros (as torch SDPA does).
    """
    scores = torch.matmul(q, k.transpose(-1, -2))
    if fp32_scores:
        scores = scores.float()
    scores = scores * scale
    dead = None
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
            dead = ~mask.any(dim=-1, keepdim=True)
        else:
            scores = scores + mask.to(scores.dtype)
            dead = torch.isneginf(mask).all(dim=-1, keepdim=True)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
    if dead is not None:
        probs = probs.masked_fill(dead, 0.0)
    return torch.matmul(probs.to(v.dtype), v)


def sdpa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: Optional[torch.Tensor],
    scale: float,
    *,
    fp32_scores: bool = False,
) -> torch.Tensor:
    """The same function through ``F.scaled_dot_product_attention`` (never causal, no dropout).

    An additive mask is cast to ``q``'s dtype. ``fp32_scores`` is accepted for a uniform signature
    and ignored (the kernel chooses its own accumulation).
    """
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=False, scale=scale)


ATTENTION_IMPLEMENTATIONS: dict[str, Callable[..., torch.Tensor]] = {
    "sdpa": sdpa_attention,
    "eager": eager_attention,
}


def attention(implementation: Optional[str]) -> Callable[..., torch.Tensor]:
    """The kernel for ``config._attn_implementation`` (``None`` means ``"sdpa"``)."""
    impl = implementation or "sdpa"
    try:
        return ATTENTION_IMPLEMENTATIONS[impl]
    except KeyError:
        raise ModelInputError(
            f"attn_implementation={impl!r} is not supported; choose from {tuple(sorted(ATTENTION_IMPLEMENTATIONS))}"
        ) from None


def split_heads(x: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """``[B, L, heads * head_dim] -> [B, heads, L, head_dim]`` (a view)."""
    bsz, length, _ = x.shape
    return x.view(bsz, length, heads, head_dim).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """``[B, heads, L, head_dim] -> [B, L, heads * head_dim]``."""
    bsz, heads, length, head_dim = x.shape
    return x.transpose(1, 2).reshape(bsz, length, heads * head_dim)


def append_kv(
    past: Optional[tuple[torch.Tensor, torch.Tensor]], k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(k, v)`` of one layer with the cached positions first (cast to the new tensors' dtype)."""
    if past is None:
        return k, v
    return torch.cat([past[0].to(k.dtype), k], dim=2), torch.cat([past[1].to(v.dtype), v], dim=2)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: Optional[torch.Tensor],
    *,
    scale: float,
    implementation: Optional[str],
    past: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
    fp32_scores: bool = False,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Attention of ``Q`` new queries over ``past`` then the new keys; GQA by repeating kv heads.

    ``q`` ``[B, H, Q, hd]``, ``k``/``v`` ``[B, KV, Q, hd]`` (keys already rotated), ``past`` this
    layer's cached ``(k, v)`` or ``None``. Returns the heads merged ``[B, Q, H * hd]`` (before the
    output projection) and the layer's ``(k, v)`` with the cache first (``P + Q`` positions).
    """
    k, v = append_kv(past, k, v)
    groups = q.shape[1] // k.shape[1]
    if isinstance(mask, DocumentMask):
        out = document_attention(
            q,
            repeat_kv(k, groups),
            repeat_kv(v, groups),
            mask.doc_ids,
            scale=scale,
            kernel=mask.kernel,
            cache=mask.cache,
        )
        return merge_heads(out), (k, v)
    out = attention(implementation)(q, repeat_kv(k, groups), repeat_kv(v, groups), mask, scale, fp32_scores=fp32_scores)
    return merge_heads(out), (k, v)


# --------------------------------------------------------------------------------------- masks
def key_padding_mask(
    mask: torch.Tensor, batch: int, keys: int, *, error: type[Exception] = AttentionMaskError
) -> torch.Tensor:
    """A 2D ``[B, K]`` key-padding mask (bool, or 0/1 numbers) as a bool ``[B, K]`` (True = key is real)."""
    if tuple(mask.shape) != (batch, keys):
        raise error(
            f"2D attention_mask must be a [batch, keys] key-padding mask of shape {(batch, keys)}, "
            f"got {tuple(mask.shape)}"
        )
    if mask.dtype == torch.bool:
        return mask
    if mask.is_complex() or not bool(((mask == 0) | (mask == 1)).all()):
        raise error(
            "2D attention_mask must be a 0/1 key-padding mask (1 = key may be attended); "
            "pass additive masks as 4D [B, 1, Q, K]"
        )
    return mask != 0


def check_4d_mask(
    mask: torch.Tensor,
    batch: int,
    heads: int,
    queries: int,
    keys: int,
    *,
    exact_queries: bool = False,
    error: type[Exception] = AttentionMaskError,
) -> torch.Tensor:
    """Check a 4D mask (bool or additive float) against ``[B, heads, Q, K]`` and return it unchanged.

    Batch and heads may be 1 (broadcast); the query dimension may be 1 unless ``exact_queries``.
    """
    if not (mask.dtype == torch.bool or mask.is_floating_point()):
        raise error(f"4D attention_mask must be bool (True = may attend) or additive float, got {mask.dtype}")
    b, h, q, k = mask.shape
    q_ok = q == queries or (q == 1 and not exact_queries)
    if b not in (1, batch) or h not in (1, heads) or not q_ok or k != keys:
        raise error(
            f"4D attention_mask of shape {tuple(mask.shape)} does not match [batch, heads, queries, keys] "
            f"= {(batch, heads, queries, keys)} (batch and heads may be 1)"
        )
    return mask


def prepare_attention_mask(
    attention_mask: Any, batch: int, queries: int, keys: int, heads: int, *, error: type[Exception] = AttentionMaskError
) -> Optional[torch.Tensor]:
    """Normalise an optional mask for :func:`attend` (bidirectional models: no mask = see everything).

    * ``None`` or ``"full"`` -> ``None``;
    * 2D ``[B, K]`` 0/1 (or bool) key-padding mask -> ``None`` when all ones, else bool ``[B, 1, 1, K]``;
    * 4D bool or additive float mask broadcastable to ``[B, heads, Q, K]`` -> unchanged;
    * a :class:`~dare_core.ops.attention.DocumentMask` (packed rows, no cache) -> unchanged:
      :func:`attend` runs its document kernel;
    * anything else -> ``error``.
    """
    if attention_mask is None or (isinstance(attention_mask, str) and attention_mask == "full"):
        return None
    if isinstance(attention_mask, DocumentMask):
        if tuple(attention_mask.doc_ids.shape) != (batch, keys) or queries != keys:
            raise error(
                f"a DocumentMask needs doc_ids of shape [batch, keys] = {(batch, keys)} and no cache, "
                f"got doc_ids {tuple(attention_mask.doc_ids.shape)} for {queries} queries"
            )
        return attention_mask
    if not isinstance(attention_mask, torch.Tensor):
        raise error(f"attention_mask must be a tensor, None or 'full', got {type(attention_mask).__name__}")
    if attention_mask.dim() == 2:
        keep = key_padding_mask(attention_mask, batch, keys, error=error)
        return None if bool(keep.all()) else keep[:, None, None, :]
    if attention_mask.dim() == 4:
        return check_4d_mask(attention_mask, batch, heads, queries, keys, error=error)
    raise error(f"attention_mask must be None, 2D [B, K] or 4D [B, 1, Q, K]; got {attention_mask.dim()}D")


# --------------------------------------------------------------------------------------- inputs / cache
def check_kv_cache(
    past_key_values: Any,
    *,
    n_layers: int,
    batch: int,
    kv_heads: int,
    head_dim: int,
    error: type[Exception] = KVCacheError,
) -> tuple[Optional[list], int]:
    """Validate a cache against the DARE contract; returns ``(list of (k, v) or None, P)``.

    ``None`` or an empty list mean no cache. Otherwise one ``(k, v)`` pair of tensors per layer, each
    ``[batch, kv_heads, P, head_dim]`` with the same ``P`` in every layer.
    """
    if past_key_values is None:
        return None, 0
    if not isinstance(past_key_values, (list, tuple)):
        raise error(
            "past_key_values must be None or a list with one (key, value) pair per layer "
            f"(the DARE cache contract), got {type(past_key_values).__name__}"
        )
    if len(past_key_values) == 0:
        return None, 0
    if len(past_key_values) != n_layers:
        raise error(
            f"past_key_values holds {len(past_key_values)} (k, v) pairs but the model has "
            f"{n_layers} layers; pass one per layer"
        )
    out = []
    length = None
    for pair in past_key_values:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2 or not all(isinstance(t, torch.Tensor) for t in pair):
            raise error("every past_key_values entry must be a (k, v) pair of tensors")
        k, v = pair
        if (
            k.dim() != 4
            or k.shape != v.shape
            or k.shape[0] != batch
            or k.shape[1] != kv_heads
            or k.shape[3] != head_dim
            or (length is not None and k.shape[2] != length)
        ):
            raise error(
                f"past_key_values tensors must all be [B={batch}, n_kv_heads={kv_heads}, P, "
                f"head_dim={head_dim}] with one P; got {tuple(k.shape)} and {tuple(v.shape)}"
            )
        length = int(k.shape[2])
        out.append((k, v))
    return out, int(length or 0)


def position_ids_or_default(
    position_ids: Optional[torch.Tensor],
    batch: int,
    length: int,
    device: torch.device,
    *,
    start: int = 0,
    error: type[Exception] = ModelInputError,
) -> torch.Tensor:
    """``[B, L]`` RoPE positions: ``start .. start + L - 1`` by default, else the given ``[L]``,
    ``[1, L]`` or ``[B, L]`` ids broadcast to the batch."""
    if position_ids is None:
        return torch.arange(start, start + length, device=device)[None].expand(batch, length)
    if position_ids.dim() == 1:
        position_ids = position_ids[None]
    if position_ids.dim() != 2 or position_ids.shape[-1] != length or position_ids.shape[0] not in (1, batch):
        raise error(
            f"position_ids must have shape [L], [1, L] or [B, L] with L = {length}; got {tuple(position_ids.shape)}"
        )
    return position_ids.to(device).expand(batch, length)


def embed_inputs(
    embedding: nn.Module,
    input_ids: Optional[torch.Tensor],
    inputs_embeds: Optional[torch.Tensor],
    *,
    error: type[Exception] = ModelInputError,
) -> torch.Tensor:
    """``[B, L, D]`` from exactly one of ``input_ids`` ``[B, L]`` and ``inputs_embeds`` ``[B, L, D]``."""
    if (input_ids is None) == (inputs_embeds is None):
        raise error("pass exactly one of input_ids and inputs_embeds")
    x = embedding(input_ids) if inputs_embeds is None else inputs_embeds
    if x.dim() != 3:
        raise error(f"expected [B, L] input_ids or [B, L, D] inputs_embeds, got {tuple(x.shape)}")
    return x


def decoder_inputs(
    embedding: nn.Module,
    input_ids: Optional[torch.Tensor],
    inputs_embeds: Optional[torch.Tensor],
    position_ids: Optional[torch.Tensor],
    past_key_values: Any,
    *,
    n_layers: int,
    kv_heads: int,
    head_dim: int,
    positions_after_cache: bool = True,
) -> tuple[torch.Tensor, Optional[list], int, torch.Tensor]:
    """The checked inputs of a decoder stack: ``(x [B, L, D], past or None, P, position_ids [B, L])``.

    :func:`embed_inputs`, then :func:`check_kv_cache`, then :func:`position_ids_or_default` whose
    default starts at ``P`` (after the cached positions) or, without ``positions_after_cache``, at 0.
    """
    x = embed_inputs(embedding, input_ids, inputs_embeds)
    bsz, length, _ = x.shape
    past, cached = check_kv_cache(past_key_values, n_layers=n_layers, batch=bsz, kv_heads=kv_heads, head_dim=head_dim)
    start = cached if positions_after_cache else 0
    return x, past, cached, position_ids_or_default(position_ids, bsz, length, x.device, start=start)


def run_layers(
    layers: Sequence[nn.Module],
    x: torch.Tensor,
    *layer_args: Any,
    past: Optional[list] = None,
    final_norm: Optional[nn.Module] = None,
    output_hidden_states: bool = False,
    use_cache: bool = False,
) -> tuple[torch.Tensor, Optional[tuple], Optional[list]]:
    """Run decoder layers ``layer(x, *layer_args, layer_past, use_cache=use_cache) -> (x, (k, v))``
    (``(x, None)`` without ``use_cache``), then ``final_norm``.

    Returns ``(x, hidden_states, presents)``: ``hidden_states`` (with ``output_hidden_states``) is
    the input of every layer plus the final-norm output; ``presents`` (with ``use_cache``) is the
    list of every layer's ``(k, v)``.
    """
    hidden: Optional[list] = [] if output_hidden_states else None
    presents: Optional[list] = [] if use_cache else None
    for i, layer in enumerate(layers):
        if hidden is not None:
            hidden.append(x)
        x, kv = layer(x, *layer_args, None if past is None else past[i], use_cache=use_cache)
        if presents is not None:
            presents.append(kv)
    if final_norm is not None:
        x = final_norm(x)
    if hidden is not None:
        hidden.append(x)
    return x, (tuple(hidden) if hidden is not None else None), presents


def reject_options(
    owner: str,
    kwargs: dict[str, Any],
    names: Sequence[str],
    *,
    hint: str = "",
    error: type[Exception] = ModelInputError,
) -> None:
    """Refuse keyword arguments that would change the result if honoured (set = not None/False)."""
    for key in names:
        value = kwargs.get(key)
        if value is not None and value is not False:
            raise error(f"{owner}.forward does not support {key!r}{hint}")


# --------------------------------------------------------------------------------------- PreTrainedModel helpers
def init_weights(module: nn.Module, std: float, *, cutoff: Optional[float] = None) -> None:
    """Default initialisation of one module (called from ``PreTrainedModel._init_weights``).

    ``nn.Linear`` / ``nn.Embedding`` weights ~ N(0, std) (truncated at ±``cutoff``·std when given),
    biases zero, an embedding's ``padding_idx`` row zero (unless the weight was loaded), and
    :class:`RMSNorm` weights one. Uses ``transformers.initialization``, which leaves loaded
    tensors alone.
    """
    from transformers import initialization as hf_init

    def draw(t: torch.Tensor) -> None:
        if cutoff:
            hf_init.trunc_normal_(t, mean=0.0, std=std, a=-cutoff * std, b=cutoff * std)
        else:
            hf_init.normal_(t, mean=0.0, std=std)

    if isinstance(module, nn.Linear):
        draw(module.weight)
        if module.bias is not None:
            hf_init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        draw(module.weight)
        if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
    elif isinstance(module, RMSNorm):
        hf_init.ones_(module.weight)


class NativeModelDefaults:
    """``PreTrainedModel`` settings shared by the native modules (mix in before ``PreTrainedModel``).

    Submodule ``model``, gradient checkpointing supported, attention through this module's own
    SDPA / eager kernels only (no flash, flex or pluggable backends), and :func:`init_weights`
    with ``config.initializer_range`` (override ``_init_weights`` for another rule).
    """

    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flash_attn = False
    _supports_flex_attn = False
    _supports_attention_backend = False

    def _init_weights(self, module: nn.Module) -> None:
        init_weights(module, float(self.config.initializer_range))  # type: ignore[attr-defined]


def _resolve(root: object, path: str) -> tuple[object, str]:
    """``(parent, leaf)`` of the dotted attribute ``path`` below ``root``."""
    *parents, leaf = path.split(".")
    for name in parents:
        root = getattr(root, name)
    return root, leaf


class EmbeddingAccessors:
    """``get/set_input_embeddings`` and ``get/set_output_embeddings`` by dotted attribute path.

    Mix into a ``PreTrainedModel`` (before it) and set ``input_embeddings_path`` (e.g.
    ``"model.embed_tokens"``) and ``output_embeddings_path`` (the LM head, default ``"lm_head"``;
    ``None`` for a backbone without a head: the ``PreTrainedModel`` defaults then apply).
    """

    input_embeddings_path: str = "model.embed_tokens"
    output_embeddings_path: Optional[str] = "lm_head"

    def get_input_embeddings(self) -> nn.Module:
        parent, leaf = _resolve(self, self.input_embeddings_path)
        return getattr(parent, leaf)

    def set_input_embeddings(self, value: nn.Module) -> None:
        parent, leaf = _resolve(self, self.input_embeddings_path)
        setattr(parent, leaf, value)

    def get_output_embeddings(self) -> Optional[nn.Module]:
        if self.output_embeddings_path is None:
            return super().get_output_embeddings()  # type: ignore[misc]
        parent, leaf = _resolve(self, self.output_embeddings_path)
        return getattr(parent, leaf)

    def set_output_embeddings(self, value: nn.Module) -> None:
        if self.output_embeddings_path is None:
            return super().set_output_embeddings(value)  # type: ignore[misc]
        parent, leaf = _resolve(self, self.output_embeddings_path)
        setattr(parent, leaf, value)


# --------------------------------------------------------------------------------------- config checks
def config_error(prefix: str, error: type[Exception] = ValueError) -> Callable[[str], NoReturn]:
    """``bad(msg)`` raising ``error(f"{prefix}: {msg}")``: one place for a config class's messages."""

    def bad(msg: str) -> NoReturn:
        raise error(f"{prefix}: {msg}")

    return bad


def check_positive_ints(cfg: Any, names: Sequence[str], bad: Callable[[str], NoReturn]) -> None:
    """Every field in ``names`` is a positive ``int`` (not a bool)."""
    for name in names:
        value = getattr(cfg, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            bad(f"{name} must be a positive int, got {value!r}")


def check_heads(
    heads: int,
    kv_heads: Any,
    bad: Callable[[str], NoReturn],
    *,
    rotary_dim: Optional[int] = None,
    names: tuple[str, str] = ("num_key_value_heads", "num_attention_heads"),
) -> None:
    """``kv_heads`` is a positive divisor of ``heads`` (GQA) and ``rotary_dim`` (when given) is even."""
    if rotary_dim is not None and rotary_dim % 2:
        bad(f"head_dim ({rotary_dim}) must be even for rotary embeddings")
    if not isinstance(kv_heads, int) or kv_heads <= 0 or heads % kv_heads:
        bad(f"{names[0]} ({kv_heads}) must be a positive divisor of {names[1]} ({heads})")


def check_no_dropout(cfg: Any, names: Sequence[str], bad: Callable[[str], NoReturn]) -> None:
    """Every dropout field in ``names`` is 0 (these implementations have no dropout)."""
    for name in names:
        if getattr(cfg, name):
            bad(f"{name}={getattr(cfg, name)!r} is not supported (no dropout); use 0.0")


def check_rope_theta(theta: Any, bad: Callable[[str], NoReturn]) -> None:
    if not (isinstance(theta, (int, float)) and not isinstance(theta, bool) and theta > 0):
        bad(f"rope_theta must be a positive number, got {theta!r}")


def check_attn_implementation(cfg: Any, supported: Sequence[str], bad: Callable[[str], NoReturn]) -> None:
    """``cfg._attn_implementation`` is ``None`` (= sdpa) or one of ``supported``."""
    attn = cfg._attn_implementation
    if attn is not None and attn not in supported:
        bad(f"attn_implementation={attn!r} is not supported (choose from {tuple(supported)})")


def attn_implementation_kwargs(kwargs: dict[str, Any], equivalent: Optional[dict[str, str]] = None) -> dict[str, Any]:
    """Config ``__post_init__`` kwargs with the attention choice under its public name.

    Older configs pass it as ``_attn_implementation``; ``equivalent`` maps published kernel names
    that compute the same function (e.g. a flash kernel) to a supported one.
    """
    if "_attn_implementation" in kwargs and "attn_implementation" not in kwargs:
        kwargs["attn_implementation"] = kwargs.pop("_attn_implementation")
    impl = kwargs.get("attn_implementation")
    if equivalent and impl in equivalent:
        kwargs["attn_implementation"] = equivalent[impl]
    return kwargs


# --------------------------------------------------------------------------------------- outputs
def cache_field(output_cls: type) -> str:
    """The name of the KV-cache field of a transformers output class: ``cache`` since transformers
    renamed it, ``past_key_values`` before (both releases are supported)."""
    names = {f.name for f in dataclasses.fields(output_cls)}
    return "cache" if "cache" in names else "past_key_values"


def model_output(output_cls: type, cache: Any = None, **fields: Any) -> Any:
    """``output_cls(**fields)`` with ``cache`` under the field name this transformers declares."""
    if cache is not None:
        fields[cache_field(output_cls)] = cache
    return output_cls(**fields)


def output_cache(output: Any) -> Any:
    """The KV cache of a transformers output, under either field name."""
    return getattr(output, cache_field(type(output)))
