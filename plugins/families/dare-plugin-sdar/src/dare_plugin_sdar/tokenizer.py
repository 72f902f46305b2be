"""A small SDAR-style (Qwen3) tokenizer trained from scratch, for tiny test/demo checkpoints.

Byte-level BPE with every digit its own pre-token, the Qwen3 special tokens SDAR uses
(``<|endoftext|>`` eos/pad, ``<|im_start|>``, ``<|im_end|>``, ``<think>``, ``</think>``, mask
``<|MASK|>``) and a Qwen3-style chat template. Published SDAR checkpoints ship their own tokenizer and
template; this one only has to behave the same for plain system/user/assistant conversations.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerFast

from dare_nn.tokenizers import train_byte_bpe

__all__ = [
    "EOS_TOKEN",
    "PAD_TOKEN",
    "MASK_TOKEN",
    "IM_START",
    "IM_END",
    "SPECIAL_TOKENS",
    "CHAT_TEMPLATE",
    "build_tokenizer",
]

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = EOS_TOKEN
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
THINK = "<think>"
END_THINK = "</think>"
MASK_TOKEN = "<|MASK|>"

# Order fixes the ids: 0 eos/pad, 1 im_start, 2 im_end, 3 think, 4 /think, 5 mask.
SPECIAL_TOKENS = (EOS_TOKEN, IM_START, IM_END, THINK, END_THINK, MASK_TOKEN)

# Qwen3 rendering of plain conversations: every message is
#   <|im_start|>{role}\n{content}<|im_end|>\n
# and the generation prompt is <|im_start|>assistant\n, followed by an empty think section
# <think>\n\n</think>\n\n when enable_thinking is false (SDAR's chat evaluation setting).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' ~ message['role'] ~ '\\n' ~ message['content'] ~ '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)


def build_tokenizer(texts: list[str], vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``texts`` (deterministic for a given input)."""
    return train_byte_bpe(
        texts,
        vocab_size,
        SPECIAL_TOKENS,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        mask_token=MASK_TOKEN,
        extra_special_tokens=[IM_START, IM_END, THINK, END_THINK],
        model_max_length=32768,
        chat_template=CHAT_TEMPLATE,
    )
