"""A small Gemma-4-style tokenizer trained from scratch, for tiny DiffusionGemma checkpoints.

Byte-level BPE with every digit its own pre-token (:func:`dare_nn.tokenizers.train_byte_bpe`),
the special tokens of the Gemma 4 / DiffusionGemma vocabulary in Gemma's order (``<pad>`` 0,
``<eos>`` 1, ``<bos>`` 2, ``<unk>`` 3, ``<mask>`` 4 — inherited from Gemma, unused by
DiffusionGemma's uniform noise — then the turn, thinking-channel and image markers) and the
Gemma 4 chat template for plain conversations::

    <bos><|turn>system\\n{system}<turn|>\\n<|turn>user\\n{user}<turn|>\\n<|turn>model\\n<|channel>thought\\n<channel|>

(assistant messages are ``model`` turns; the generation prompt opens a ``model`` turn and, unless
``enable_thinking`` is true, an empty thought channel; with ``enable_thinking`` the system turn
starts with ``<|think|>``). Published checkpoints ship Gemma's 262k-token tokenizer and their own
template; this one only has to behave the same for plain conversations.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerFast

from dare_nn.tokenizers import train_byte_bpe

__all__ = ["PAD", "EOS", "BOS", "TURN_START", "TURN_END", "SPECIAL_TOKENS", "CHAT_TEMPLATE", "build_tokenizer"]

PAD, EOS, BOS, UNK, MASK = "<pad>", "<eos>", "<bos>", "<unk>", "<mask>"
TURN_START, TURN_END, THINK = "<|turn>", "<turn|>", "<|think|>"
CHANNEL_START, CHANNEL_END = "<|channel>", "<channel|>"
IMAGE_START, IMAGE_END, IMAGE = "<|image>", "<image|>", "<|image|>"

# Order fixes the ids (0 pad, 1 eos, 2 bos, 3 unk as in Gemma and DiffusionGemmaTextConfig's defaults).
SPECIAL_TOKENS = (
    PAD,
    EOS,
    BOS,
    UNK,
    MASK,
    TURN_START,
    TURN_END,
    THINK,
    CHANNEL_START,
    CHANNEL_END,
    IMAGE_START,
    IMAGE_END,
    IMAGE,
)

CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- set thinking = enable_thinking is defined and enable_thinking -%}"
    "{%- if messages and messages[0]['role'] in ['system', 'developer'] -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{{- '<|turn>system\\n' + ('<|think|>\\n' if thinking else '') + messages[0]['content'] | trim + '<turn|>\\n' -}}"
    "{%- else -%}"
    "{%- set loop_messages = messages -%}"
    "{%- if thinking -%}{{- '<|turn>system\\n<|think|>\\n<turn|>\\n' -}}{%- endif -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{- '<|turn>' + role + '\\n' + message['content'] | trim + '<turn|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|turn>model\\n' -}}"
    "{%- if not thinking -%}{{- '<|channel>thought\\n<channel|>' -}}{%- endif -%}"
    "{%- endif -%}"
)


def build_tokenizer(texts: list[str], vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``texts`` (deterministic for a given input)."""
    return train_byte_bpe(
        texts,
        vocab_size,
        SPECIAL_TOKENS,
        pad_token=PAD,
        eos_token=EOS,
        bos_token=BOS,
        unk_token=UNK,
        mask_token=MASK,
        extra_special_tokens=[TURN_START, TURN_END, THINK, CHANNEL_START, CHANNEL_END, IMAGE_START, IMAGE_END, IMAGE],
        model_max_length=131072,
        chat_template=CHAT_TEMPLATE,
    )
