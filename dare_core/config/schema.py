"""The run configuration: frozen attrs classes with help text on every field.

The ``algorithm:`` and ``rollout:`` sections are structured with the config classes of the chosen
algorithm and rollout backend (see :mod:`dare_core.config.loader`), plugin-owned top-level
sections with the classes their plugins register (held in ``RunConfig.sections``); all other
sections are defined here.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

import attrs

from dare_core.config.validators import in_range, non_negative, one_of, positive
from dare_core.errors import DareError


def option(default: Any, help: str, validator: Any = None, **kw: Any) -> Any:
    """An attrs field with help text (``metadata["help"]``)."""
    if isinstance(default, (list, dict, set)):
        raise TypeError("use option_factory for mutable defaults")
    return attrs.field(default=default, validator=validator, metadata={"help": help}, **kw)


def section(cls: type, help: str) -> Any:
    return attrs.field(factory=cls, metadata={"help": help})


def _target_modules(_inst: Any, attr: Any, value: Any) -> None:
    if value is not None and (not value or any(not str(v).strip() for v in value)):
        raise ValueError(
            f"{attr.name} must be null (the family's default) or a non-empty list of module names, got {list(value)!r}"
        )


def signal_names(_inst: Any, attr: Any, value: Any) -> None:
    import signal

    unknown = [v for v in value if not isinstance(getattr(signal, str(v), None), signal.Signals)]
    if unknown:
        raise ValueError(f"{attr.name}: {unknown[0]!r} is not a signal name; use names such as SIGTERM, SIGUSR1")


def _rank(_inst: Any, attr: Any, value: Any) -> None:
    if value is not None and value <= 0:
        raise ValueError(f"{attr.name} must be a positive integer (null = no LoRA), got {value!r}")


@attrs.frozen
class LoRAConfig:
    """Low-rank adapters (PEFT LoRA) on the model; off unless ``rank`` or ``adapter`` is set."""

    rank: Optional[int] = option(
        None, "LoRA rank r; null = no LoRA (full fine-tuning) unless an adapter is loaded.", _rank
    )
    alpha: float = option(16.0, "LoRA scaling numerator (the update is scaled by alpha / rank).", positive)
    dropout: float = option(0.0, "Dropout on the LoRA input (training mode only).", in_range(0.0, 1.0, high_open=True))
    target_modules: Optional[tuple[str, ...]] = option(
        None,
        "Module names (suffixes) to adapt; null = the model family's default "
        "(wrapper.lora_target_modules), else every linear layer except the output head.",
        _target_modules,
    )
    adapter: Optional[str] = option(
        None,
        "Load this saved adapter (a PEFT adapter directory, or a run checkpoint holding "
        "lora_adapter/) instead of creating a new one; training continues it.",
    )
    merge_on_save: bool = option(
        False, "Also write the merged full model (HF layout) next to the adapter in checkpoints."
    )

    @property
    def enabled(self) -> bool:
        return self.rank is not None or self.adapter is not None


@attrs.frozen
class ModelConfig:
    family: str = option("", "Model family (a registered model plugin, e.g. the one given by --model).")
    path: Optional[str] = option(
        None, "Checkpoint directory in HF layout; null = the family's bundled tiny checkpoint."
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = option(
        "auto",
        "Dtype the weights are loaded and exported in (the precision policy keeps fp32 master "
        "weights where it needs them); auto = the checkpoint's (config.json's dtype, float32 "
        "when it names none).",
    )
    device: Literal["auto", "cpu", "cuda"] = option("auto", "Device; auto = cuda when available, else cpu.")
    attn_implementation: Optional[str] = option(
        None, "Attention implementation passed to the model (eager, sdpa); null = model default."
    )
    gradient_checkpointing: bool = option(False, "Recompute activations in backward to save memory.")
    train_attention: Literal["auto", "padded", "packed"] = option(
        "auto",
        "Training attention path: packed = valid tokens of a micro-batch packed into rows "
        "with document masks (no padding computed); padded = padded rows; auto = packed "
        "when the model supports it. Independent of the rollout path.",
    )
    attention_kernel: Literal["auto", "sdpa_mask", "flex", "varlen", "flash_attn"] = option(
        "auto",
        "Kernel of the packed training path: sdpa_mask = SDPA with a block-diagonal boolean "
        "mask (every device); flex = FlexAttention with a BlockMask (CUDA); varlen = torch's "
        "varlen_attn (CUDA, bf16/fp16); flash_attn = the flash-attn package (CUDA, bf16/fp16, "
        "when installed); auto = sdpa_mask (the fastest measured).",
    )
    cross_entropy: Literal["auto", "fused", "naive"] = option(
        "auto",
        "Training cross entropy: fused = logits-free, chunked over tokens from hidden states "
        "(never builds [tokens, vocab] logits); naive = full logits; auto = fused when the "
        "model exposes forward_hidden.",
    )
    lora: LoRAConfig = section(LoRAConfig, "LoRA adapters (PEFT); off by default.")


@attrs.frozen
class TrainerConfig:
    steps: int = option(20, "Number of training steps (RL: rollout batches; SFT: optimizer steps).", positive)
    lr: float = option(5e-7, "AdamW learning rate.", positive)
    weight_decay: float = option(0.01, "AdamW weight decay.", non_negative)
    beta1: float = option(0.9, "AdamW beta1.", in_range(0.0, 1.0, high_open=True))
    beta2: float = option(0.999, "AdamW beta2.", in_range(0.0, 1.0, high_open=True))
    adam_eps: float = option(1e-8, "AdamW epsilon.", positive)
    lr_schedule: Literal["constant", "cosine"] = option("constant", "Learning-rate schedule after warmup.")
    warmup_ratio: float = option(0.0, "Fraction of the steps used for linear warmup.", in_range(0.0, 1.0))
    grad_clip: float = option(
        1.0, "Global L2 gradient-norm clip; 0 disables. Non-finite norms skip the step.", non_negative
    )
    batch_size: int = option(
        16,
        "RL: prompts per step; SFT: sequences per optimizer step. The global batch: split evenly over the processes of a distributed engine.",
        positive,
    )
    group_size: int = option(8, "RL: rollouts per prompt (the advantage group).", positive)
    ppo_epochs: int = option(1, "RL: passes over each rollout batch.", positive)
    mini_batch_size: int = option(
        0, "RL: sequences per optimizer step within an epoch; 0 = the whole rollout batch.", non_negative
    )
    micro_batch_size: int = option(8, "Sequences per forward/backward pass (gradient accumulation).", positive)
    rollout_batch_size: int = option(
        0,
        "RL: prompts per generate call (each with its group); 0 = all of a process's prompts at "
        "once. Each call's random draws are keyed by its first prompt's place in the global "
        "batch, so with a value that divides the per-process batch the rollouts do not depend "
        "on the number of processes.",
        non_negative,
    )
    reuse_logprob: bool = option(
        True,
        "RL: when each rollout batch gets exactly one optimizer step (ppo_epochs=1 and "
        "mini_batch_size 0 or >= the batch), take the old log-likelihoods from the update's own "
        "forward (detached) instead of a separate no-grad pass: the same values (ratio 1), one "
        "forward pass over the batch less per step. Losses that run their own Monte-Carlo "
        "backward passes (accumulate) get the separate pass unless they declare computes_own_old.",
    )
    max_prompt_length: int = option(512, "Prompts longer than this (in tokens) are an error.", positive)
    max_response_length: int = option(512, "SFT: responses are truncated to this many tokens.", positive)
    log_every: int = option(1, "Print a metrics line every N steps.", positive)
    save_every: int = option(0, "Save a checkpoint every N steps; 0 = only the final one.", non_negative)
    save_final: bool = option(True, "Save the final model in HF layout under <run>/final.")
    resume: Optional[str] = option(
        None,
        "Continue a run from a training checkpoint (written every save_every steps): auto = "
        "the latest complete one in this run's directory (needs run_name; starts fresh when "
        "there is none), or a checkpoint path (<run>/checkpoints/step-N).",
    )
    keep_last: int = option(0, "Keep only the newest N step checkpoints; 0 = keep all.", non_negative)
    stop_signals: tuple[str, ...] = option(
        ("SIGTERM", "SIGUSR1"),
        "Signals that stop the run cleanly: every rank finishes its step, a training checkpoint is "
        "written and the run exits with status 75 (trainer.resume=auto continues it); [] = none.",
        signal_names,
    )
    max_nonfinite_steps: int = option(
        3,
        "Stop the run with an error after this many consecutive steps whose loss or gradient "
        "norm is not finite (each is reported on the console; a non-finite gradient skips the update).",
        positive,
    )


@attrs.frozen
class TaskConfig:
    """Which task (dataset + reward rule) a run uses, and where its data comes from."""

    name: str = option("sudoku", "Task name (a registered task; `dare list tasks` shows them).")
    train_path: Optional[str] = option(
        None,
        "Training data: a verl-schema .parquet or .jsonl file; null = the task's bundled train split; "
        "generated = generated puzzles (sudoku, countdown).",
    )
    eval_path: Optional[str] = option(
        None, "Held-out data: a verl-schema .parquet or .jsonl file; null = the task's bundled test set."
    )
    num_eval: int = option(200, "Number of held-out items evaluated (the first N of the eval set).", positive)
    reward: str = option(
        "score",
        "The RL reward: score = the task's own reward (partial credit where the task defines "
        "it, e.g. the fraction of Sudoku cells filled correctly), acc = exact correctness (1 "
        "or 0). Partial credit can reinforce near misses: on the bundled Sudoku checkpoints a "
        "policy-gradient step on the cell reward lowers the exact-solve rate "
        "(docs/results.md). Evaluations always report both.",
        one_of(("score", "acc")),
    )
    seed: int = option(0, "Seed of the generated training items (sudoku/countdown).")


@attrs.frozen
class EvalConfig:
    before: bool = option(True, "Evaluate held-out accuracy before training.")
    after: bool = option(True, "Evaluate held-out accuracy after training.")
    every: int = option(0, "Also evaluate every N steps; 0 = never.", non_negative)
    temperature: float = option(0.0, "Sampling temperature for evaluation (0 = greedy).", non_negative)
    steps: Optional[int] = option(
        None, "Denoising steps for evaluation; null = one token per step (steps = gen_length)."
    )
    batch_size: int = option(64, "Prompts per evaluation generate call.", positive)
    save_samples: int = option(20, "Write this many decoded eval samples to the run directory.", non_negative)
    backend: Optional[str] = option(
        None,
        "Rollout backend of the held-out evaluation; null = the training rollout backend. "
        "Its fields shared with the rollout section (gen_length, block_length, ...) are taken "
        "from there, so a run can roll out with an accelerated backend and still evaluate with "
        "the reference sampler.",
    )


@attrs.frozen
class EngineConfig:
    name: str = option(
        "single",
        "How a step runs: a registered engine (`dare list engines`); "
        "single = one process; distributed engines run one process per device, "
        "started by torchrun (docs/engines.md).",
    )
    precision: Literal["auto", "fp32", "bf16-mixed", "bf16"] = option(
        "auto",
        "Training precision, independent of model.dtype (how weights are stored and "
        "exported): fp32; bf16-mixed = bf16 compute with fp32 master weights and optimizer "
        "state; bf16 = bf16 weights with a compensated update (engine.bf16_update); "
        "auto = bf16-mixed on CUDA, fp32 on the CPU.",
    )
    bf16_update: Literal["none", "kahan", "stochastic"] = option(
        "none",
        "precision=bf16 only: kahan = keep each weight's rounding error in a bf16 buffer "
        "added to the next step; stochastic = round the fp32 result up or down at random "
        "(unbiased); none refuses precision=bf16 (small updates would be lost).",
    )
    timeout: float = option(
        1800.0,
        "Seconds a collective of a distributed engine waits for every rank before the run "
        "stops with an error (torch.distributed's process-group timeout; NCCL's own default "
        "is 600).",
        positive,
    )


@attrs.frozen
class RunConfig:
    algo: str = option("", "Algorithm (a registered algorithm plugin, e.g. given by --algo).")
    seed: int = option(0, "Seed of every random stream of the run.")
    output_dir: str = option("runs", "Parent directory of run directories.")
    run_name: Optional[str] = option(None, "Run directory name; null = <algo>-<model>-<timestamp>.")
    progress: bool = option(True, "Show a progress bar on the console.")
    model: ModelConfig = section(ModelConfig, "The model to train.")
    trainer: TrainerConfig = section(TrainerConfig, "Optimisation and batching.")
    task: TaskConfig = section(TaskConfig, "Dataset and reward.")
    eval: EvalConfig = section(EvalConfig, "Held-out evaluation.")
    engine: EngineConfig = section(EngineConfig, "Execution engine.")
    algorithm: Any = section(dict, "Algorithm options (the algorithm plugin's config class).")
    rollout: Any = section(dict, "Rollout backend options; `backend` picks the backend (null = the model's default).")
    rollout_backend: str = option("", "Resolved rollout backend name (set from rollout.backend).")
    train_rollout: Any = section(
        dict, "Resolved: the rollout config RL trains with (rollout as the algorithm's RolloutNeeds.adjust gives it)."
    )
    eval_rollout: Any = section(
        dict, "Resolved: the rollout config of evaluation (eval.backend's, at eval.temperature and eval.steps)."
    )
    sections: dict[str, Any] = section(
        dict,
        "Plugin-owned sections (registered with dare_register_config_sections), "
        "each a top-level key of the config; read one with plugin_section(name).",
    )

    def plugin_section(self, name: str, cls: Optional[type] = None) -> Any:
        """The resolved plugin-owned section ``name`` (an instance of its registered class).

        A config resolved while the owning plugin was not registered holds no such section:
        then ``cls()`` (the section's defaults) when ``cls`` is given, else a one-line
        :class:`~dare_core.errors.DareError`.
        """
        if name in self.sections:
            return self.sections[name]
        if cls is not None:
            return cls()
        raise DareError(
            f"the run config has no section {name!r} (it has: "
            f"{', '.join(sorted(self.sections)) or 'none'}); resolve the config with "
            f"the plugin that registers {name!r} installed"
        )
