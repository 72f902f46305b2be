"""Every algorithm, rollout backend and likelihood path of the repository on a uniform-noise family.

A uniform-noise family (capability ``uniform_noise``, e.g. DiffusionGemma) has no MASK token: its
forward noise (``wrapper.noise``) replaces tokens by uniform random tokens. Two toy families stand
in for it here, the dare-nn block toy (kind ``block``, as DiffusionGemma) and the core's masked
toy (kind ``masked``, so the masked-only algorithms meet a capability check rather than a kind
check), both with ``noise`` overridden and a MASK id of -1, which fails any forward it reaches.
A small test sampler (start from uniform noise, predict, re-noise at a falling level) rolls out.

Algorithms whose math holds for any noise kernel must run one RL step through the normal loop;
those that need MASK states (``mask_token``) or the absorbing-state ELBO (``absorbing_elbo``) must
be refused by ``check_support`` in one line naming the missing capability.
"""

from __future__ import annotations

import attrs
import pytest
import torch

import dare_plugin_bgpo
import dare_plugin_cj_grpo
import dare_plugin_coupled_grpo
import dare_plugin_d1
import dare_plugin_dream
import dare_plugin_dtreerpo
import dare_plugin_ebpo
import dare_plugin_espo
import dare_plugin_justgrpo
import dare_plugin_llada2
import dare_plugin_mdpo
import dare_plugin_myalgo
import dare_plugin_reinforce_rloo
import dare_plugin_samplers
import dare_plugin_spg
import dare_plugin_vrpo
from dare_core.api import (
    CapabilityError,
    ModelFamily,
    RolloutBatch,
    RolloutSpec,
    SequenceBatch,
    hookimpl,
    non_negative,
    option,
    positive,
    resolve,
)
from dare_core.config.loader import check_support
from dare_core.testing.algorithm_checks import one_rl_step
from dare_core.testing.registries import build_for
from dare_core.testing.toy import ToyDiffusionLM, ToyWrapper, make_char_tokenizer
from dare_nn.sampling import mask_through_first_stop
from dare_nn.testing.toy_block import ToyBlockLM, ToyBlockWrapper
from dare_objectives.likelihood import elbo_loglikelihood

ALGORITHM_PLUGINS = (
    dare_plugin_bgpo,
    dare_plugin_cj_grpo,
    dare_plugin_coupled_grpo,
    dare_plugin_d1,
    dare_plugin_dtreerpo,
    dare_plugin_ebpo,
    dare_plugin_espo,
    dare_plugin_justgrpo,
    dare_plugin_mdpo,
    dare_plugin_myalgo,
    dare_plugin_reinforce_rloo,
    dare_plugin_spg,
    dare_plugin_vrpo,
)
CAPABILITIES = frozenset({"uniform_noise"})

#: algorithm -> the families (by kind) it runs on; both uniform toys unless the algorithm is
#: restricted to masked models
RUNS = {
    "coupled_grpo": ("uniform_block_toy", "uniform_toy"),
    "reinforce_rloo": ("uniform_block_toy", "uniform_toy"),
    "d1": ("uniform_toy",),
    "myalgo": ("uniform_toy",),
}
#: algorithm -> the capability it is refused for (on the uniform toy of the kind it supports)
REFUSED = {
    "bgpo": "absorbing_elbo",
    "cj_grpo": "mask_token",
    "dtreerpo": "mask_token",
    "ebpo": "absorbing_elbo",
    "espo": "absorbing_elbo",
    "justgrpo": "mask_token",
    "mdpo": "mask_token",
    "spg": "absorbing_elbo",
    "vrpo": "absorbing_elbo",
}


def uniform_noise(wrapper, ids: torch.Tensor, where: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """The uniform kernel: a uniformly random non-special token at every position of ``where``."""
    special = set(wrapper.tokenizer.all_special_ids)
    pool = torch.tensor([i for i in range(len(wrapper.tokenizer)) if i not in special])
    draw = pool[torch.randint(0, len(pool), tuple(where.shape), generator=generator)].to(ids.device)
    return torch.where(where, draw, ids)


class UniformBlockToy(ToyBlockWrapper):
    noise = uniform_noise


class UniformMaskedToy(ToyWrapper):
    noise = uniform_noise


def _loader(kind: str):
    def load(path=None, dtype=torch.float32, device="cpu", attn_implementation=None):
        tok = make_char_tokenizer()
        torch.manual_seed(0)
        cls, module, extra = (
            (UniformBlockToy, ToyBlockLM(len(tok)), {"block_size": 4})
            if kind == "block"
            else (UniformMaskedToy, ToyDiffusionLM(len(tok), dim=32), {})
        )
        return cls(
            family=f"uniform{'_block' if kind == 'block' else ''}_toy",
            module=module.to(device, dtype),
            tokenizer=tok,
            kind=kind,
            mask_token_id=-1,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
            capabilities=CAPABILITIES,
            **extra,
        )

    return load


@attrs.frozen
class DenoiseConfig:
    """The test sampler's options (the fields the tiny RL runs set)."""

    gen_length: int = option(8, "Response length.", positive)
    block_length: int = option(4, "Unused (the sampler denoises the whole response).", positive)
    steps: int = option(4, "Denoising steps.", positive)
    temperature: float = option(1.0, "Sampling temperature (0 = argmax).", non_negative)
    truncate_at_eos: bool = option(
        False,
        "Response mask rule: true = positions up to and including the "
        "first EOS count; false = every generated position.",
    )


class UniformDenoiser:
    """Start the response as uniform noise; each step predicts every token and re-noises them at
    level ``1 - (k + 1) / steps``; the last prediction is the response."""

    def __init__(self, config: DenoiseConfig):
        self.config = config

    def generate(self, wrapper, prompt_ids, prompt_mask, *, record=frozenset(), generator=None) -> RolloutBatch:
        generator = generator or torch.Generator().manual_seed(0)
        B, R, steps = prompt_ids.shape[0], self.config.gen_length, self.config.steps
        everywhere = torch.ones(B, R, dtype=torch.bool)
        x = wrapper.noise(torch.zeros(B, R, dtype=torch.long), everywhere, generator)
        att = torch.cat([prompt_mask, torch.ones(B, R, dtype=prompt_mask.dtype)], 1)
        with torch.no_grad():
            for k in range(steps):
                logits = wrapper.logits(torch.cat([prompt_ids, x], 1), att)[:, prompt_ids.shape[1] :].float()
                if self.config.temperature > 0:
                    probs = torch.softmax(logits / self.config.temperature, -1).reshape(B * R, -1)
                    pred = torch.multinomial(probs, 1, generator=generator).reshape(B, R)
                else:
                    pred = logits.argmax(-1)
                level = 1.0 - (k + 1) / steps
                x = wrapper.noise(pred, torch.rand(B, R, generator=generator) < level, generator)
        mask = mask_through_first_stop(x, [wrapper.eos_token_id], self.config.truncate_at_eos)
        return RolloutBatch(prompt_ids, prompt_mask, x, mask, num_steps=steps, nfe=steps)


class UniformToys:
    """Registers the two uniform-noise toy families and their sampler."""

    @hookimpl
    def dare_register_model_wrappers(self, register):
        for kind, name in (("block", "uniform_block_toy"), ("masked", "uniform_toy")):
            register(
                ModelFamily(
                    name=name,
                    kind=kind,
                    load=_loader(kind),
                    capabilities=CAPABILITIES,
                    block_size=4 if kind == "block" else None,
                    default_rollout="uniform_denoise",
                    rollouts=("uniform_denoise",),
                    description=f"uniform-noise {kind} toy (tests)",
                )
            )

    @hookimpl
    def dare_register_rollout_backends(self, register):
        register(
            RolloutSpec(
                name="uniform_denoise",
                config_cls=DenoiseConfig,
                build=UniformDenoiser,
                kinds=frozenset({"masked", "block"}),
                requires=frozenset({"uniform_noise"}),
                description="uniform-noise test sampler",
            )
        )


def _dare(*plugins):
    return build_for(*plugins, UniformToys())


def test_the_toys_noise_with_uniform_tokens_and_no_mask():
    for kind in ("block", "masked"):
        w = _loader(kind)()
        ids = torch.full((2, 64), 10)
        where = torch.rand(2, 64, generator=torch.Generator().manual_seed(0)) < 0.5
        noisy = w.noise(ids, where, torch.Generator().manual_seed(1))
        assert torch.equal(noisy[~where], ids[~where])
        assert not bool(torch.isin(noisy, torch.tensor(w.tokenizer.all_special_ids)).any())
        assert len(noisy[where].unique()) > 10  # random tokens, not one id
        assert "mask_token" not in w.capabilities and "absorbing_elbo" not in w.capabilities


def test_every_algorithm_is_classified():
    """A new algorithm must say here whether it runs on a uniform-noise family."""
    names = set(_dare(*ALGORITHM_PLUGINS).registries.algorithms.names()) - {"sft"}
    assert names == set(RUNS) | set(REFUSED)


@pytest.mark.parametrize("algo,family", [(a, f) for a, fams in RUNS.items() for f in fams])
def test_kernel_free_algorithms_run_one_step(algo, family, tmp_path):
    plugin = next(p for p in ALGORITHM_PLUGINS if algo in _dare(p).registries.algorithms)
    record = one_rl_step([plugin, UniformToys()], algo, family, tmp_path)
    assert record["step"] == 1
    numbers = [v for v in record.values() if isinstance(v, float)]
    assert numbers and all(v == v and abs(v) != float("inf") for v in numbers), record


@pytest.mark.parametrize(
    "algo,family", [("d1", "uniform_toy"), ("coupled_grpo", "uniform_block_toy"), ("myalgo", "uniform_toy")]
)
def test_corruptions_use_the_family_noise(algo, family):
    """The noised positions hold random tokens, never the (absent) MASK id."""
    from dare_core.components import ComponentLookup

    dare = _dare(*ALGORITHM_PLUGINS)
    spec = dare.registries.algorithms.get(algo)
    comps = spec.build(spec.config_cls(), ComponentLookup(dare.registries, components=spec.components))
    w = dare.registries.models.get(family).load()
    ids = torch.randint(10, 60, (3, 12), generator=torch.Generator().manual_seed(0))
    batch = SequenceBatch(ids, torch.ones_like(ids), 4)
    cor = comps.corruption(w, batch, torch.Generator().manual_seed(0))
    assert not bool((cor.noisy_ids == -1).any())
    changed = cor.noisy_ids != ids.expand_as(cor.noisy_ids)
    assert bool(changed.any()) and not bool((changed & ~cor.masked).any())


@pytest.mark.parametrize("algo,capability", sorted(REFUSED.items()))
def test_mask_and_elbo_algorithms_are_refused_in_one_line(algo, capability):
    dare = _dare(*ALGORITHM_PLUGINS)
    kinds = dare.registries.algorithms.get(algo).kinds
    family = "uniform_block_toy" if not kinds or "block" in kinds else "uniform_toy"
    with pytest.raises(CapabilityError) as info:
        check_support(dare, algo, family)
    message = str(info.value)
    assert "\n" not in message and "needs model capability" in message and capability in message
    assert repr(family) in message


def test_the_components_carry_the_requirement_too():
    """A refused algorithm's components declare what they need, so another algorithm composing
    them is refused as well."""
    regs = _dare(*ALGORITHM_PLUGINS).registries
    roles = {
        "corruption": regs.corruptions,
        "trajectory": regs.trajectories,
        "estimator": regs.estimators,
        "loss": regs.losses,
        "advantage": regs.advantages,
    }
    for algo, capability in REFUSED.items():
        components = regs.algorithms.get(algo).components.items()
        needs = set().union(
            *(
                roles[role].get(name).requires
                for role, names in components
                for name in ((names,) if isinstance(names, str) else names)
            )
        )
        assert capability in needs, algo


@pytest.mark.parametrize(
    "backend,family", [("low_confidence", "uniform_toy"), ("fast", "uniform_toy"), ("block", "uniform_block_toy")]
)
def test_mask_samplers_are_refused(backend, family, tmp_path):
    dare = _dare(dare_plugin_samplers)
    with pytest.raises(CapabilityError, match=f"rollout backend '{backend}' needs model capability.*mask_token"):
        resolve(dare, model=family, need_algo=False, overrides=[f"model.path={tmp_path}", f"rollout.backend={backend}"])


def test_family_samplers_require_a_mask_token():
    regs = build_for(dare_plugin_samplers, dare_plugin_dream, dare_plugin_llada2).registries
    for name, spec in regs.rollouts.items():
        assert "mask_token" in spec.requires, name


def test_elbo_likelihood_is_refused_in_one_line():
    w = _loader("masked")()
    with pytest.raises(CapabilityError, match=r"needs model capability absorbing_elbo which 'uniform_toy' lacks"):
        elbo_loglikelihood(w, [([10, 11], [12, 13])], samples=2)


def test_the_table_matches_the_listing():
    """``dare list --matrix``'s reading (algorithm kinds and requires) agrees with the table."""
    regs = _dare(*ALGORITHM_PLUGINS).registries
    for algo, capability in REFUSED.items():
        assert capability in regs.algorithms.get(algo).requires, algo
    for algo in RUNS:
        assert not regs.algorithms.get(algo).requires & {"mask_token", "absorbing_elbo"}, algo
