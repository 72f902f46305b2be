"""Random DiffusionGemma checkpoints for the engine checks that need a GPU: the opt-in engine test
(``tests/test_vllm_engine.py``) and the throughput comparison (``scripts/device/vllm_check.py``).
Imports transformers and torch when called, never at import time.
"""

from __future__ import annotations

from typing import Any, Optional

#: a tiny text model: 2 layers (sliding, full), hidden 64, 4 experts routed top-2, vocabulary 512
TINY = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    global_head_dim=64,
    num_global_key_value_heads=1,
    max_position_embeddings=1024,
    sliding_window=16,
    num_experts=4,
    top_k_experts=2,
    moe_intermediate_size=32,
    num_hidden_layers=2,
)
#: the text shape of google/diffusiongemma-26B-A4B-it (its config.json); the depth is the caller's
REAL_26B_A4B = dict(
    vocab_size=262144,
    hidden_size=2816,
    intermediate_size=2112,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=256,
    global_head_dim=512,
    num_global_key_value_heads=2,
    max_position_embeddings=131072,
    sliding_window=1024,
    num_experts=128,
    top_k_experts=8,
    moe_intermediate_size=704,
    num_hidden_layers=30,
)
#: the smallest vision tower the config accepts (the engine runs text only and skips it)
VISION = dict(
    model_type="gemma4_vision",
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=16,
)
SHAPES = {"tiny": TINY, "26b-a4b": REAL_26B_A4B}


def diffusion_gemma_config(shape: str = "tiny", *, canvas_length: int = 8, num_layers: Optional[int] = None) -> Any:
    """A ``DiffusionGemmaConfig`` of ``shape`` (``tiny`` or ``26b-a4b``) with ``num_layers`` layers
    (the shape's own by default) in the published 5 sliding : 1 full pattern, ending with a full
    layer; special token ids inside the vocabulary (pad 0, EOS 1, BOS 2)."""
    from transformers import DiffusionGemmaConfig

    text = dict(SHAPES[shape])
    n = num_layers or text["num_hidden_layers"]
    kinds = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(n)]
    kinds[-1] = "full_attention"
    text.update(num_hidden_layers=n, layer_types=kinds, pad_token_id=0, eos_token_id=1, bos_token_id=2)
    special = dict(boi_token_id=3, eoi_token_id=4, image_token_id=5) if shape == "tiny" else {}
    return DiffusionGemmaConfig(text_config=text, vision_config=dict(VISION), canvas_length=canvas_length, **special)


def random_model(config: Any, seed: int, dtype: Any = None, device: Any = "cpu") -> Any:
    """A randomly initialised ``DiffusionGemmaForBlockDiffusion`` (``torch.manual_seed(seed)``)."""
    import torch
    from transformers import DiffusionGemmaForBlockDiffusion

    torch.manual_seed(seed)
    with torch.device(device):
        model = DiffusionGemmaForBlockDiffusion(config)
    return model.to(dtype=dtype or torch.float32).eval()


class CheckpointPolicy:
    """The members of a model wrapper the vllm backend reads, over a bare HF model: ``family``,
    ``module``, ``stop_token_ids``, ``pad_token_id``, ``device`` and ``save_pretrained``."""

    family = "diffusiongemma"

    def __init__(self, module: Any, stop_token_ids: tuple[int, ...] = (1,), pad_token_id: int = 0):
        self.module, self.stop_token_ids, self.pad_token_id = module, tuple(stop_token_ids), pad_token_id

    @property
    def device(self) -> Any:
        return next(self.module.parameters()).device

    def save_pretrained(self, path: str, state_dict: Optional[dict] = None) -> None:
        self.module.save_pretrained(path, state_dict=state_dict)
