"""Small byte-level BPE tokenizers trained from scratch (tiny ``dare init`` checkpoints).

Family plugins supply only their facts (special token strings, chat template, maximum length,
which tokens are bos/eos/pad/mask); the training procedure is the same for every family:
byte-level BPE in which every digit is its own pre-token (numbers are spelled digit by digit),
no normalizer, a byte-level decoder, merges learnt with ``min_frequency = 2``. Training is
deterministic for a given input.
"""

from __future__ import annotations

from typing import Any, Sequence

__all__ = ["check_texts", "train_byte_bpe"]


def check_texts(texts: Any) -> list[str]:
    """``texts`` as a list, or ``TypeError`` unless it is an iterable of strings (not one string)."""
    if isinstance(texts, str):
        raise TypeError("texts must be a list of strings, not a single string")
    texts = list(texts)
    if not all(isinstance(t, str) for t in texts):
        raise TypeError("texts must contain only strings")
    return texts


def train_byte_bpe(
    texts: Any, vocab_size: int, special_tokens: Sequence[str], *, specials_last: bool = False, **fast_kwargs: Any
):
    """Train a byte-level BPE tokenizer of at most ``vocab_size`` entries on ``texts``.

    ``specials_last=False``: ``special_tokens`` take ids ``0 .. n-1`` in their order, then the
    256 byte symbols, then the learnt merges. ``specials_last=True``: the bytes and merges come
    first (``vocab_size - n`` of them at most) and the special tokens are appended after them
    (the layout of tokenizers whose special tokens follow the learnt vocabulary). Fewer merges
    are learnt when the corpus is too small to support more.

    ``fast_kwargs`` go to :class:`transformers.PreTrainedTokenizerFast` (``bos_token``,
    ``eos_token``, ``chat_template``, ``model_max_length`` ...).
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = check_texts(texts)
    specials = list(special_tokens)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    minimum = len(specials) + len(alphabet)
    if vocab_size < minimum:
        parts = [f"{len(specials)} special tokens", f"{len(alphabet)} bytes"]
        if specials_last:
            parts.reverse()
        raise ValueError(f"vocab_size must be at least {minimum} ({' + '.join(parts)}), got {vocab_size}")

    core = Tokenizer(models.BPE())
    core.normalizer = None
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    core.decoder = decoders.ByteLevel()
    added = [AddedToken(t, special=True, normalized=False) for t in specials]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(specials) if specials_last else vocab_size,
        min_frequency=2,
        special_tokens=[] if specials_last else added,
        initial_alphabet=sorted(alphabet),
        show_progress=False,
    )
    core.train_from_iterator(texts, trainer=trainer, length=len(texts))
    if specials_last:
        core.add_special_tokens(added)
    fast_kwargs.setdefault("add_bos_token", False)
    fast_kwargs.setdefault("add_eos_token", False)
    fast_kwargs.setdefault("clean_up_tokenization_spaces", False)
    return PreTrainedTokenizerFast(tokenizer_object=core, **fast_kwargs)
