"""Checks before any work (``dare train``, ``eval``, ``generate``); each failure is one DareError
naming the problem and the fix; nothing is loaded onto a device or written. A family listing
``model_types`` (Hugging Face layout): ``config.json`` is an object of such a type (another family's
type names that family) with the family's ``config_keys``; the weights (a file, or an index and its
shards) are whole (safetensors: as long as the header says); the tokenizer loads. The task is built
and its data read (eval; training: a data file whole, a built-in source's first ``TRAIN_SAMPLE``).
The longest prompts fit ``trainer.max_prompt_length`` (evaluation: not) and, with the rollout's
``gen_length`` (evaluation: the evaluation's), the context (``ModelFamily.context_key``). Training: ``output_dir`` is writable with room for the saves (:func:`disk_need`)."""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
from typing import Any, Optional, Sequence

from dare_core.errors import DareError, PromptFitError
from dare_core.models.lora import resolve_checkpoint

WEIGHTS, FIX, TRAIN_SAMPLE = ("model.safetensors", "pytorch_model.bin"), "re-download or re-export the checkpoint", 64


def _json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError) as exc:  # ValueError: JSON and UTF-8 decoding
        raise DareError(f"{path} is not readable JSON ({getattr(exc, 'msg', None) or exc}); {FIX}") from None


def checkpoint(dare: Any, family: Any, path: Optional[str]) -> Optional[tuple[str, dict]]:
    """``(base directory, config.json)`` of the checkpoint at ``path`` (a LoRA adapter: its base),
    checked; ``None`` for a family without ``model_types``."""
    if not family.model_types:
        return None
    if not path or not os.path.isdir(path):
        raise DareError(f"model.path={path}: no such directory; give a checkpoint directory")
    base = resolve_checkpoint(path)[0]
    if not os.path.isfile(file := os.path.join(base, "config.json")):
        raise DareError(f"{base} has no config.json, so it is no Hugging Face checkpoint; give one as model.path")
    if not isinstance(cfg := _json(file), dict):
        raise DareError(f"{file} holds a JSON {type(cfg).__name__}, not an object; {FIX}")
    if (kind := cfg.get("model_type")) not in family.model_types:
        owner = next((n for n, f in dare.registries.models.items() if kind in f.model_types), None)
        raise DareError(
            f"{base} is a checkpoint of model_type {kind!r}, which model family {family.name!r} does not "
            f"load; "
            + (
                f"it is a {owner!r} checkpoint: pass --model {owner}"
                if owner
                else "no installed model family loads it (`dare list models`)"
            )
        )
    if missing := [k for k in family.config_keys if cfg.get(k) is None]:
        raise DareError(f"{file} lacks {', '.join(missing)} (the sizes of a {kind!r} model); {FIX}")
    return base, cfg


def _params(base: str) -> int:
    """The parameter count of the checkpoint's weights, found whole (``.bin``: float32 assumed)."""
    files = [w for w in WEIGHTS if os.path.isfile(os.path.join(base, w))][:1]
    if index := next((p for w in WEIGHTS if os.path.isfile(p := os.path.join(base, w + ".index.json"))), None):
        wmap = data.get("weight_map") if isinstance(data := _json(index), dict) else None
        files = sorted(set(wmap.values())) if isinstance(wmap, dict) else []
    if not files:
        raise DareError(f"{base} holds no weights ({' or '.join(WEIGHTS)}, or a sharded index naming its files); {FIX}")
    params = 0
    for path in (os.path.join(base, f) for f in files):
        if not os.path.isfile(path):
            raise DareError(f"{path}, named by the weights index, is missing; {FIX}")
        size, end = os.path.getsize(path), None
        try:
            with open(path, "rb") as fh:  # safetensors: an 8-byte header size, a JSON header, the data
                (n,) = struct.unpack("<Q", fh.read(8))
                tensors = [t for k, t in json.loads(fh.read(n) if n < size else b"[]").items() if k != "__metadata__"]
            params += sum(math.prod(t["shape"]) for t in tensors)
            end = 8 + n + max(t["data_offsets"][1] for t in tensors)
        except (struct.error, ValueError, KeyError, TypeError, IndexError, AttributeError):
            pass
        if path.endswith(".bin"):
            params += size // 4
        elif end is None or end > size:
            raise DareError(f"{path} is truncated or not a safetensors file; {FIX}")
    return params


def disk_need(config: Any, params: int) -> int:
    """Bytes the run's saves take at most: the training checkpoints kept (the model in
    ``model.dtype``, float32 weights and two AdamW moments; one more while the next is written)
    and the final model. LoRA without merged saves counts as nothing (adapters are small)."""
    import torch

    tr, lora = config.trainer, config.model.lora
    export = 0 if lora.enabled and not lora.merge_on_save else params * getattr(torch, config.model.dtype).itemsize
    kept = tr.steps // tr.save_every if tr.save_every else 0
    kept = min(kept, tr.keep_last + 1) if tr.keep_last else kept
    return kept * (export + (0 if lora.enabled else 12 * params)) + (export if tr.save_final else 0)


def _output(config: Any, params: int) -> None:
    probe, where = os.path.abspath(config.output_dir), f"output_dir={config.output_dir}"
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe) or not os.access(probe, os.W_OK | os.X_OK):
        state = "not writable" if os.path.isdir(probe) else "a file, not a directory"
        raise DareError(f"{where}: {probe} is {state}; choose another output_dir")
    if (need := disk_need(config, params)) > (free := shutil.disk_usage(probe).free):
        raise DareError(
            f"{where}: the run's saves need about {need / 1e6:,.1f} MB, {probe} has {free / 1e6:,.1f} MB free; free "
            f"space, choose another output_dir or save less (trainer.keep_last, trainer.save_every, "
            f"trainer.save_final)"
        )


def preflight(
    dare: Any, config: Any, *, train: bool = False, prompts: Optional[Sequence[str]] = None, evaluation: bool = False
) -> Any:
    """The checks of the module docstring (``train``: with the training data and ``output_dir``;
    ``prompts``: ``dare generate``'s, instead of a task; ``evaluation``: the prompts are held to
    the model's context with the evaluation's gen_length, not to ``trainer.max_prompt_length``);
    returns the task, its data read, or None. Prompts that do not fit raise :class:`PromptFitError`."""
    family = dare.registries.models.get(config.model.family)
    found = checkpoint(dare, family, config.model.path)
    params = _params(found[0]) if found is not None else 0
    if train:
        _output(config, params)
    task, chats = None, [[{"role": "user", "content": p}] for p in prompts or ()]
    if prompts is not None and not all(p.strip() for p in prompts):
        raise DareError("--prompt is empty; give the text the model should respond to")
    if prompts is None:
        task = dare.registries.tasks.get(config.task.name).build(config.task)
        items = task.examples("eval", limit=config.task.num_eval, seed=config.seed) + (
            task.examples("train", limit=None if config.task.train_path else TRAIN_SAMPLE, seed=config.seed)
            if train
            else []
        )
        chats = [ex.prompt for ex in items]
    if found is None:
        return task
    base, cfg = found
    tok = _tokenizer(family, base)
    where = f"task {config.task.name!r}: " if prompts is None else ""
    _check_fit(config, family, cfg, _longest(tok, chats), where, evaluation)
    return task


def _tokenizer(family: Any, base: str) -> Any:
    """The checkpoint's tokenizer as the family loads it; a damaged one is one line."""
    from transformers import AutoTokenizer, PretrainedConfig

    for name in ("tokenizer.json", "tokenizer_config.json"):  # a damaged file names itself
        if os.path.isfile(os.path.join(base, name)):
            _json(os.path.join(base, name))
    try:
        return (
            family.load_tokenizer(base)
            if family.load_tokenizer
            # the family registers the real one
            else AutoTokenizer.from_pretrained(base, config=PretrainedConfig(), trust_remote_code=False)
        )
    except Exception as exc:  # whatever a damaged tokenizer raises: the checkpoint's problem
        first = (str(exc).strip().splitlines() or [""])[0]
        raise DareError(f"{base}: the tokenizer does not load ({type(exc).__name__}: {first}); {FIX}") from exc


def _longest(tok: Any, chats: Sequence[list[dict[str, str]]]) -> int:
    """Tokens of the longest prompt, chat template applied (of the 16 longest in characters)."""
    longest = sorted(chats, key=lambda c: sum(len(m["content"]) for m in c), reverse=True)[:16]
    texts = [
        tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
        if tok.chat_template
        else "\n".join(m["content"] for m in c)
        for c in longest
    ]
    return max((len(ids) for ids in tok(texts, add_special_tokens=False, verbose=False)["input_ids"]), default=0)


def _check_fit(config: Any, family: Any, cfg: dict, n: int, where: str, evaluation: bool) -> None:
    """Refuse prompts of ``n`` tokens beyond ``trainer.max_prompt_length`` (task prompts; not in
    an evaluation held to the context) or, with the generation, beyond the model's context."""
    context = _context(family, cfg)
    if where and n > config.trainer.max_prompt_length and not (evaluation and context is not None):
        raise PromptFitError(
            f"{where}a prompt has {n} tokens, more than trainer.max_prompt_length="
            f"{config.trainer.max_prompt_length}; raise trainer.max_prompt_length",
            n,
            config.trainer.max_prompt_length,
        )
    gen = getattr(config.eval_rollout if evaluation else config.rollout, "gen_length", 0) or 0
    if context is not None and n + gen > context:
        raise PromptFitError(
            f"{where}its longest prompt has {n} tokens, which with rollout.gen_length={gen} exceeds the "
            f"model's context of {context} tokens ({family.context_key} in config.json); "
            + ("give shorter prompts (fewer shots)" if where else "shorten the prompt")
            + " or lower rollout.gen_length",
            n + gen,
            context,
        )


def context_length(dare: Any, config: Any) -> Optional[int]:
    """The context length of ``model.path``'s checkpoint (``ModelFamily.context_key`` in its
    ``config.json``), or ``None`` where the family or the checkpoint does not say."""
    family = dare.registries.models.get(config.model.family)
    found = checkpoint(dare, family, config.model.path)
    return _context(family, found[1]) if found is not None else None


def _context(family: Any, cfg: dict) -> Optional[int]:
    """The context length ``config.json`` (``cfg``) gives under the family's ``context_key``."""
    context = cfg.get(family.context_key or "")
    return context if isinstance(context, int) else None
