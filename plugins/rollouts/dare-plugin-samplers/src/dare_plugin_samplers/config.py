"""The rollout backends' configs (the ``rollout:`` section) and what each can record, importable
without torch: the plugin registers them without importing the samplers."""

from __future__ import annotations

import attrs

import dare_nn.sampling as common
from dare_core.api import in_range, non_negative, one_of, option, positive

#: values of the backends' ``graphs`` field
GRAPHS = ("auto", "eager", "static", "cuda_graph", "compile")
GRAPHS_HELP = (
    "How the cached decode steps run: 'eager' = eager PyTorch; 'static' = the static-shape steps "
    "(preallocated KV buffers, fixed query shapes, no host synchronisation inside a block) run "
    "as plain PyTorch; 'cuda_graph' = those steps captured once as CUDA graphs and replayed "
    "(CUDA only); 'compile' = those steps through torch.compile (mode reduce-overhead on CUDA); "
    "'auto' = cuda_graph on a CUDA device, eager elsewhere and for modules with forward hooks "
    "(sharding engines); static, with a warning, for a model whose forward synchronises with the "
    "host."
)

#: the optional methods of LowConfidenceSampler and BlockSampler: resuming partial responses
RESUMABLE = frozenset({"continue_from", "total_steps"})


#: Records :meth:`LowConfidenceSampler.generate` understands.
LOW_CONFIDENCE_RECORDS = frozenset({"reveal_step", "step_states"})


@attrs.frozen
class LowConfidenceConfig(common.BlockCounts):
    """Config of the ``low_confidence`` rollout backend (the ``rollout:`` section)."""

    gen_length: int = common.gen_length_option()
    block_length: int = common.block_length_option("block_length = gen_length denoises the whole response at once.")
    steps: int = common.steps_option(
        128,
        "Total number of denoising steps, split equally over the blocks; must be a multiple "
        "of gen_length // block_length.",
    )
    temperature: float = common.temperature_option()
    remasking: str = common.remasking_option(
        "Which masked positions are committed each step: 'low_confidence' = the candidates with "
        "the highest (untempered) probability; 'random' = uniformly random ones."
    )
    cfg_scale: float = option(
        0.0,
        "Classifier-free guidance scale s: logits = un + (s + 1) * (cond - un), with the "
        "unconditional pass seeing the prompt replaced by MASK; 0 = off (one forward per step "
        "instead of two).",
        non_negative,
    )
    suppress_eos: bool = common.suppress_eos_option(
        " (the response is then only EOS-filled where MASKs are left at the end)."
    )
    stop_confidence: str = common.stop_confidence_option(
        "'zero' = 0 (stop tokens committed late); 'never' = -inf (ranked last: committed only when "
        "a row's quota cannot be met otherwise)."
    )
    truncate_at_eos: bool = common.truncate_at_eos_option()
    micro_batch_size: int = common.micro_batch_size_option(
        ". Chunking changes how the random stream is consumed (sampled outputs differ; greedy ones do not)."
    )

    def __attrs_post_init__(self) -> None:
        common.check_gen_length_blocks(self.gen_length, self.block_length)
        num_blocks = self.gen_length // self.block_length
        if self.steps % num_blocks != 0:
            raise ValueError(
                f"rollout.steps ({self.steps}) must be a multiple of the number of blocks "
                f"rollout.gen_length // rollout.block_length = {self.gen_length} // "
                f"{self.block_length} = {num_blocks}, so that every block gets the same number "
                f"of steps; set steps to a multiple of {num_blocks} "
                f"(e.g. {common.multiple_hint(self.steps, num_blocks)}) or change block_length"
            )


#: Records :meth:`FastSampler.generate` understands.
FAST_RECORDS = frozenset({"reveal_step"})

_CACHE = ("dual", "delayed", "prefix", "none")
#: the caches whose steps have fixed shapes (the static path of ``graphs``)
STATIC_CACHES = ("dual", "none")
_DECODING = ("threshold", "quota")


@attrs.frozen
class FastConfig(common.BlockCounts):
    """Config of the ``fast`` rollout backend (the ``rollout:`` section)."""

    gen_length: int = common.gen_length_option()
    block_length: int = common.block_length_option("The KV cache is refreshed once per block.")
    steps: int = common.steps_option(
        256,
        "decoding 'quota': total denoising steps, split equally over the blocks (a multiple "
        "of gen_length // block_length; steps = gen_length commits one token per step). Ignored "
        "by decoding 'threshold'.",
    )
    cache: str = option(
        "dual",
        "KV reuse inside a block: 'dual' = cache the positions before and after the "
        "block, recompute only the block; 'delayed' = dual, and also cache committed block "
        "tokens once encoded (one step after their commit), recomputing only masked and "
        "just-committed positions; 'prefix' = cache the positions before the block, recompute "
        "the block and everything after it; 'none' = full forward every step.",
        one_of(_CACHE),
    )
    refresh_every: int = option(
        0,
        "With a cache, also rerun the full forward (refreshing every cached key) every this "
        "many steps inside a block; 0 = only at the block start. Trades speed for exactness in "
        "long blocks.",
        non_negative,
    )
    decoding: str = option(
        "threshold",
        "How many tokens a step commits: 'threshold' = every masked position of the "
        "block with confidence >= threshold, at least the most confident one per row; 'quota' = "
        "the reference quota schedule of `steps`.",
        one_of(_DECODING),
    )
    threshold: float = option(
        0.9,
        "decoding 'threshold': commit masked positions whose candidate probability is >= "
        "this (0 < threshold <= 1; 1.0 = one token per step unless the model is certain).",
        in_range(0.0, 1.0, low_open=True),
    )
    temperature: float = common.temperature_option()
    remasking: str = common.remasking_option(
        "decoding 'quota': 'low_confidence' commits the most probable candidates, 'random' "
        "uniformly random masked positions. Threshold decoding needs 'low_confidence'."
    )
    suppress_eos: bool = common.suppress_eos_option()
    stop_confidence: str = common.stop_confidence_option(
        "'zero' = 0 (committed late); 'never' = -inf (ranked last: committed only when nothing else is left)."
    )
    truncate_at_eos: bool = common.truncate_at_eos_option()
    micro_batch_size: int = common.micro_batch_size_option(
        " (sampled outputs depend on the chunking, greedy ones do not)."
    )
    graphs: str = option(
        "auto",
        GRAPHS_HELP + " Static steps need cache 'dual' or 'none' (auto: the other caches run eager).",
        one_of(GRAPHS),
    )

    def __attrs_post_init__(self) -> None:
        common.check_gen_length_blocks(self.gen_length, self.block_length)
        if self.graphs not in ("auto", "eager") and self.cache not in STATIC_CACHES:
            raise ValueError(
                f"rollout.graphs '{self.graphs}' needs fixed step shapes, which cache "
                f"'{self.cache}' does not have (its queries change width); set cache to "
                f"{' or '.join(STATIC_CACHES)}, or graphs to auto or eager"
            )
        if self.decoding == "quota" and self.steps % self.num_blocks != 0:
            raise ValueError(
                f"rollout.steps ({self.steps}) must be a multiple of the number of blocks "
                f"gen_length // block_length = {self.num_blocks} with decoding 'quota'; set steps "
                f"to e.g. {common.multiple_hint(self.steps, self.num_blocks)}"
            )
        if self.decoding == "threshold" and self.remasking != "low_confidence":
            raise ValueError(
                "rollout.decoding 'threshold' compares model confidences, so rollout.remasking "
                "must be 'low_confidence'; set remasking=low_confidence or decoding=quota"
            )


#: Records :meth:`BlockSampler.generate` understands.
BLOCK_RECORDS = frozenset({"reveal_step"})
BLOCK_REMASKING = ("sequential", "low_confidence_static", "low_confidence_dynamic", "entropy_bounded")


@attrs.frozen
class BlockRolloutConfig:
    """Config of the ``block`` rollout backend (the ``rollout:`` section)."""

    gen_length: int = option(256, "Response length R: tokens generated after each prompt.", positive)
    block_length: int = option(
        0,
        "Block size of the denoising loop; 0 = the model's own block size (wrapper.block_size), "
        "the one it was trained with.",
        non_negative,
    )
    steps: int = option(
        4,
        "Denoising iterations per block (the reveal schedule spreads block_length tokens over "
        "them; more steps than block_length reveal one token per step).",
        positive,
    )
    temperature: float = option(
        1.0, "Sampling temperature of the candidates (softmax(logits / T)); 0 = greedy argmax.", non_negative
    )
    top_k: int = option(0, "Sample only among the k most likely tokens; 0 = off.", non_negative)
    top_p: float = option(
        1.0,
        "Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p (at least one); 1 = off.",
        in_range(0.0, 1.0, low_open=True),
    )
    remasking: str = option(
        "low_confidence_dynamic",
        "Which masked positions are revealed each iteration: "
        "'sequential' (leftmost), 'low_confidence_static' (most confident, scheduled count), "
        "'low_confidence_dynamic' (all above confidence_threshold if at least the scheduled count, "
        "else the most confident), 'entropy_bounded' (lowest-entropy prefix within eb_threshold).",
        one_of(BLOCK_REMASKING),
    )
    confidence_threshold: float = option(
        0.85, "Confidence above which low_confidence_dynamic reveals a token.", in_range(0.0, 1.0)
    )
    eb_threshold: float = option(
        0.35,
        "Entropy budget of entropy_bounded: reveal the lowest-entropy positions while their "
        "entropy sum minus the largest one stays within it.",
        non_negative,
    )
    use_cache: bool = option(
        True,
        "Keep finished blocks in the KV cache (prefill + one commit forward per block); "
        "false recomputes the whole prefix every iteration (same greedy tokens, slower).",
    )
    stop_at_stop_token: bool = option(
        True,
        "Stop decoding a row after the block in which one of the model's stop tokens "
        "appears; its remaining positions are filled with EOS.",
    )
    truncate_at_eos: bool = option(
        True,
        "Response mask rule: true = positions up to and including the first stop token "
        "count; false = every generated position counts.",
    )
    graphs: str = option("auto", GRAPHS_HELP + " Static steps need use_cache (auto without it: eager).", one_of(GRAPHS))

    def __attrs_post_init__(self) -> None:
        if self.graphs not in ("auto", "eager") and not self.use_cache:
            raise ValueError(
                f"rollout.graphs '{self.graphs}' runs the cached steps, so it needs "
                f"rollout.use_cache=true; set use_cache=true or graphs to auto or eager"
            )
