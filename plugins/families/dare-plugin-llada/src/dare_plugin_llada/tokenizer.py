"""A small LLaDA-style tokenizer trained from scratch (for tiny test/demo models).

Byte-level BPE with every digit its own pre-token (so numbers are spelled
digit by digit), the LLaDA special tokens, and LLaDA's chat template.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerFast

from dare_nn.tokenizers import train_byte_bpe

__all__ = [
    "BOS_TOKEN",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "MASK_TOKEN",
    "SPECIAL_TOKENS",
    "LLADA_CHAT_TEMPLATE",
    "build_tokenizer",
]

BOS_TOKEN = "<|startoftext|>"
EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = EOS_TOKEN
MASK_TOKEN = "<|mdm_mask|>"
START_HEADER = "<|start_header_id|>"
END_HEADER = "<|end_header_id|>"
EOT_TOKEN = "<|eot_id|>"
ROLE_OPEN = "<role>"
ROLE_CLOSE = "</role>"

# Order fixes the ids: 0 bos, 1 eos/pad, 2 mask, 3.. the rest.
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, MASK_TOKEN, START_HEADER, END_HEADER, EOT_TOKEN, ROLE_OPEN, ROLE_CLOSE)
_EXTRA_SPECIAL = [START_HEADER, END_HEADER, EOT_TOKEN, ROLE_OPEN, ROLE_CLOSE]

# LLaDA's template: every message is
#   <|start_header_id|>{role}<|end_header_id|>\n\n{content|trim}<|eot_id|>
# the first one preceded by <|startoftext|>, and the assistant header is always
# appended (add_generation_prompt is ignored, as in the published template).
LLADA_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if loop.first -%}{{- '<|startoftext|>' -}}{%- endif -%}"
    "{{- '<|start_header_id|>' ~ message['role'] ~ '<|end_header_id|>\\n\\n' -}}"
    "{{- message['content'] | trim -}}"
    "{{- '<|eot_id|>' -}}"
    "{%- endfor -%}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}"
)


def build_tokenizer(texts: list[str], vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``texts`` (deterministic for a given input).

    ``len(tokenizer) <= vocab_size``: the 8 special tokens take ids 0-7, then the
    256 byte symbols, then merges learnt from ``texts`` (fewer when the corpus is
    too small to support more merges).
    """
    return train_byte_bpe(
        texts,
        vocab_size,
        SPECIAL_TOKENS,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        mask_token=MASK_TOKEN,
        extra_special_tokens=list(_EXTRA_SPECIAL),
        model_max_length=4096,
        chat_template=LLADA_CHAT_TEMPLATE,
    )
