"""The ``vllm`` rollout backend: DiffusionGemma rollouts in vLLM's offline engine (``vllm.LLM``).

What it does (the vLLM 0.32 API it relies on is listed in docs/vllm.md):

1. **Start, at the first** ``generate``. The policy is exported in HF layout (LoRA adapters merged
   into a copy) to a temporary directory; the sampler settings vLLM's DiffusionGemma reads from its
   ``generation_config.json`` (:data:`SAMPLER_KEYS`) that the export leaves unset are filled with
   transformers' defaults, the ones the model's own ``generate`` applies then. The engine starts
   from it in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) with
   ``diffusion_config={"canvas_length": N}``, ``N`` the model config's ``canvas_length``, the
   language model only (no vision tower) and no tokenizer (token ids in and out); under torchrun
   each rank runs its own engine on its GPU (``distributed_executor_backend="external_launcher"``).
   Backends of one policy with the same engine settings (the training and the evaluation
   rollout) share one engine.
2. **Generate.** Each left-padded prompt row becomes a token-id prompt (padding removed), with
   ``max_tokens = gen_length``, the wrapper's ``stop_token_ids`` as the only stop tokens (the
   tokenizer's EOS is not added: ``ignore_eos``) and, with ``logprobs``, the
   log-probability of each emitted token. vLLM refuses per-request seeds and temperatures for
   diffusion models (the temperature schedule is the checkpoint's); with ``reseed`` one seed per
   call, drawn from ``generator``, reseeds the engine's torch random streams (the canvas noise,
   the Gumbel draws and the renoising all come from them), inside a fork of this process's streams
   so the trainer's own draws are untouched.
3. **Back to a** :class:`~dare_core.interfaces.RolloutBatch`: responses right-padded to
   ``gen_length`` with the pad token (also after a stop token), ``response_mask`` up to and
   including the first stop token (the generated length when there is none),
   ``extras["engine_logprobs"]`` ``[B, R]`` float (0 outside the generated tokens). ``nfe`` and
   ``num_steps`` are 0: the engine does not report its forward count.
4. **Weight sync** (``RolloutSpec.sync = "state"``): :meth:`VLLMRollout.load_weights` hands copies
   of the ``(name, tensor)`` pairs to every worker's ``reload_weights`` (in-place, checkpoint names) and
   drops the engine's prefix cache, whose keys were computed with the old weights. Before the
   engine exists there is nothing to do: it starts from the then-current policy.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import importlib.util
import json
import math
import os
import shutil
import sys
import tempfile
import weakref
from typing import Any, Callable, Iterable, Optional, Sequence

import attrs
import torch

from dare_core.api import CapabilityError, DareError, RolloutBatch
from dare_plugin_vllm.config import VLLMRolloutConfig

__all__ = [
    "VLLMRollout",
    "Engine",
    "require_vllm",
    "check_process",
    "prompt_lists",
    "draw_seed",
    "output_rows",
    "to_rollout_batch",
    "sampling_kwargs",
    "engine_kwargs",
    "canvas_length",
    "export_policy",
    "complete_generation_config",
]

INSTALL_HINT = "pip install 'dare-plugin-vllm[vllm]'"
MULTIPROCESSING = "VLLM_ENABLE_V1_MULTIPROCESSING"
#: ``generation_config.json`` keys vLLM's DiffusionGemma reads (its ``ModelState`` and sampler)
SAMPLER_KEYS = (
    "max_denoising_steps",
    "sampler_config",
    "t_min",
    "t_max",
    "stability_threshold",
    "confidence_threshold",
)
#: the fields of :class:`VLLMRolloutConfig` that are per call, not engine settings
PER_CALL = ("gen_length", "logprobs", "reseed")

Start = Callable[[dict], "tuple[Any, Callable[..., Any]]"]


def require_vllm() -> None:
    """A one-line :class:`DareError` naming the install command when vLLM is not importable."""
    if importlib.util.find_spec("vllm") is None:
        raise DareError(
            f"rollout.backend=vllm needs vLLM, which is not installed; {INSTALL_HINT} "
            f"(a CUDA build, on a machine with a GPU)"
        )


def world_size() -> int:
    """The torchrun world size of this process (1 outside torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def check_process(config: VLLMRolloutConfig) -> None:
    """Refuse, in one line, what this process cannot run: a multiprocess engine (the weights are
    handed over as tensors in this process), a missing ``export_dir`` or tensor parallelism under
    torchrun."""
    if os.environ.get(MULTIPROCESSING, "0") != "0":
        raise DareError(
            f"rollout.backend=vllm runs the engine in the training process, but "
            f"{MULTIPROCESSING}={os.environ[MULTIPROCESSING]}; unset it or set it to 0"
        )
    if config.export_dir and not os.path.isdir(config.export_dir):
        raise DareError(
            f"rollout.export_dir={config.export_dir} is not a directory; create it or set "
            f"rollout.export_dir='' (the system's temporary directory)"
        )
    if config.tensor_parallel_size > 1 and world_size() > 1:
        raise DareError(
            f"rollout.tensor_parallel_size={config.tensor_parallel_size} under torchrun "
            f"(WORLD_SIZE={world_size()}): every rank runs its own engine on its GPU; set "
            f"rollout.tensor_parallel_size=1, or run one process for a sharded engine"
        )


def prompt_lists(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> list[list[int]]:
    """Each row's prompt tokens with the padding removed (``prompt_mask`` 0)."""
    if prompt_ids.dim() != 2 or prompt_mask.shape != prompt_ids.shape:
        raise DareError(
            f"prompt_ids and prompt_mask must both be [B, P], got {tuple(prompt_ids.shape)} "
            f"and {tuple(prompt_mask.shape)}"
        )
    rows = []
    for b, (ids, keep) in enumerate(zip(prompt_ids.tolist(), prompt_mask.bool().tolist())):
        row = [t for t, k in zip(ids, keep) if k]
        if not row:
            raise DareError(f"prompt row {b} has no token (its prompt_mask is all 0); every prompt needs one")
        rows.append(row)
    return rows


def draw_seed(generator: Optional[torch.Generator]) -> int:
    """One engine seed in ``[0, 2**31 - 1)`` from ``generator`` (torch's default one when None)."""
    device = generator.device if generator is not None else "cpu"
    return int(torch.randint(0, 2**31 - 1, (1,), generator=generator, device=device))


def output_rows(outputs: Sequence[Any]) -> list[tuple[list[int], Optional[list[float]]]]:
    """``(token ids, log-probability of each or None)`` of vLLM ``RequestOutput`` s, in order: the
    first completion's ``token_ids`` and, where asked for, each position's entry for its own token
    in ``logprobs`` (NaN where the engine gave none)."""
    rows = []
    for out in outputs:
        done = out.outputs[0]
        ids = [int(t) for t in done.token_ids]
        lps = None
        if done.logprobs is not None:
            given = list(done.logprobs)
            lps = [
                float(given[j][t].logprob) if j < len(given) and given[j] and t in given[j] else math.nan
                for j, t in enumerate(ids)
            ]
        rows.append((ids, lps))
    return rows


def to_rollout_batch(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    rows: Sequence[tuple[Sequence[int], Optional[Sequence[float]]]],
    gen_length: int,
    stop_ids: Iterable[int],
    pad_id: int,
    with_logprobs: bool,
) -> RolloutBatch:
    """The :class:`RolloutBatch` of the engine's rows (see the module docstring, step 3)."""
    if len(rows) != prompt_ids.shape[0]:
        raise DareError(f"the engine returned {len(rows)} responses for {prompt_ids.shape[0]} prompts")
    b = len(rows)
    resp = torch.full((b, gen_length), int(pad_id), dtype=torch.long)
    mask = torch.zeros((b, gen_length), dtype=torch.long)
    lp = torch.zeros((b, gen_length), dtype=torch.float32)
    stops = {int(s) for s in stop_ids}
    for i, (ids, lps) in enumerate(rows):
        ids = list(ids)[:gen_length]
        end = next((j + 1 for j, t in enumerate(ids) if t in stops), len(ids))
        resp[i, :end] = torch.tensor(ids[:end], dtype=torch.long)
        mask[i, :end] = 1
        if with_logprobs and lps is not None:
            lp[i, :end] = torch.tensor(list(lps)[:end], dtype=torch.float32)
    dev = prompt_ids.device
    extras = {"engine_logprobs": lp.to(dev)} if with_logprobs else {}
    return RolloutBatch(prompt_ids, prompt_mask, resp.to(dev), mask.to(dev), extras=extras)


def sampling_kwargs(config: VLLMRolloutConfig, stop_ids: Iterable[int]) -> dict:
    """The ``SamplingParams`` of every request (temperature and seed stay at vLLM's defaults, the
    only values it accepts for diffusion models)."""
    return dict(
        max_tokens=config.gen_length,
        stop_token_ids=[int(s) for s in stop_ids],
        ignore_eos=True,
        logprobs=0 if config.logprobs else None,
        detokenize=False,
    )


def engine_kwargs(config: VLLMRolloutConfig, path: str, canvas: int) -> dict:
    """The ``vllm.LLM`` arguments of an engine starting from the export at ``path``."""
    diffusion = {"canvas_length": canvas}
    if config.max_denoising_steps:
        diffusion["max_denoising_steps"] = config.max_denoising_steps
    # text only (no vision tower), token ids in and out (no tokenizer)
    kw: dict[str, Any] = dict(
        model=path,
        diffusion_config=diffusion,
        language_model_only=True,
        skip_tokenizer_init=True,
        dtype=config.dtype,
        gpu_memory_utilization=config.gpu_memory_utilization,
        enforce_eager=config.enforce_eager,
        tensor_parallel_size=config.tensor_parallel_size,
    )
    for name in ("max_num_seqs", "max_model_len", "attention_backend"):
        if getattr(config, name):
            kw[name] = getattr(config, name)
    if world_size() > 1:  # torchrun: this rank's engine joins the existing process group
        kw["distributed_executor_backend"] = "external_launcher"
    return kw


def canvas_length(wrapper: Any) -> int:
    """The ``canvas_length`` of the wrapper's model config (a :class:`CapabilityError` without one)."""
    n = getattr(getattr(wrapper.module, "config", None), "canvas_length", None)
    if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        raise CapabilityError(
            f"the vllm rollout drives canvas models whose config sets canvas_length "
            f"(DiffusionGemma); the {wrapper.family!r} model's config has {n!r}"
        )
    return n


def export_policy(wrapper: Any, path: str) -> None:
    """Write the policy in HF layout into ``path``; a PEFT (LoRA) module is merged into a copy
    first (the training module stays as it is)."""
    peft = sys.modules.get("peft")
    if peft is not None and isinstance(wrapper.module, peft.PeftModel):
        merged = copy.copy(wrapper)
        merged.module = copy.deepcopy(wrapper.module).merge_and_unload()
        wrapper = merged
    wrapper.save_pretrained(path)


def complete_generation_config(path: str) -> list[str]:
    """Fill the :data:`SAMPLER_KEYS` the export at ``path`` leaves unset (absent or null) with
    transformers' DiffusionGemma defaults; the keys filled."""
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import DiffusionGemmaGenerationConfig

    file = os.path.join(path, "generation_config.json")
    data: dict = {}
    if os.path.isfile(file):
        with open(file, encoding="utf-8") as fh:
            data = json.load(fh)
    defaults = DiffusionGemmaGenerationConfig._get_default_generation_params()
    filled = [k for k in SAMPLER_KEYS if data.get(k) is None]
    for key in filled:
        value = defaults[key]
        if dataclasses.is_dataclass(value):  # serialised as transformers writes it
            value = {**dataclasses.asdict(value), "_cls_name": type(value).__name__}
        data[key] = value
    with open(file, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2)
    return filled


def start_vllm(kwargs: dict) -> tuple[Any, Any]:
    """``(vllm.LLM(**kwargs), vllm.SamplingParams)``, the engine in this process."""
    os.environ[MULTIPROCESSING] = "0"
    from vllm import LLM, SamplingParams

    return LLM(**kwargs), SamplingParams


def reseed_worker(worker: Any, seed: int) -> None:
    """Run on every engine worker (``collective_rpc``): reseed torch's CPU and CUDA streams."""
    torch.manual_seed(seed)


class Engine:
    """One running ``vllm.LLM``, the exported checkpoint it started from and how to reach it."""

    def __init__(self, llm: Any, make_params: Callable[..., Any], path: str, tensor_parallel_size: int):
        self.llm, self.make_params, self.path = llm, make_params, path
        self.tensor_parallel_size = tensor_parallel_size
        self.loaded_step: Optional[int] = None  # the training step whose policy was pushed last
        self._remove_export = weakref.finalize(self, shutil.rmtree, path, True)

    @property
    def closed(self) -> bool:
        return self.llm is None

    def generate(self, prompts: list[dict], params: Any, seed: Optional[int]) -> list:
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=devices, enabled=seed is not None):
            if seed is not None:
                self.llm.collective_rpc(reseed_worker, args=(seed,))
            return self.llm.generate(prompts, params, use_tqdm=False)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy ``(name, tensor)`` pairs in checkpoint names into every worker's model in place."""
        if self.tensor_parallel_size > 1:  # the workers are other processes: plain CPU tensors
            weights = [(name, t.detach().cpu()) for name, t in weights]
        else:  # copies, one at a time: a loader may work on what it is given, the trainer's stay
            weights = ((name, t.detach().clone()) for name, t in weights)
        with torch.no_grad():
            self.llm.collective_rpc(
                "reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True}
            )
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        """Drop the engine (its memory goes with the last reference) and its export."""
        self.llm = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        self._remove_export()


#: the running engines, per policy module and engine settings (shared by that policy's backends)
_ENGINES: "weakref.WeakKeyDictionary[Any, dict[tuple, Engine]]" = weakref.WeakKeyDictionary()


class VLLMRollout:
    """The ``vllm`` rollout backend (see the module docstring); ``start(kwargs) -> (llm,
    SamplingParams)`` starts an engine (default: :func:`start_vllm`, after checking that vLLM is
    installed)."""

    def __init__(self, config: VLLMRolloutConfig, *, start: Optional[Start] = None):
        if not isinstance(config, VLLMRolloutConfig):
            raise TypeError(f"VLLMRollout needs a VLLMRolloutConfig, got {type(config).__name__}")
        check_process(config)
        if start is None:
            require_vllm()
            start = start_vllm
        self.config, self._start = config, start
        self._engine: Optional[Engine] = None

    def engine(self, wrapper: Any) -> Engine:
        """The engine of ``wrapper``'s policy, started now if none runs (step 1); the one
        :meth:`load_weights` pushes to."""
        key = tuple(
            (f.name, getattr(self.config, f.name)) for f in attrs.fields(VLLMRolloutConfig) if f.name not in PER_CALL
        )
        running = _ENGINES.setdefault(wrapper.module, {})
        engine = running.get(key)
        if engine is None or engine.closed:
            canvas = canvas_length(wrapper)
            path = tempfile.mkdtemp(prefix="dare-vllm-", dir=self.config.export_dir or None)
            try:
                export_policy(wrapper, path)
                complete_generation_config(path)
                llm, make_params = self._start(engine_kwargs(self.config, path, canvas))
            except BaseException:
                shutil.rmtree(path, ignore_errors=True)
                raise
            engine = running[key] = Engine(llm, make_params, path, self.config.tensor_parallel_size)
        self._engine = engine
        return engine

    def generate(
        self,
        wrapper: Any,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        *,
        record: frozenset[str] = frozenset(),
        generator: Optional[torch.Generator] = None,
    ) -> RolloutBatch:
        """``gen_length`` tokens at most after every left-padded prompt (module docstring, 2-3)."""
        if record:
            raise CapabilityError(
                f"the vllm rollout cannot record {', '.join(sorted(record))}: the engine "
                f"returns final tokens only; choose an in-process rollout backend"
            )
        prompts = [{"prompt_token_ids": row} for row in prompt_lists(prompt_ids, prompt_mask)]
        engine = self.engine(wrapper)
        params = engine.make_params(**sampling_kwargs(self.config, wrapper.stop_token_ids))
        seed = draw_seed(generator) if self.config.reseed else None
        rows = output_rows(engine.generate(prompts, params, seed))
        return to_rollout_batch(
            prompt_ids,
            prompt_mask,
            rows,
            self.config.gen_length,
            wrapper.stop_token_ids,
            wrapper.pad_token_id,
            self.config.logprobs,
        )

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], step: int) -> None:
        """Push the updated policy into the running engine (module docstring, step 4); an engine
        shared by the training and the evaluation backend loads each ``step``'s policy once."""
        engine = self._engine
        if engine is not None and not engine.closed and engine.loaded_step != step:
            engine.load_weights(weights)
            engine.loaded_step = step

    def close(self) -> None:
        """Shut this backend's engine down (for every backend sharing it)."""
        engine, self._engine = self._engine, None
        if engine is not None:
            for running in list(_ENGINES.values()):
                for key in [k for k, e in running.items() if e is engine]:
                    del running[key]
            engine.close()
