"""The ``entropy_bound`` rollout backend: transformers' ``DiffusionGemmaForBlockDiffusion.generate``.

Everything about sampling is the library's: canvases of ``canvas_length`` appended after the
prompt, each starting from uniform random tokens; per denoising step the decoder's logits under a
linear temperature schedule ``t_max → t_min``, a multinomial draw, entropy-bound acceptance
(arXiv:2505.24857) and renoising of the rest; adaptive stopping (argmax canvas stable and mean
entropy below ``confidence_threshold``); the kept canvas is the argmax canvas; tokens after the
first stop token of a canvas become padding and a row stops after the canvas that holds one.
The rollout config's ``null`` fields take the checkpoint's ``generation_config.json``.

What this backend adds:

* ``temperature`` (DARE's rollout knob) scales the schedule through generate's own
  ``logits_processor`` argument (applied before the schedule): transformers'
  ``TemperatureLogitsWarper`` for ``T > 0``, :class:`ArgmaxProposals` for ``T = 0`` (nothing at 1);
* **determinism**: generate draws with ``torch.randint`` / ``torch.multinomial`` from the global
  RNG, so the call runs in a forked RNG state (CPU and the model's CUDA device) seeded with one
  63-bit draw of ``generator``: the same generator state gives the same rollout, and the caller's
  global RNG is left as it was (``generator=None``: the global RNG is used and advanced);
* the response is cut (or padded with the pad id) to ``gen_length``; ``response_mask`` covers each
  row up to and including its first stop token (``wrapper.stop_token_ids``; every position when
  there is none);
* ``reveal_step`` (requested record): a streamer sees every step's argmax canvas; a token's reveal
  step is the global step (canvases in order, steps counted over all canvases from 0) after which
  its argmax never changed; ``num_steps`` is the total number of steps run; positions of canvases
  never generated (every row had stopped) get -1;
* ``nfe``: forward passes, the decoder's steps plus one encoder pass per canvas.
"""

from __future__ import annotations

import copy
from typing import Any, Optional

import torch

from dare_core.api import DareError, RolloutBatch, collective_generation
from dare_nn.sampling import ConfiguredSampler, check_prompt_shapes, check_records, eval_mode, mask_through_first_stop
from dare_plugin_diffusiongemma.config import RECORDS, EntropyBoundConfig


class ArgmaxProposals:
    """A logits processor leaving only each position's argmax token (``T = 0``): the proposal is the
    argmax, its entropy 0, so the entropy-bound sampler accepts the whole canvas."""

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        low = torch.full_like(scores, torch.finfo(scores.dtype).min)
        return low.scatter(-1, scores.argmax(-1, keepdim=True), 0.0)


class DraftRecorder:
    """A ``generate`` streamer keeping every step's argmax canvas, grouped by canvas."""

    def __init__(self):
        self.canvases: list[list[torch.Tensor]] = []
        self._steps: list[torch.Tensor] = []
        self._seen_prompt = False

    def put(self, value: torch.Tensor) -> None:
        if not self._seen_prompt:  # generate first puts the prompt, then each finished canvas
            self._seen_prompt = True
            return
        self.canvases.append(self._steps)
        self._steps = []

    def put_draft(self, value: torch.Tensor) -> None:
        self._steps.append(value.clone())

    def end(self) -> None:
        pass

    def reveal_steps(self, batch: int, length: int) -> tuple[torch.Tensor, int]:
        """``([B, length] settle steps, -1 beyond the generated canvases; total steps)``."""
        parts, offset = [], 0
        for steps in self.canvases:
            drafts = torch.stack(steps)  # [n, B, C]
            n = drafts.shape[0]
            changed = torch.cat([torch.ones_like(drafts[:1], dtype=torch.bool), drafts[1:] != drafts[:-1]])
            step = torch.arange(n)[:, None, None].expand_as(drafts)
            parts.append(offset + torch.where(changed, step, 0).amax(0))
            offset += n
        reveal = torch.cat(parts, 1) if parts else torch.zeros(batch, 0, dtype=torch.long)
        pad = torch.full((batch, max(0, length - reveal.shape[1])), -1, dtype=torch.long)
        return torch.cat([reveal, pad], 1)[:, :length], offset


class EntropyBoundSampler(ConfiguredSampler):
    """DiffusionGemma's ``generate`` as a DARE rollout backend (module docstring)."""

    config_cls = EntropyBoundConfig

    def generation_config(self, wrapper: Any) -> Any:
        """The checkpoint's generation config with this rollout's settings and the wrapper's stop
        and pad ids."""
        from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig

        cfg = self.config
        gen = copy.deepcopy(wrapper.module.generation_config)
        for name in ("max_denoising_steps", "t_min", "t_max", "stability_threshold", "confidence_threshold"):
            value = getattr(cfg, name)
            if value is not None:
                setattr(gen, name, float(value) if name.startswith(("t_", "conf")) else int(value))
        if cfg.entropy_bound is not None:
            gen.sampler_config = EntropyBoundSamplerConfig(entropy_bound=float(cfg.entropy_bound))
        gen.max_new_tokens = cfg.gen_length
        gen.eos_token_id = list(wrapper.stop_token_ids)
        gen.pad_token_id = wrapper.pad_token_id
        gen.return_dict_in_generate = True
        return gen

    def logits_processor(self) -> Any:
        """The processors that scale the schedule by ``temperature`` (``None`` at 1)."""
        from transformers import LogitsProcessorList, TemperatureLogitsWarper

        t = float(self.config.temperature)
        if t == 1.0:
            return None
        return LogitsProcessorList([TemperatureLogitsWarper(t) if t > 0 else ArgmaxProposals()])

    def generate(
        self,
        wrapper: Any,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        *,
        record: frozenset[str] = frozenset(),
        generator: Optional[torch.Generator] = None,
    ) -> RolloutBatch:
        record = check_records("the entropy_bound rollout", record, RECORDS)
        if "uniform_noise" not in wrapper.capabilities:
            raise ValueError(
                f"the entropy_bound rollout drives DiffusionGemma (uniform_noise) models, got the "
                f"{wrapper.family!r} family; choose a rollout backend that supports it"
            )
        if collective_generation():
            raise DareError(
                "the entropy_bound rollout decodes through transformers' DiffusionGemma generate, "
                "which calls the encoder and decoder outside the module's forward and cannot step "
                "in lockstep where forwards are collective (engine.name=fsdp, deepspeed.zero_stage=3); "
                "use engine.name=ddp or deepspeed.zero_stage 1 or 2"
            )
        check_prompt_shapes(prompt_ids, prompt_mask)
        B, P = prompt_ids.shape
        R = self.config.gen_length
        gen = self.generation_config(wrapper)
        recorder = DraftRecorder()
        device = prompt_ids.device
        with eval_mode(wrapper.module), _forked_rng(generator):
            out = wrapper.module.generate(
                input_ids=prompt_ids.long(),
                attention_mask=prompt_mask.long(),
                generation_config=gen,
                logits_processor=self.logits_processor(),
                streamer=recorder,
            )
        response = out.sequences[:, P : P + R]
        if response.shape[1] < R:
            fill = torch.full((B, R - response.shape[1]), wrapper.pad_token_id, dtype=response.dtype, device=device)
            response = torch.cat([response, fill], 1)
        reveal, steps = recorder.reveal_steps(B, R)
        return RolloutBatch(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            response_ids=response,
            response_mask=mask_through_first_stop(response, wrapper.stop_token_ids),
            reveal_step=reveal.to(device) if "reveal_step" in record else None,
            num_steps=steps,
            nfe=steps + len(recorder.canvases),
        )


class _forked_rng:
    """Run the body on the global RNG seeded from ``generator`` (the CPU and CUDA generators
    forked, restored afterwards); without a generator, the global RNG as it is."""

    def __init__(self, generator: Optional[torch.Generator]):
        self.generator, self.fork = generator, None

    def __enter__(self):
        if self.generator is None:
            return self
        seed = int(torch.randint(0, 2**63 - 1, (1,), generator=self.generator))
        # manual_seed reseeds every CUDA device: fork them all
        cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
        self.fork = torch.random.fork_rng(devices=cuda)
        self.fork.__enter__()
        torch.manual_seed(seed)
        return self

    def __exit__(self, *exc):
        if self.fork is not None:
            return self.fork.__exit__(*exc)
        return False
