"""A small LLaDA2-style tokenizer trained from scratch (for tiny test/demo checkpoints).

Byte-level BPE with every digit its own pre-token, the LLaDA2 special tokens
(``<|startoftext|>``, ``<|endoftext|>`` = eos = pad, ``<|mask|>``, ``<role>``, ``</role>``,
``<|role_end|>``, ``[CLS]``, ``[gMASK]``) and LLaDA2's chat template (models.md §5, without the
tool-call branches of the published template).
"""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

__all__ = ["BOS_TOKEN", "EOS_TOKEN", "PAD_TOKEN", "MASK_TOKEN", "ROLE_END", "SPECIAL_TOKENS",
           "LLADA2_CHAT_TEMPLATE", "build_tokenizer"]

BOS_TOKEN = "<|startoftext|>"
EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = EOS_TOKEN
MASK_TOKEN = "<|mask|>"
ROLE_OPEN = "<role>"
ROLE_CLOSE = "</role>"
ROLE_END = "<|role_end|>"
CLS_TOKEN = "[CLS]"
GMASK_TOKEN = "[gMASK]"

# Order fixes the ids: 0 bos, 1 eos/pad, 2 mask, 3.. the rest.
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, MASK_TOKEN, ROLE_OPEN, ROLE_CLOSE, ROLE_END, CLS_TOKEN, GMASK_TOKEN)
_EXTRA_SPECIAL = [ROLE_OPEN, ROLE_CLOSE, ROLE_END, GMASK_TOKEN]

# <role>SYSTEM</role> + (first system message + "\n") + "detailed thinking off<|role_end|>", then
# <role>HUMAN</role>{c}<|role_end|> per user turn, <role>SYSTEM</role>{c}<|role_end|> for a later
# system turn, <role>ASSISTANT</role>{c}<|role_end|> per assistant turn; generation prompt
# <role>ASSISTANT</role>.
LLADA2_CHAT_TEMPLATE = (
    "{{- '<role>SYSTEM</role>' -}}"
    "{%- if messages and messages[0]['role'] == 'system' -%}{{- messages[0]['content'] + '\\n' -}}{%- endif -%}"
    "{{- 'detailed thinking off<|role_end|>' -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}"
    "{{- '<role>HUMAN</role>' + message['content'] + '<|role_end|>' -}}"
    "{%- elif message['role'] == 'system' and not loop.first -%}"
    "{{- '<role>SYSTEM</role>' + message['content'] + '<|role_end|>' -}}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{{- '<role>ASSISTANT</role>' + message['content'] + '<|role_end|>' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<role>ASSISTANT</role>' -}}{%- endif -%}"
)


def build_tokenizer(texts: list[str], vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``texts`` (deterministic for a given input).

    ``len(tokenizer) <= vocab_size``: the 8 special tokens take ids 0-7, then the 256 byte
    symbols, then merges learnt from ``texts``.
    """
    if isinstance(texts, str):
        raise TypeError("texts must be a list of strings, not a single string")
    texts = list(texts)
    if not all(isinstance(t, str) for t in texts):
        raise TypeError("texts must contain only strings")
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    minimum = len(SPECIAL_TOKENS) + len(alphabet)
    if vocab_size < minimum:
        raise ValueError(f"vocab_size must be at least {minimum} (8 special tokens + 256 bytes), got {vocab_size}")
    core = Tokenizer(models.BPE())
    core.normalizer = None
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=sorted(alphabet), show_progress=False,
    )
    core.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token=BOS_TOKEN, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN,
        mask_token=MASK_TOKEN, cls_token=CLS_TOKEN, extra_special_tokens=list(_EXTRA_SPECIAL),
        add_bos_token=False, add_eos_token=False, clean_up_tokenization_spaces=False,
        model_max_length=32768, chat_template=LLADA2_CHAT_TEMPLATE,
    )
