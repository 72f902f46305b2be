"""A small LLaDA-style tokenizer trained from scratch (for tiny test/demo models).

Byte-level BPE with every digit its own pre-token (so numbers are spelled
digit by digit), the LLaDA special tokens, and LLaDA's chat template.
"""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

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
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=sorted(alphabet),
        show_progress=False,
    )
    core.train_from_iterator(texts, trainer=trainer, length=len(texts))

    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        mask_token=MASK_TOKEN,
        extra_special_tokens=list(_EXTRA_SPECIAL),
        add_bos_token=False,
        add_eos_token=False,
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
        chat_template=LLADA_CHAT_TEMPLATE,
    )
    return tok
