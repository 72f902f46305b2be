"""Helpers for family plugins' ``load`` and ``create``: checkpoint checks, token ids from the
checkpoint, loading a module in the published layout, tiny architectures and new checkpoints."""

from __future__ import annotations

import os
from typing import Any, Optional

import torch


def checkpoint_model_type(path: str, accepted: Any) -> str:
    """The ``model_type`` of ``path/config.json``; a :class:`~dare_core.errors.DareError` naming
    the fix when the directory or its config.json is missing or the type is not ``accepted``
    (one type name or a collection of them)."""
    import json

    from dare_core.api import DareError

    if not os.path.isdir(path):
        raise DareError(f"checkpoint directory {path!r} does not exist; pass model.path=DIR")
    cfg_file = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_file):
        raise DareError(f"{path!r} has no config.json; it is not a Hugging Face checkpoint")
    with open(cfg_file) as fh:
        model_type = json.load(fh).get("model_type")
    if isinstance(accepted, str):
        if model_type != accepted:
            raise DareError(
                f"{path!r} holds a {model_type!r} checkpoint, not {accepted!r}; choose the matching --model"
            )
    elif model_type not in accepted:
        raise DareError(
            f"{path!r} holds a {model_type!r} checkpoint, not one of "
            f"{', '.join(sorted(accepted))}; choose the matching --model"
        )
    return model_type


def first_token_id(value: Any) -> Optional[int]:
    """A config token id that may be a list (e.g. several eos ids): its first entry, as ``int``."""
    if isinstance(value, (list, tuple)):
        return int(value[0]) if value else None
    return None if value is None else int(value)


def config_or_tokenizer_id(config_value: Any, tokenizer_value: Optional[int]) -> Optional[int]:
    """A token id from the checkpoint's config (:func:`first_token_id`), else the tokenizer's."""
    tid = first_token_id(config_value)
    return tokenizer_value if tid is None else tid


def tokenizer_token_id(tokenizer: Any, token: str) -> Optional[int]:
    """The id of ``token`` in ``tokenizer``, or ``None`` when the tokenizer does not know it."""
    tid = tokenizer.convert_tokens_to_ids(token)
    if isinstance(tid, int) and tid != tokenizer.unk_token_id and 0 <= tid < len(tokenizer):
        return tid
    return None


def load_module(
    module_cls: Any,
    path: str,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    attn_implementation: Optional[str] = None,
    model_type: Any = None,
) -> tuple[torch.nn.Module, Any]:
    """``(module, tokenizer)`` of a checkpoint: ``module_cls.from_pretrained`` in ``dtype`` on
    ``device`` (with ``attn_implementation`` when given) and the checkpoint's tokenizer; with
    ``model_type``, :func:`checkpoint_model_type` checks the checkpoint first. ``device="meta"``:
    the structure only (:func:`meta_module`), for an engine that fills its shards itself."""
    from transformers import AutoTokenizer

    from dare_core.api import no_hf_progress_bar

    if model_type is not None:
        checkpoint_model_type(path, model_type)
    kwargs: dict[str, Any] = {"dtype": dtype}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    if str(device) == "meta":
        return meta_module(module_cls, path, kwargs), AutoTokenizer.from_pretrained(path)
    with no_hf_progress_bar():
        module = module_cls.from_pretrained(path, **kwargs).to(device)
    return module, AutoTokenizer.from_pretrained(path)


def meta_module(module_cls: Any, path: str, kwargs: dict[str, Any]) -> torch.nn.Module:
    """The checkpoint's module as ``from_pretrained`` builds it, without its weights: parameters
    on the meta device (no storage), buffers computed as usual (non-persistent buffers, e.g. RoPE
    frequencies, are not in the checkpoint), tied weights tied, its config and generation config.

    Args:
        module_cls: the family's ``PreTrainedModel`` class.
        path: the checkpoint directory.
        kwargs: ``from_pretrained``'s ``dtype`` (and ``attn_implementation``).

    Returns:
        the module; the weights come from the checkpoint when an engine fills its shards.
    """
    from accelerate import init_empty_weights
    from transformers import GenerationConfig

    config = module_cls.config_class.from_pretrained(path)
    config._name_or_path = path  # what from_pretrained records
    with init_empty_weights(include_buffers=False):
        module = module_cls._from_config(config, **kwargs)
    module.tie_weights()
    if module.can_generate() and os.path.isfile(os.path.join(path, "generation_config.json")):
        module.generation_config = GenerationConfig.from_pretrained(path)
    return module


def tiny_params(defaults: dict[str, Any], sizes: dict[str, Any], known: Any, label: str) -> dict[str, Any]:
    """``defaults`` overridden by ``sizes``; a :class:`~dare_core.errors.DareError` for size
    names that are neither in ``defaults`` nor in ``known`` (the config's field names)."""
    from dare_core.api import DareError

    params = dict(defaults)
    unknown = set(sizes) - set(params) - set(known)
    if unknown:
        raise DareError(f"unknown {label} config field(s): {', '.join(sorted(unknown))}")
    params.update(sizes)
    return params


def padded_vocab_size(tokenizer: Any, multiple: int = 64) -> int:
    """``len(tokenizer)`` rounded up to a multiple of ``multiple`` (embedding rows)."""
    return ((len(tokenizer) + multiple - 1) // multiple) * multiple


def save_new_checkpoint(out_dir: str, model: Any, tokenizer: Any) -> None:
    """Write a freshly created ``model`` and its ``tokenizer`` to ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
