"""Native ``DreamTokenizer``: the published Dream tokenizer loaded without ``trust_remote_code``.

The published Dream checkpoints (Dream-org/Dream-v0-Base-7B, Dream-v0-Instruct-7B) ship their
tokenizer as remote code: ``tokenizer_config.json`` names ``"tokenizer_class": "DreamTokenizer"``
and ``"auto_map": {"AutoTokenizer": ["tokenization_dream.DreamTokenizer", null]}``, next to
``tokenization_dream.py``, ``vocab.json`` and ``merges.txt`` (Qwen2's byte-level BPE; no
``tokenizer.json``). Its ``added_tokens_decoder`` gives the added tokens their ids
(``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``, ..., ``<|beginoftext|>``, ``<|mask|>``, 151643 to
151666 in the 7B models), and it names the bos/eos/pad/mask tokens and the chat template. The remote
class is Qwen2's tokenizer under another name, so transformers would load it only with
``trust_remote_code=True``.

Here :class:`DreamTokenizer` is transformers' own Qwen2 tokenizer (Qwen2's pre-tokenisation regex,
NFC normalisation, byte-level BPE over ``vocab.json`` / ``merges.txt``, or over the BPE of a
``tokenizer.json`` when one is present) registered under the published class name:
:func:`dare_plugin_dream.hf.register_auto_classes` (called by the family's ``load`` and ``create``)
adds it to ``AutoTokenizer``, which then prefers this local class to the remote code the
``auto_map`` points at. The bos/eos/pad/mask tokens and the chat template come from
``tokenizer_config.json`` as transformers reads them. Every entry of ``added_tokens_decoder`` keeps
exactly its id: the added tokens are placed into the BPE vocabulary at those ids (so ids need not
follow ``vocab.json`` without a gap), and an id that ``vocab.json`` already gives to another token,
or a token that ends up at another id, is refused with a :class:`~dare_core.api.DareError`.
The ``auto_map`` is not written back when the tokenizer is saved: a saved copy has no
``tokenization_dream.py`` to point at (it carries a ``tokenizer.json`` and the class name).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from tokenizers.models import BPE
from transformers import Qwen2Tokenizer

from dare_core.api import DareError

__all__ = ["DreamTokenizer"]


def _content(token: Any) -> str:
    """The text of an ``added_tokens_decoder`` entry (an ``AddedToken`` or its JSON dict)."""
    return token["content"] if isinstance(token, Mapping) else str(token)


class DreamTokenizer(Qwen2Tokenizer):
    """Qwen2's byte-level BPE tokenizer under the published Dream class name (see the module)."""

    def __init__(
        self,
        vocab: Any = None,
        merges: Any = None,
        added_tokens_decoder: Optional[Mapping[Any, Any]] = None,
        **kwargs: Any,
    ):
        kwargs.pop("auto_map", None)
        if isinstance(vocab, str) and isinstance(merges, str):  # the paths of vocab.json / merges.txt
            vocab, merges = BPE.read_file(vocab, merges)
        pinned = {int(tid): _content(tok) for tid, tok in (added_tokens_decoder or {}).items()}
        if isinstance(vocab, dict):
            vocab = dict(vocab)
            owner = {tid: text for text, tid in vocab.items()}
            for tid, text in pinned.items():
                if owner.get(tid, text) != text:
                    raise DareError(
                        f"tokenizer_config.json gives id {tid} to {text!r} but the vocabulary already "
                        f"uses it for {owner[tid]!r}; re-download or re-export the checkpoint"
                    )
                vocab.setdefault(text, tid)
        super().__init__(vocab=vocab, merges=merges, added_tokens_decoder=added_tokens_decoder, **kwargs)
        for tid, text in pinned.items():
            if (got := self.convert_tokens_to_ids(text)) != tid:
                raise DareError(
                    f"tokenizer_config.json gives {text!r} id {tid} but the tokenizer built from "
                    f"the vocabulary gives it {got}; re-download or re-export the checkpoint"
                )


def load_tokenizer(path: str) -> Any:
    """The checkpoint's tokenizer as the family loads it (``DreamTokenizer`` registered, no remote
    code): ``ModelFamily.load_tokenizer``, used by the pre-flight checks."""
    from transformers import AutoTokenizer

    from dare_plugin_dream.hf import register_auto_classes

    register_auto_classes()
    return AutoTokenizer.from_pretrained(path, trust_remote_code=False)
