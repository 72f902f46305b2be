"""A small Dream-style (Qwen2) tokenizer trained from scratch, for tiny test/demo models.

Byte-level BPE with every digit its own pre-token (Qwen2's pre-tokenizer splits numbers into
single digits too), the Dream special tokens and Dream's (Qwen2.5) chat template. As in the
published tokenizer the special tokens come after the learnt vocabulary; their ids are read
back from the tokenizer, never assumed.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerFast

from dare_nn.tokenizers import train_byte_bpe

__all__ = [
    "EOS_TOKEN",
    "PAD_TOKEN",
    "BOS_TOKEN",
    "MASK_TOKEN",
    "IM_START",
    "IM_END",
    "SPECIAL_TOKENS",
    "DREAM_CHAT_TEMPLATE",
    "DEFAULT_SYSTEM_PROMPT",
    "build_tokenizer",
]

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = EOS_TOKEN
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
BOS_TOKEN = "<|beginoftext|>"
MASK_TOKEN = "<|mask|>"
# The published order (151643 .. 151666 for the ones Dream uses).
SPECIAL_TOKENS = (EOS_TOKEN, IM_START, IM_END, BOS_TOKEN, MASK_TOKEN)
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."

# Qwen2.5's template without the tool-calling branches: a default system turn when the first
# message is not a system message, then <|im_start|>{role}\n{content}<|im_end|>\n per message,
# and <|im_start|>assistant\n when add_generation_prompt is set.
DREAM_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' -%}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>system\\n" + DEFAULT_SYSTEM_PROMPT + "<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if not (loop.first and message['role'] == 'system') -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def build_tokenizer(texts: list[str], vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``texts`` (deterministic for a given input).

    ``len(tokenizer) <= vocab_size``: 256 byte symbols, merges learnt from ``texts``, then the
    five Dream special tokens.
    """
    return train_byte_bpe(
        texts,
        vocab_size,
        SPECIAL_TOKENS,
        specials_last=True,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        mask_token=MASK_TOKEN,
        extra_special_tokens=[IM_START, IM_END],
        model_max_length=131072,
        chat_template=DREAM_CHAT_TEMPLATE,
    )
