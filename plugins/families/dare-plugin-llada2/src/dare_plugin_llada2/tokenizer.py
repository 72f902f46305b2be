"""A small LLaDA2-style tokenizer trained from scratch (for tiny test/demo checkpoints).

Byte-level BPE with every digit its own pre-token, the LLaDA2 special tokens
(``<|startoftext|>``, ``<|endoftext|>`` = eos = pad, ``<|mask|>``, ``<role>``, ``</role>``,
``<|role_end|>``, ``[CLS]``, ``[gMASK]``) and LLaDA2's chat template (plugin README, without the
tool-call branches of the published template).
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerFast

from dare_nn.tokenizers import train_byte_bpe

__all__ = [
    "BOS_TOKEN",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "MASK_TOKEN",
    "ROLE_END",
    "SPECIAL_TOKENS",
    "LLADA2_CHAT_TEMPLATE",
    "build_tokenizer",
]

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
    return train_byte_bpe(
        texts,
        vocab_size,
        SPECIAL_TOKENS,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        mask_token=MASK_TOKEN,
        cls_token=CLS_TOKEN,
        extra_special_tokens=list(_EXTRA_SPECIAL),
        model_max_length=32768,
        chat_template=LLADA2_CHAT_TEMPLATE,
    )
