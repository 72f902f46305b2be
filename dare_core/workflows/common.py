"""Set-up shared by every workflow: model, rollout backend, task, components, optimizer, eval."""

from __future__ import annotations

import math
import os
import random
import sys
import time
from typing import Any, Iterator, Optional, Sequence

import attrs
import torch

from dare_core._version import __version__
from dare_core.components import ComponentLookup
from dare_core.config import RunConfig, to_dict
from dare_core.engines import build_engine
from dare_core.config.structure import structure
from dare_core.errors import ConfigError, DareError
from dare_core.interfaces import Example
from dare_core.ops.paths import configure_training_paths
from dare_core.pairing import compare, describe, paired_counts
from dare_core.rundir import RunDir

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise DareError("model.device=cuda but no CUDA device is available; use model.device=cpu")
    return name


def seed_everything(seed: int) -> torch.Generator:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % (2**32))
    except ImportError:  # pragma: no cover
        pass
    return torch.Generator().manual_seed(seed)


def load_model(dare: Any, config: RunConfig, *, trainable: bool = True):
    """Load the family's checkpoint; with ``model.lora`` (or a LoRA checkpoint as
    ``model.path``) wrap it in PEFT adapters (trainable adapters when ``trainable``)."""
    from dare_core.models import lora

    family = dare.registries.models.get(config.model.family)
    device = resolve_device(config.model.device)
    base_path, saved_adapter = lora.resolve_checkpoint(config.model.path)
    wrapper = family.load(
        base_path,
        dtype=DTYPES[config.model.dtype],
        device=device,
        attn_implementation=config.model.attn_implementation,
    )
    if config.model.gradient_checkpointing:
        wrapper.module.gradient_checkpointing_enable()
    lcfg = config.model.lora
    if lcfg.enabled or saved_adapter is not None:
        lora.apply_lora(wrapper, lcfg, base_path=base_path, adapter=lcfg.adapter or saved_adapter,
                        trainable=trainable, checkpointing=config.model.gradient_checkpointing)
    return wrapper


def build_rollout(dare: Any, config: RunConfig, rollout_cfg: Any = None):
    spec = dare.registries.rollouts.get(config.rollout_backend)
    return spec.build(rollout_cfg if rollout_cfg is not None else config.rollout)


def eval_backend_name(config: RunConfig) -> str:
    """The rollout backend of evaluation: ``eval.backend``, else the training one."""
    return config.eval.backend or config.rollout_backend


def eval_rollout_config(config: RunConfig, dare: Any = None) -> Any:
    """The rollout config used for evaluation: the training one (or, with another
    ``eval.backend``, that backend's defaults plus the fields it shares with the rollout section)
    with eval's temperature and steps (``steps = gen_length`` when ``eval.steps`` is null), where
    the backend has them."""
    name = eval_backend_name(config)
    rc = config.rollout
    if name != config.rollout_backend:
        if dare is None:
            raise ValueError("eval_rollout_config needs the registries when eval.backend differs")
        cls = dare.registries.rollouts.get(name).config_cls
        wanted = {f.name for f in attrs.fields(cls)}
        shared = {f.name: getattr(rc, f.name) for f in attrs.fields(type(rc)) if f.name in wanted}
        rc, problems = structure(cls, shared, "eval rollout")
        if problems:
            raise ConfigError([f"eval.backend={name}: {p}" for p in problems])
    names = {f.name for f in attrs.fields(type(rc))}
    changes: dict[str, Any] = {}
    if "temperature" in names:
        changes["temperature"] = config.eval.temperature
    if "steps" in names:
        steps = config.eval.steps
        if steps is None and "gen_length" in names:
            steps = rc.gen_length
        if steps is not None:
            changes["steps"] = steps
    return attrs.evolve(rc, **changes)


def judged_by_training_rollout(dare: Any, config: RunConfig) -> RunConfig:
    """``config`` with its evaluation set to the sampler the run trains with, as its algorithm
    adjusts it (``Components.rollout_config``, e.g. one token per step, left to right, at the
    algorithm's temperature): the rollout section becomes the adjusted one, ``eval.backend`` is
    cleared and ``eval.steps`` / ``eval.temperature`` are taken from it. An algorithm's
    ``wrap_rollout`` (e.g. a tree of partial states) is training bookkeeping over the same sampler
    and is not applied."""
    if not config.algo:
        raise DareError("judging by the training sampler needs the run's algorithm; pass the run's "
                        "config.yaml (--config) or algo=NAME")
    spec = dare.registries.algorithms.get(config.algo)
    comps = spec.build(config.algorithm, ComponentLookup(dare.registries))
    rc = comps.training_rollout_config(config.rollout)
    names = {f.name for f in attrs.fields(type(rc))}
    changes: dict[str, Any] = {"backend": None}
    if "steps" in names:
        changes["steps"] = rc.steps
    if "temperature" in names:
        changes["temperature"] = rc.temperature
    return attrs.evolve(config, rollout=rc, eval=attrs.evolve(config.eval, **changes))


def build_eval_rollout(dare: Any, config: RunConfig):
    """The evaluation rollout backend (see :func:`eval_rollout_config`)."""
    spec = dare.registries.rollouts.get(eval_backend_name(config))
    return spec.build(eval_rollout_config(config, dare))


def encode_prompts(wrapper: Any, examples: Sequence[Example], max_len: int) -> list[list[int]]:
    out = []
    for ex in examples:
        ids = wrapper.encode(wrapper.render_prompt(ex.prompt))
        if len(ids) > max_len:
            raise DareError(
                f"a prompt has {len(ids)} tokens, more than trainer.max_prompt_length={max_len}; "
                f"raise trainer.max_prompt_length"
            )
        out.append(ids)
    return out


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s) :] = torch.tensor(list(s), dtype=torch.long)
            mask[i, width - len(s) :] = 1
    return ids, mask


def chunks(n: int, size: int) -> Iterator[slice]:
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))


def cycle_batches(items: Sequence[Any], batch_size: int, generator: torch.Generator) -> Iterator[list[Any]]:
    """Endless batches drawn without replacement from a fresh permutation per epoch."""
    if not items:
        raise DareError("the task produced no training examples")
    order: list[int] = []
    while True:
        batch = []
        while len(batch) < batch_size:
            if not order:
                order = torch.randperm(len(items), generator=generator).tolist()
            batch.append(items[order.pop()])
        yield batch


def decode_responses(wrapper: Any, response_ids: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
    texts = []
    for ids, mask in zip(response_ids.tolist(), response_mask.tolist()):
        valid = [t for t, m in zip(ids, mask) if m]
        texts.append(wrapper.decode(valid).strip())
    return texts


def make_optimizer(params, config: RunConfig) -> tuple[torch.optim.Optimizer, Any]:
    tr = config.trainer
    trainable = [p for p in params if p.requires_grad]
    if not trainable:
        raise DareError("the model has no trainable parameters")
    opt = torch.optim.AdamW(
        trainable, lr=tr.lr, betas=(tr.beta1, tr.beta2), eps=tr.adam_eps, weight_decay=tr.weight_decay
    )
    warmup = int(round(tr.warmup_ratio * tr.steps))

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if tr.lr_schedule == "cosine":
            progress = (step - warmup) / max(1, tr.steps - warmup)
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        return 1.0

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def clip_and_step(params, optimizer, max_norm: float) -> tuple[float, bool]:
    """Clip the global grad norm; skip the step (and zero grads) when the norm is not finite."""
    trainable = [p for p in params if p.requires_grad and p.grad is not None]
    if max_norm > 0:
        norm = torch.nn.utils.clip_grad_norm_(trainable, max_norm)
    else:
        norm = torch.linalg.vector_norm(
            torch.stack([p.grad.detach().float().norm() for p in trainable])
        ) if trainable else torch.zeros(())
    finite = bool(torch.isfinite(norm))
    if finite:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(norm), finite


@attrs.define
class Context:
    """Everything one run is made of, built once by :func:`setup`."""

    dare: Any
    config: RunConfig
    spec: Any
    family: Any
    wrapper: Any
    rollout: Any
    eval_rollout: Any
    task: Any
    components: Any
    engine: Any
    rundir: Optional[RunDir]
    generator: torch.Generator
    console: Any = None

    def log(self, message: str) -> None:
        if self.engine.is_main:
            try:
                from tqdm import tqdm

                tqdm.write(message, file=sys.stderr)
            except ImportError:  # pragma: no cover
                print(message, file=sys.stderr, flush=True)


def setup(dare: Any, config: RunConfig, *, rundir: Optional[RunDir] = None) -> Context:
    generator = seed_everything(config.seed)
    spec = dare.registries.algorithms.get(config.algo)
    family = dare.registries.models.get(config.model.family)
    task = dare.registries.tasks.get(config.task.name).build(config.task)
    components = spec.build(config.algorithm, ComponentLookup(dare.registries))
    engine = build_engine(config.engine.name, resolve_device(config.model.device))
    # the samplers need no model: a bad eval rollout config fails before the model is loaded
    rollout = build_rollout(dare, config)
    eval_rollout = build_eval_rollout(dare, config)
    wrapper = load_model(dare, config)
    wrapper.module = engine.wrap(wrapper.module)
    train_paths = configure_training_paths(
        wrapper, config.model.train_attention, config.model.cross_entropy, resolve_device(config.model.device),
        attention_kernel=config.model.attention_kernel)
    if rundir is not None and engine.is_main:
        rundir.write_config(to_dict(config))
        rundir.write_json("plugins.json", {
            "dare_core": __version__,
            "plugins": [i.as_dict() for i in dare.plugin_infos()],
        })
        rundir.write_json("training_paths.json", train_paths.as_dict())
    ctx = Context(dare, config, spec, family, wrapper, rollout, eval_rollout, task, components,
                  engine, rundir, generator)
    ctx.log(train_paths.describe())
    return ctx


def eval_context(dare: Any, config: RunConfig) -> Context:
    """The context of an evaluation without training: model (frozen), eval sampler, task, engine.

    Config errors of the sampler surface before the model is loaded.
    """
    gen = seed_everything(config.seed)
    eval_rollout = build_eval_rollout(dare, config)
    wrapper = load_model(dare, config, trainable=False)
    task = dare.registries.tasks.get(config.task.name).build(config.task)
    engine = build_engine(config.engine.name, resolve_device(config.model.device))
    return Context(dare, config, None, dare.registries.models.get(config.model.family), wrapper,
                   None, eval_rollout, task, None, engine, None, gen)


def evaluate(ctx: Context, examples: Sequence[Example], label: str,
             items: Optional[list[float]] = None) -> dict[str, Any]:
    """Generate for ``examples`` with the eval sampling config and score them.

    Returns ``{"accuracy", "reward", "n", "nfe", "seconds"}`` and writes decoded samples; the
    per-item accuracies of this rank's shard are appended to ``items`` when it is given.
    """
    cfg = ctx.config
    wrapper = ctx.wrapper
    shard = ctx.engine.shard(list(examples))
    prompts = encode_prompts(wrapper, shard, cfg.trainer.max_prompt_length)
    gen = torch.Generator().manual_seed(cfg.seed + 7919)
    accs: list[float] = []
    scores: list[float] = []
    samples: list[dict[str, Any]] = []
    nfe = 0
    start = time.perf_counter()
    device = wrapper.device
    for sl in chunks(len(shard), cfg.eval.batch_size):
        ids, mask = left_pad(prompts[sl], wrapper.pad_token_id)
        roll = ctx.eval_rollout.generate(wrapper, ids.to(device), mask.to(device), generator=gen)
        nfe += roll.nfe
        texts = decode_responses(wrapper, roll.response_ids.cpu(), roll.response_mask.cpu())
        for ex, text in zip(shard[sl], texts):
            s = ctx.task.score(ex, text)
            accs.append(float(s.acc))
            scores.append(float(s.score))
            if len(samples) < cfg.eval.save_samples:
                samples.append({"prompt": ex.prompt[-1]["content"][-200:], "response": text,
                                "ground_truth": ex.ground_truth, "score": s.score, "acc": s.acc})
    seconds = time.perf_counter() - start
    n = len(accs)
    if items is not None:
        items.extend(accs)
    result = ctx.engine.reduce_mean({
        "accuracy": sum(accs) / max(1, n), "reward": sum(scores) / max(1, n),
    })
    result.update({"n": n * ctx.engine.world_size, "nfe": nfe, "seconds": round(seconds, 2)})
    if ctx.rundir is not None and ctx.engine.is_main:
        ctx.rundir.write_json(f"eval_samples/{label}.json", samples)
    return result


def _fmt(record: dict[str, Any]) -> str:
    keys = ("reward", "accuracy", "loss", "grad_norm", "pg_clipfrac", "ppo_kl", "time_rollout",
            "time_update", "time_step")
    parts = [f"step {record['step']}"]
    for k in keys:
        if k in record:
            parts.append(f"{k}={record[k]:.4g}")
    return " ".join(parts)


class Tracker:
    """The bookkeeping every loop shares: evaluation before / every N / after, metric lines,
    the step-end and eval hooks, the progress bar, periodic and final checkpoints."""

    def __init__(self, ctx: Context, eval_examples: Sequence[Example]):
        self.ctx = ctx
        self.eval_examples = eval_examples
        self.summary: dict[str, Any] = {"eval": {}}
        self.bar = None
        self.before_items: Optional[list[float]] = None

    def log(self, record: dict[str, Any]) -> None:
        if self.ctx.rundir is not None and self.ctx.engine.is_main:
            self.ctx.rundir.log_metrics(record)

    def evaluate(self, label: str, step: int) -> dict[str, Any]:
        ctx = self.ctx
        ctx.log(f"evaluating on {len(self.eval_examples)} held-out prompts ({label}) ...")
        was_training = ctx.wrapper.module.training
        items: list[float] = []
        res = evaluate(ctx, self.eval_examples, label, items)
        ctx.wrapper.module.train(was_training)
        line = f"eval {label}: accuracy={res['accuracy']:.3f} reward={res['reward']:.3f}"
        if label == "before":
            self.before_items = items
        elif self.before_items is not None:  # same items, same sampler: a paired comparison
            counts = ctx.engine.reduce_mean(dict(zip(("gained", "lost"), paired_counts(self.before_items, items))))
            res["vs_before"] = compare(*(round(counts[k] * ctx.engine.world_size) for k in ("gained", "lost")),
                                       res["n"])
            line += f" ({describe(res['vs_before'])})"
        ctx.log(line)
        self.log({"step": step, "eval": res})
        if ctx.engine.is_main:
            ctx.dare.pm.hook.dare_on_eval(step=step, label=label, metrics=dict(res))
        return res

    def begin(self) -> None:
        """Evaluate before training (if configured), then show the progress bar."""
        ctx = self.ctx
        cfg = ctx.config
        if cfg.eval.before:
            self.summary["eval"]["before"] = self.evaluate("before", 0)
        if cfg.progress and ctx.engine.is_main:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=cfg.trainer.steps, desc=cfg.algo, unit="step", dynamic_ncols=True)
            except ImportError:  # pragma: no cover
                self.bar = None

    def step_end(self, step: int, record: dict[str, Any], **postfix: str) -> dict[str, Any]:
        ctx = self.ctx
        cfg = ctx.config
        record = ctx.engine.reduce_mean(record)
        self.log(record)
        ctx.dare.pm.hook.dare_on_step_end(step=step, metrics=record)
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(**postfix)
        if step % cfg.trainer.log_every == 0:
            ctx.log(_fmt(record))
        if cfg.eval.every and step % cfg.eval.every == 0 and step != cfg.trainer.steps:
            self.evaluate(f"step-{step}", step)
        if cfg.trainer.save_every and step % cfg.trainer.save_every == 0:
            self.save(f"checkpoints/step-{step}")
        return record

    def save(self, name: str) -> Optional[str]:
        if self.ctx.rundir is None or not self.ctx.engine.is_main:
            return None
        from dare_core.config.loader import PRESET_FILE

        # a saved model keeps the run presets of the checkpoint it started from
        preset = os.path.join(str(self.ctx.config.model.path), PRESET_FILE)
        from dare_core.models import lora

        if lora.is_lora(self.ctx.wrapper):  # the adapter (PEFT layout), merged weights on request
            merge = self.ctx.config.model.lora.merge_on_save
            return self.ctx.rundir.save_model(
                self.ctx.wrapper, name, extra_files=(preset,),
                writer=lambda w, tmp: lora.save_checkpoint(w, tmp, merge=merge))
        return self.ctx.rundir.save_model(self.ctx.wrapper, name, extra_files=(preset,))

    def finish(self, train_summary: dict[str, Any]) -> dict[str, Any]:
        cfg = self.ctx.config
        if self.bar is not None:
            self.bar.close()
        if cfg.eval.after:
            self.summary["eval"]["after"] = self.evaluate("after", cfg.trainer.steps)
        if cfg.trainer.save_final:
            self.summary["final_checkpoint"] = self.save("final")
        self.summary["train"] = train_summary
        return self.summary
