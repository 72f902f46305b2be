"""LoRA adapters through PEFT for every workflow and every family.

``model.lora.rank=r`` wraps ``wrapper.module`` in a PEFT ``PeftModel`` whose base weights are
frozen; only the adapter matrices train (the optimizer sees only parameters that require grad).
The wrapper keeps calling ``wrapper.module(...)``, so rollouts, likelihood estimates and
evaluation all use the adapted weights. Which modules are adapted is the family's business: the
wrapper may carry ``lora_target_modules`` (a list of module-name suffixes or one regular
expression, as PEFT takes them); without it every linear layer except the output head is adapted
(PEFT's ``all-linear``). ``model.lora.target_modules`` overrides both.

Checkpoint layout of a LoRA run (written atomically by the run directory)::

    <checkpoint>/lora_adapter/adapter_config.json        PEFT layout; base_model_name_or_path
    <checkpoint>/lora_adapter/adapter_model.safetensors  = the base checkpoint directory
    <checkpoint>/tokenizer files
    <checkpoint>/config.json + weights                   only with model.lora.merge_on_save

A checkpoint without merged weights is still a valid ``model.path``: :func:`resolve_checkpoint`
finds the adapter and loads its base checkpoint underneath it. ``peft`` is imported lazily, so
runs without LoRA do not need it.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import warnings
from typing import Any, Iterator, Optional, overload

from dare_core.errors import DareError

ADAPTER_DIR = "lora_adapter"
ADAPTER_CONFIG = "adapter_config.json"
ALL_LINEAR = "all-linear"


def _peft():
    try:
        import peft
    except ImportError:  # pragma: no cover - depends on the environment
        raise DareError(
            "model.lora needs the `peft` package; install it with `pip install peft` (or the dare-core[lora] extra)"
        ) from None
    return peft


def is_lora(wrapper: Any) -> bool:
    """Whether ``wrapper.module`` carries PEFT adapters."""
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(wrapper.module, PeftModel)


def find_adapter(path: str) -> Optional[str]:
    """The adapter directory at ``path`` (itself, or its ``lora_adapter/``), or ``None``."""
    for cand in (path, os.path.join(path, ADAPTER_DIR)):
        if os.path.isfile(os.path.join(cand, ADAPTER_CONFIG)):
            return cand
    return None


@overload
def resolve_checkpoint(path: str) -> tuple[str, Optional[str]]: ...
@overload
def resolve_checkpoint(path: None) -> tuple[None, None]: ...
def resolve_checkpoint(path: Optional[str]) -> tuple[Optional[str], Optional[str]]:
    """``(base checkpoint, adapter dir or None)`` for a ``model.path``: a directory with full weights
    (``config.json``) is its own base; an adapter-only LoRA checkpoint resolves to the base
    checkpoint recorded in the adapter's ``base_model_name_or_path``."""
    if not path or os.path.isfile(os.path.join(path, "config.json")):
        return path, None
    adapter = find_adapter(path)
    if adapter is None:
        return path, None
    with open(os.path.join(adapter, ADAPTER_CONFIG)) as fh:
        base = json.load(fh).get("base_model_name_or_path")
    if not base or not os.path.isdir(base):
        raise DareError(
            f"{path!r} holds a LoRA adapter whose base checkpoint {base!r} does not "
            f"exist; pass model.path=<base checkpoint> model.lora.adapter={adapter}"
        )
    return base, adapter


def target_modules(wrapper: Any, configured: Optional[tuple[str, ...]]) -> Any:
    """What PEFT should adapt: the config's names, else the family's default, else all linear
    layers except the output head."""
    if configured:
        return ALL_LINEAR if list(configured) == [ALL_LINEAR] else list(configured)
    default = wrapper.lora_target_modules
    if default:
        return default if isinstance(default, str) else list(default)
    return ALL_LINEAR


def apply_lora(
    wrapper: Any,
    cfg: Any,
    *,
    base_path: Optional[str] = None,
    adapter: Optional[str] = None,
    trainable: bool = True,
    checkpointing: bool = False,
) -> Any:
    """Wrap ``wrapper.module`` with LoRA adapters as ``cfg`` (``model.lora``) says.

    :param base_path: the base checkpoint, recorded in the adapter config for reloading.
    :param adapter: load this adapter (overrides ``cfg.adapter``) instead of a fresh one.
    :param trainable: load a saved adapter with trainable weights (training) or frozen.
    :param checkpointing: gradient checkpointing is on (the embeddings' outputs then need grads).
    Returns the same wrapper (modified in place); a no-op when LoRA is off.
    """
    adapter = adapter or cfg.adapter
    if cfg.rank is None and adapter is None:
        return wrapper
    peft = _peft()
    module = wrapper.module
    if is_lora(wrapper):
        raise DareError("the model already carries LoRA adapters; load it once")
    if checkpointing and hasattr(module, "enable_input_require_grads"):
        module.enable_input_require_grads()  # frozen embeddings would cut the checkpointed graph
    if adapter is not None:
        found = find_adapter(adapter)
        if found is None:
            raise DareError(
                f"model.lora.adapter={adapter!r} holds no {ADAPTER_CONFIG}; pass a PEFT "
                f"adapter directory or a LoRA run checkpoint"
            )
        peft_model = peft.PeftModel.from_pretrained(module, found, is_trainable=trainable)
    else:
        config = peft.LoraConfig(
            r=int(cfg.rank),
            lora_alpha=float(cfg.alpha),
            lora_dropout=float(cfg.dropout),
            bias="none",
            target_modules=target_modules(wrapper, cfg.target_modules),
        )
        try:
            peft_model = peft.get_peft_model(module, config)
        except ValueError as exc:
            raise DareError(
                f"model.lora.target_modules: {' '.join(str(exc).split())[:300]}; "
                f"name modules of this model (e.g. model.lora.target_modules=[all-linear])"
            ) from None
    peft_model.dare_fresh_adapter = adapter is None
    if base_path is not None:
        peft_model.peft_config["default"].base_model_name_or_path = os.path.abspath(base_path)
    # adapter weights follow the base dtype (PEFT keeps them in float32 otherwise)
    dtype = next(p for p in peft_model.get_base_model().parameters()).dtype
    for name, p in peft_model.named_parameters():
        if "lora_" in name and p.dtype != dtype:
            p.data = p.data.to(dtype)
    wrapper.module = peft_model
    return wrapper


def save_checkpoint(wrapper: Any, directory: str, *, merge: bool = False, state_dict: Optional[dict] = None) -> None:
    """Write a LoRA checkpoint into ``directory`` (see the module docstring for the layout);
    ``state_dict``: a sharding engine's consolidated weights of the PEFT model."""
    module = wrapper.module
    if merge and state_dict is not None:
        raise DareError(
            "model.lora.merge_on_save needs the whole model in one process; with a "
            "sharding engine set it to false and merge the saved adapter afterwards "
            "(PEFT merge_and_unload)"
        )
    os.makedirs(directory, exist_ok=True)
    with warnings.catch_warnings():  # a base without an HF config.json (test models) is fine
        warnings.filterwarnings("ignore", message="Could not find a config file")
        module.save_pretrained(os.path.join(directory, ADAPTER_DIR), state_dict=state_dict)
    readme = os.path.join(directory, ADAPTER_DIR, "README.md")
    if os.path.isfile(readme):  # PEFT's model-card template, not ours
        os.remove(readme)
    if merge:  # the family's own save of the merged weights (writes the tokenizer too)
        merged = copy.copy(wrapper)
        merged.module = copy.deepcopy(module).merge_and_unload()  # the training module stays as it is
        merged.save_pretrained(directory)
    else:
        wrapper.tokenizer.save_pretrained(directory)


@contextlib.contextmanager
def adapters_disabled(wrapper: Any) -> Iterator[Any]:
    """Run the base model (adapters off) inside the block: the reference policy of a run that
    started from a fresh (zero-update) adapter."""
    with wrapper.module.disable_adapter():
        yield wrapper


def starts_from_base(wrapper: Any) -> bool:
    """True when the adapters were freshly created, so the base model equals the initial policy."""
    return bool(getattr(wrapper.module, "dare_fresh_adapter", False))
