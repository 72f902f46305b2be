"""The ``dare`` model of lm-evaluation-harness (registered on import).

``--model_args`` (``key=value`` pairs): ``family`` (a registered family, required), ``path`` (a
checkpoint directory; default the family's bundled one), ``dtype``, ``device``, ``seed``,
``mc_samples`` (Monte-Carlo rows per loglikelihood request), ``backend`` (the rollout backend),
``steps`` and ``temperature`` (the evaluation sampler's, as ``eval.steps`` / ``eval.temperature``),
any field of the backend's config (``gen_length``, ``block_length``, ``cache``, ...) and any dotted
run-config key (``eval.backend=...``). The run config is resolved as ``dare eval`` resolves it
(the checkpoint's ``dare_defaults.yaml`` included), so errors are DARE's one-line errors.

* ``loglikelihood``: :func:`dare_objectives.likelihood.elbo_loglikelihood` of each continuation
  (a lower bound of ``log p``, deterministic for ``seed``); ``is_greedy`` is always ``False``
  (see that module: no cheap honest greedy check exists for a dLLM).
* ``generate_until``: the family's evaluation rollout backend generates ``gen_length`` tokens; the
  text is cut to ``max_gen_toks`` tokens and before the first ``until`` string. Sampling settings
  come from the model args; the requests' ``temperature`` / ``do_sample`` are not used.
* ``loglikelihood_rolling`` (perplexity tasks) is refused: a diffusion LM has no left-to-right
  factorisation to roll a window over.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from dare_core.api import DareError, decode_responses, eval_context, get_dare, left_pad, resolve
from dare_objectives.likelihood import elbo_loglikelihood
from dare_plugin_lmeval._compat import load_lm_eval

load_lm_eval()
from lm_eval.api.model import LM  # noqa: E402
from lm_eval.api.registry import register_model  # noqa: E402

#: model args mapped to run-config keys; anything else undotted is a rollout config field
_KEYS = {
    "path": "model.path",
    "dtype": "model.dtype",
    "device": "model.device",
    "seed": "seed",
    "backend": "rollout.backend",
    "steps": "eval.steps",
    "temperature": "eval.temperature",
}


def _overrides(args: dict[str, Any]) -> list[str]:
    out = []
    for key, value in args.items():
        if value is None:
            continue
        if key == "device":
            value = "cuda" if str(value).startswith("cuda") else value
        out.append(f"{_KEYS.get(key, key if '.' in key else 'rollout.' + key)}={value}")
    return out


@register_model("dare")
class DareLM(LM):
    """lm-eval's ``LM`` for every installed DARE family (see the module docstring)."""

    def __init__(
        self,
        family: Optional[str] = None,
        mc_samples: int = 32,
        batch_size: Any = 8,
        max_batch_size: Any = None,
        **args: Any,
    ):
        super().__init__()
        if not family:
            raise DareError("the dare lm-eval model needs family=NAME in --model_args (see `dare list models`)")
        self.dare = get_dare()
        config = resolve(self.dare, model=str(family), overrides=_overrides(args), need_algo=False)
        self.ctx = eval_context(self.dare, config)
        self.wrapper = self.ctx.wrapper
        self.seed = config.seed
        self.mc_samples = int(mc_samples)
        self.batch_size = int(batch_size) if str(batch_size).isdigit() else 8  # "auto" is not sized here
        if self.mc_samples < 1:
            raise DareError(f"mc_samples must be >= 1, got {mc_samples}")

    # -- lm-eval interface ----------------------------------------------------------------
    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        w = self.wrapper
        # context and continuation tokenised apart, as generation sees a prompt (HF causal models
        # move the context's trailing whitespace into the continuation instead; a chat template's
        # final newlines belong to the prompt)
        pairs = [(w.encode(c) if c else [], w.encode(y)) for c, y in (req.args for req in requests)]
        with self.ctx.engine.autocast():
            values = elbo_loglikelihood(
                w, pairs, samples=self.mc_samples, seed=self.seed, batch_size=self.batch_size * self.mc_samples
            ).tolist()
        out = [(float(v), False) for v in values]
        for req, res in zip(requests, out):
            self.cache_hook.add_partial("loglikelihood", req.args, res)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        raise DareError(
            "loglikelihood_rolling (perplexity tasks) is not supported by the dare model: a "
            "diffusion LM has no left-to-right factorisation to roll a window over; use "
            "loglikelihood (multiple-choice) or generate_until tasks"
        )

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        w, out = self.wrapper, [""] * len(requests)
        gen = torch.Generator().manual_seed(self.seed)
        order = sorted(range(len(requests)), key=lambda i: len(requests[i].args[0]))
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            ids, mask = left_pad([w.encode(requests[i].args[0]) for i in idx], w.pad_token_id)
            with self.ctx.engine.autocast():
                roll = self.ctx.eval_rollout.generate(w, ids.to(w.device), mask.to(w.device), generator=gen)
            resp, rmask = roll.response_ids.cpu(), roll.response_mask.cpu()
            for row, i in enumerate(idx):
                kwargs = dict(requests[i].args[1] or {})
                limit = int(kwargs.get("max_gen_toks") or resp.shape[1])
                text = decode_responses(w, resp[row : row + 1, :limit], rmask[row : row + 1, :limit])[0]
                until = kwargs.get("until") or []
                for stop in [until] if isinstance(until, str) else until:
                    if stop:
                        text = text.split(stop)[0]
                out[i] = text
                self.cache_hook.add_partial("generate_until", requests[i].args, text)
        return out

    # -- chat templates (--apply_chat_template) ---------------------------------------------
    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self.wrapper.tokenizer.apply_chat_template(
            chat_history, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    @property
    def tokenizer_name(self) -> str:
        return str(self.ctx.config.model.path).replace("/", "__")

    def chat_template(self, chat_template: Any = False) -> Optional[str]:
        return getattr(self.wrapper.tokenizer, "chat_template", None) or ""
