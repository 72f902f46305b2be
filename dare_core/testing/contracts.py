"""Contract test suites that family and algorithm plugins run on themselves.

Usage in a plugin's tests::

    import my_dare_plugin as plugin
    from dare_core.testing.contracts import ModelFamilyContract

    class TestContract(ModelFamilyContract):
        family = "x"
        plugins = (plugin,)

Every test builds registries from the core's default plugins plus ``plugins`` only, so the result
does not depend on what else is installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Sequence

import attrs
import pytest
import torch

from dare_core.config.loader import backend_offers
from dare_core.config.schema import RunConfig, TrainerConfig
from dare_core.config.structure import structure
from dare_core.interfaces import RLComponents
from dare_core.registry import ROLES
from dare_core.testing.registries import build_for
from dare_core.testing.toy import fake_rollout, make_toy_wrapper
from dare_core.workflows.runtime import build_components

if TYPE_CHECKING:
    from dare_core.plugins import Dare

_NEEDS_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _recording_backend(dare: Dare, wrapper: Any, records: frozenset, methods: frozenset = frozenset()):
    """The first registered rollout backend that drives ``wrapper``'s kind, records ``records``
    and offers ``methods`` (the plugins under test must bring one)."""
    for _, spec in dare.registries.rollouts.items():
        if (
            (not spec.kinds or wrapper.kind in spec.kinds)
            and spec.requires <= wrapper.capabilities
            and backend_offers(spec, records, methods=methods)
        ):
            return spec
    pytest.fail(
        f"no registered rollout backend records {sorted(records)} for {wrapper.kind} "
        f"models; require a plugin that provides one (e.g. dare-plugin-samplers)"
    )


class _PluginSuite:
    """The ``dare`` fixture: registries of the core's default plugins and ``plugins``."""

    plugins: ClassVar[Sequence[Any]] = ()

    @pytest.fixture(scope="class")
    @classmethod
    def dare(cls):
        return build_for(*cls.plugins)


class ModelFamilyContract(_PluginSuite):
    """What every model family must do. Subclasses set ``family`` and ``plugins`` and may
    override the ``checkpoint`` fixture (default: the family's ``create`` on a small corpus, else
    its bundled checkpoint), as a ``@classmethod`` under ``@pytest.fixture(scope="class")`` like
    the fixtures here (pytest deprecates class-scoped fixtures that are instance methods)."""

    family: ClassVar[str] = ""
    #: keyword arguments for ``ModelFamily.create`` (architecture sizes of a tiny model)
    create_kwargs: ClassVar[dict[str, Any]] = {}

    @pytest.fixture(scope="class")
    @classmethod
    def spec(cls, dare):
        return dare.registries.models.get(cls.family)

    @pytest.fixture(scope="class")
    @classmethod
    def checkpoint(cls, spec, tmp_path_factory):
        if spec.create is not None:
            out = str(tmp_path_factory.mktemp("ckpt") / "tiny")
            texts = ["Solve 1 + 2 = 3.", "<answer>\n3142\n</answer>", "hello world"] * 20
            spec.create(out, texts, **dict(cls.create_kwargs))
            return out
        if spec.default_checkpoint:
            return spec.default_checkpoint
        pytest.skip("family has neither create() nor a bundled checkpoint")

    @pytest.fixture(scope="class")
    @classmethod
    def wrapper(cls, spec, checkpoint):
        return spec.load(checkpoint, dtype=torch.float32, device="cpu")

    def _ids(self, wrapper, text: str = "Solve the puzzle: 3102") -> list[int]:
        return wrapper.encode(wrapper.render_prompt([{"role": "user", "content": text}]))

    def test_spec(self, dare, spec):
        assert spec.kind in ("masked", "block")
        assert callable(spec.load)
        assert spec.default_rollout in dare.registries.rollouts, "default rollout not registered"

    def test_wrapper_has_every_declared_member(self, wrapper):
        """Every member of the ModelWrapper seam (dare_core.interfaces) the core may call."""
        from dare_core.interfaces import ModelWrapper

        members = set(ModelWrapper.__annotations__) | {n for n in vars(ModelWrapper) if not n.startswith("_")}
        missing = sorted(m for m in members if not hasattr(wrapper, m))
        assert not missing, f"the wrapper lacks {missing}"

    def test_token_ids_come_from_checkpoint(self, wrapper):
        vocab = wrapper.module.get_input_embeddings().num_embeddings
        for tid in (wrapper.eos_token_id, wrapper.pad_token_id, *wrapper.stop_token_ids):
            assert 0 <= tid < vocab
        if "mask_token" in wrapper.capabilities:
            assert 0 <= wrapper.mask_token_id < vocab and wrapper.mask_token_id != wrapper.eos_token_id
            assert wrapper.tokenizer.convert_ids_to_tokens(wrapper.mask_token_id) is not None

    def test_noise_kernel(self, wrapper):
        """``noise`` changes only the chosen positions, with the MASK token or seeded uniform tokens."""
        ids = torch.tensor([self._ids(wrapper)])
        where = torch.arange(ids.shape[1])[None] % 2 == 0
        a, b = (wrapper.noise(ids, where, torch.Generator().manual_seed(0)) for _ in range(2))
        assert torch.equal(a, b) and torch.equal(a[~where], ids[~where])
        assert ("mask_token" in wrapper.capabilities) + ("uniform_noise" in wrapper.capabilities) == 1
        if "mask_token" in wrapper.capabilities:
            assert (a[where] == wrapper.mask_token_id).all()
        else:
            assert ((a[where] >= 0) & (a[where] < wrapper.module.get_input_embeddings().num_embeddings)).all()

    def test_logits_shape_and_alignment(self, wrapper):
        ids = torch.tensor([self._ids(wrapper)])
        logits = wrapper.logits(ids)
        assert logits.shape[:2] == ids.shape
        assert torch.isfinite(logits).all()
        lp = wrapper.token_logprobs(ids, ids)
        ref = torch.log_softmax(wrapper.denoise_logits(ids).float(), -1).gather(-1, ids[..., None])[..., 0]
        torch.testing.assert_close(lp, ref, rtol=1e-5, atol=1e-5)
        assert (lp <= 1e-6).all()

    def test_bidirectional_when_declared(self, wrapper):
        if "bidirectional" not in wrapper.capabilities:
            pytest.skip("not bidirectional")
        ids = torch.tensor([self._ids(wrapper)])
        other = ids.clone()
        other[0, -1] = wrapper.mask_token_id
        a, b = wrapper.logits(ids), wrapper.logits(other)
        assert not torch.allclose(a[0, 0], b[0, 0])

    def test_left_padding_is_invisible(self, wrapper):
        if wrapper.kind != "masked":
            pytest.skip("padding contract below is for masked diffusion")
        ids = torch.tensor([self._ids(wrapper)])
        pad = 3
        padded = torch.cat([torch.full((1, pad), wrapper.pad_token_id), ids], 1)
        mask = torch.cat([torch.zeros(1, pad, dtype=torch.long), torch.ones_like(ids)], 1)
        a = wrapper.logits(ids)
        b = wrapper.logits(padded, mask)[:, pad:]
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)

    def test_save_load_round_trip(self, spec, wrapper, tmp_path):
        wrapper.save_pretrained(str(tmp_path / "copy"))
        again = spec.load(str(tmp_path / "copy"), dtype=torch.float32, device="cpu")
        ids = torch.tensor([self._ids(wrapper)])
        torch.testing.assert_close(wrapper.logits(ids), again.logits(ids), rtol=0, atol=0)
        assert again.mask_token_id == wrapper.mask_token_id

    def test_meta_load_is_the_structure(self, spec, wrapper, checkpoint):
        """``device="meta"`` (a sharding engine's load): the same parameters, names, shapes, dtypes
        and ties, none with storage; the same buffers and token ids."""
        meta = spec.load(checkpoint, dtype=torch.float32, device="meta")

        def params(module):
            return {n: (p.shape, p.dtype) for n, p in module.named_parameters(remove_duplicate=False)}

        def ties(module):
            groups: dict = {}
            for n, p in module.named_parameters(remove_duplicate=False):
                groups.setdefault(id(p), []).append(n)
            return sorted(map(sorted, groups.values()))

        assert params(meta.module) == params(wrapper.module)
        assert ties(meta.module) == ties(wrapper.module)
        assert all(p.is_meta for p in meta.module.parameters())
        full = dict(wrapper.module.named_buffers())
        assert all(torch.equal(b, full[n]) for n, b in meta.module.named_buffers())
        assert (meta.mask_token_id, meta.eos_token_id) == (wrapper.mask_token_id, wrapper.eos_token_id)

    def test_default_rollout_generates(self, dare, spec, wrapper):
        rspec = dare.registries.rollouts.get(spec.default_rollout)
        names = {f.name for f in attrs.fields(rspec.config_cls)}
        small = {k: v for k, v in dict(gen_length=8, block_length=8, steps=4, temperature=0.0).items() if k in names}
        cfg, problems = structure(rspec.config_cls, small)
        assert not problems, problems
        backend = rspec.build(cfg)
        ids = [self._ids(wrapper, "a"), self._ids(wrapper, "a longer prompt")]
        from dare_core.workflows.batching import left_pad

        pid, pmask = left_pad(ids, wrapper.pad_token_id)
        out = backend.generate(wrapper, pid, pmask, generator=torch.Generator().manual_seed(0))
        assert out.response_ids.shape[0] == 2
        assert not (out.response_ids == wrapper.mask_token_id).any()

    def test_default_rollout_steps_in_lockstep(self, dare, spec, wrapper):
        """The rollout-backend contract under collective forwards (docs/engines.md, "Lockstep"):
        every forward runs through ``wrapper.module``, so a rank that has finished keeps stepping
        while another rank decodes (here: 3 more steps) with its responses unchanged — or the
        backend refuses such engines in one line."""
        from dare_core.engines.lockstep import lockstep
        from dare_core.errors import DareError
        from dare_core.workflows.batching import left_pad

        rspec = dare.registries.rollouts.get(spec.default_rollout)
        names = {f.name for f in attrs.fields(rspec.config_cls)}
        cfg, _ = structure(
            rspec.config_cls, {k: v for k, v in dict(gen_length=8, block_length=8, steps=4).items() if k in names}
        )
        pid, pmask = left_pad([self._ids(wrapper, "a"), self._ids(wrapper, "a longer prompt")], wrapper.pad_token_id)
        polls: list[bool] = []

        class Straggler:  # the engine of rank 0 of 2, whose other rank decodes 3 steps longer
            collective_forwards, world_size = True, 2

            def any_active(self, local: bool) -> bool:
                polls.append(local)
                return local or polls.count(False) <= 3

        forwards = [0]
        hook = wrapper.module.register_forward_pre_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
        try:
            with torch.no_grad():
                alone = rspec.build(cfg).generate(wrapper, pid, pmask, generator=torch.Generator().manual_seed(0))
                own = forwards[0]
                try:
                    with lockstep(Straggler(), wrapper, pid, pmask):
                        out = rspec.build(cfg).generate(wrapper, pid, pmask, generator=torch.Generator().manual_seed(0))
                except DareError as exc:  # refused where forwards are collective: one line
                    assert "\n" not in str(exc) and forwards[0] == own
                    return
        finally:
            hook.remove()
        assert own > 0 and polls == [True] * own + [False] * 4, "forwards bypass wrapper.module"
        assert forwards[0] == 2 * own + 3
        assert torch.equal(out.response_ids, alone.response_ids)

    @pytest.mark.parametrize(
        "device,dtype",
        [
            ("cpu", torch.float32),
            pytest.param("cuda", torch.float32, marks=_NEEDS_CUDA),
            pytest.param("cuda", torch.bfloat16, marks=_NEEDS_CUDA),
        ],
    )
    def test_packed_kernels_match_padded(self, spec, checkpoint, device, dtype):
        """Every packed-attention kernel the device runs gives the padded path's log-probs and
        gradients; a :class:`DocumentMask` reaches the module's attention like a boolean mask."""
        from dare_core.ops.attention import DocumentMask, available_kernels
        from dare_core.ops.packing import plan_packing
        from dare_core.ops.paths import configure_training_paths

        wrapper = spec.load(checkpoint, dtype=dtype, device=device)
        if not wrapper.supports_packing() or wrapper.kind != "masked":  # block layouts: dare_nn.block_packing
            pytest.skip("family does not pack sequences with document kernels")
        ids, mask = _ragged_batch(wrapper, device)
        plan = plan_packing(mask)
        with torch.no_grad():
            packed = plan.pack(ids, wrapper.pad_token_id)
            a = wrapper.module(
                input_ids=packed, attention_mask=plan.attention_mask(), position_ids=plan.position_ids
            ).logits
            b = wrapper.module(
                input_ids=packed, attention_mask=DocumentMask(plan.doc_ids, "sdpa_mask"), position_ids=plan.position_ids
            ).logits
        torch.testing.assert_close(a, b, rtol=0, atol=0)

        def run(attention: str, kernel: str = "auto"):
            configure_training_paths(wrapper, attention, "naive", device, attention_kernel=kernel)
            wrapper.module.zero_grad(set_to_none=True)
            lp = wrapper.token_logprobs(ids, ids, mask)
            (-(lp.float() * mask).sum()).backward()  # valid positions only (padding differs by path)
            grads = torch.cat([p.grad.float().reshape(-1) for p in wrapper.module.parameters() if p.grad is not None])
            return lp.detach().float()[mask.bool()], grads

        def rel(x, y):
            return float((x - y).norm() / y.norm().clamp_min(1e-30))

        ref_lp, ref_g = run("padded")
        tol = 1e-4 if dtype == torch.float32 else 3e-2
        for kernel in available_kernels(device, dtype):
            lp, g = run("packed", kernel)
            assert wrapper.attention_kernel == kernel
            assert rel(lp, ref_lp) < tol and rel(g, ref_g) < 10 * tol, (kernel, rel(lp, ref_lp), rel(g, ref_g))


def _ragged_batch(wrapper, device, lengths=((5, 20), (12, 6), (3, 33), (9, 11), (4, 2))):
    """Left-padded prompts and right-padded responses of random ordinary tokens."""
    vocab = int(wrapper.module.get_input_embeddings().num_embeddings)
    special = {wrapper.mask_token_id, wrapper.eos_token_id, wrapper.pad_token_id, *wrapper.stop_token_ids}
    allowed = torch.tensor([i for i in range(min(vocab, 256)) if i not in special])
    g = torch.Generator().manual_seed(5)
    p, r = max(x for x, _ in lengths), max(y for _, y in lengths)
    ids = torch.full((len(lengths), p + r), wrapper.pad_token_id)
    mask = torch.zeros_like(ids)
    for i, (x, y) in enumerate(lengths):
        ids[i, p - x : p + y] = allowed[torch.randint(0, allowed.numel(), (x + y,), generator=g)]
        mask[i, p - x : p + y] = 1
    return ids.to(device), mask.to(device)


class AlgorithmContract(_PluginSuite):
    """What every algorithm must do, checked on the family-free toy model."""

    algorithm: ClassVar[str] = ""
    #: ``"module:function"`` making the toy wrapper of the partition check, and its tolerance
    partition_toy: ClassVar[str] = "dare_core.testing.toy:make_toy_wrapper"
    partition_tol: ClassVar[float] = 1e-6

    @pytest.fixture(scope="class")
    @classmethod
    def spec(cls, dare):
        return dare.registries.algorithms.get(cls.algorithm)

    @pytest.fixture(scope="class")
    @classmethod
    def config(cls, spec):
        cfg, problems = structure(spec.config_cls, {})
        assert not problems, problems
        return cfg

    @pytest.fixture(scope="class")
    @classmethod
    def components(cls, dare, spec, config):
        return build_components(dare, spec, config)

    def test_config_is_documented_and_frozen(self, spec, config):
        assert attrs.has(spec.config_cls)
        for f in attrs.fields(spec.config_cls):
            assert f.metadata.get("help"), f"{spec.name}.{f.name} has no help text"
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            setattr(config, attrs.fields(spec.config_cls)[0].name, None)

    def test_components_registered(self, dare, spec):
        regs = dare.registries
        assert spec.workflow in regs.workflows, (
            f"workflow {spec.workflow!r} is not registered; require the distribution that provides it"
        )
        where = {
            "corruption": regs.corruptions,
            "estimator": regs.estimators,
            "loss": regs.losses,
            "advantage": regs.advantages,
            "trajectory": regs.trajectories,
        }
        for role, names in spec.components.items():
            for name in (names,) if isinstance(names, str) else names:
                assert name in where[role], f"{role} {name!r} is not registered"

    def test_components_are_declared(self, spec):
        """The spec names the components ``build`` composes (the lookup refuses any other), so the
        loader and the CLI check them against the model before any work."""
        assert spec.components, f"{spec.name} declares no components (AlgorithmSpec.components)"
        assert set(spec.components) <= set(ROLES), sorted(set(spec.components) - set(ROLES))

    def test_trajectory_records_are_declared(self, dare, spec, config):
        """The built trajectory builder records only what ``RolloutNeeds.records`` declares: the
        loader and the CLI read the spec, never a build."""
        comps = build_components(dare, spec, config)
        trajectory = comps.trajectory if isinstance(comps, RLComponents) else None
        records = trajectory.records if trajectory is not None else frozenset()
        assert records <= spec.rollout.records, (
            f"{spec.name}'s trajectory records {sorted(records - spec.rollout.records)}, not in RolloutNeeds.records"
        )

    def test_members_the_loops_call_are_declared(self, dare, spec, components):
        """``build`` returns its workflow's bundle (:attr:`WorkflowSpec.components`), whose loss
        has the members of its seam (``totals``, which the loop normalises by); an RL bundle's
        members are those the interfaces declare."""
        bundle = dare.registries.workflows.get(spec.workflow).components
        assert isinstance(components, bundle) and isinstance(components.loss, bundle.loss_seam)
        if not isinstance(components, RLComponents):
            pytest.skip("not an RL algorithm")
        traj = components.trajectory
        if traj is not None:
            assert isinstance(traj.records, frozenset) and callable(traj.rows)
        if components.accumulate is not None:
            assert callable(components.accumulate.accumulate)
            assert isinstance(components.accumulate.computes_own_old, bool)

    def test_unknown_option_rejected(self, spec):
        _, problems = structure(spec.config_cls, {"definitely_not_an_option": 1}, "algorithm")
        assert problems and "unknown key" in problems[0]

    def _rows(self, components, wrapper, config):
        """``TrainingRows`` of one rollout (:func:`toy_rows`) of ``components`` built on ``config``."""
        return toy_rows(self.plugins, self.algorithm, components, wrapper, config=config)

    def test_gradient_does_not_depend_on_the_partition(self, spec):
        """One normalisation over the global mini-batch: micro-batches of 1, 2 and all rows, and
        2 gloo ranks, give the same gradient on rows of different lengths, for every
        ``loss_agg_mode`` the algorithm offers (:func:`check_partition_invariance`)."""
        if spec.workflow not in ("rl", "sft"):
            pytest.skip("an RL or SFT algorithm")
        from dare_core.testing.algorithm_checks import check_partition_invariance

        check_partition_invariance(self.plugins, self.algorithm, self.partition_tol, self.partition_toy)

    def test_one_update_is_finite_and_moves_parameters(self, spec, components, config):
        wrapper = make_toy_wrapper()
        rows = self._rows(components, wrapper, config)
        batch, corrupted = rows.batch, _corrupted(components, wrapper, rows)
        logp = components.estimator(wrapper, batch, corrupted)
        if spec.workflow == "rl":
            with torch.no_grad():
                old = components.estimator(wrapper, batch, corrupted)
            kw = {"extras": rows.extras} if rows.extras else {}
            loss, metrics = components.loss(logp, old, old, rows.advantages, rows.loss_weights(), **kw)
        elif spec.workflow == "preference":
            # the preference seam is loss(logp, ref_logp, batch) over interleaved (chosen,
            # rejected) rows; a reference that differs from the policy gives a non-zero margin
            with torch.no_grad():
                ref = components.estimator(wrapper, batch, corrupted)
                ref = ref - torch.linspace(0.0, 0.3, ref.shape[-1], dtype=ref.dtype)
            loss, metrics = components.loss(logp, ref, batch)
        else:
            loss, metrics = components.loss(logp, corrupted, batch)
        assert torch.isfinite(loss)
        assert all(isinstance(v, float) for v in metrics.values())
        loss.backward()
        grads = [p.grad for p in wrapper.module.parameters() if p.grad is not None]
        assert grads and any(g.abs().sum() > 0 for g in grads)

    def test_own_old_logprobs_give_the_same_gradient(self, spec, components, config):
        """``trainer.reuse_logprob``: with one optimizer step per batch the RL loop takes the old
        log-likelihoods from the update's own forward (detached), or calls
        ``Components.accumulate`` with ``old_logp=None`` when it declares ``computes_own_old``; the loss and the
        gradient must equal those with a separate gradient-free old pass."""
        if spec.workflow != "rl":
            pytest.skip("not an RL algorithm")
        from dare_core.workflows.rl import PolicyObjective, rows_update_batch

        wrapper = make_toy_wrapper()
        rows = self._rows(components, wrapper, config)
        batch, corrupted = rows.batch, _corrupted(components, wrapper, rows)
        with torch.no_grad():
            old = components.estimator(wrapper, batch, corrupted)
        accumulating = components.accumulate is not None and corrupted is not None
        if accumulating and not components.accumulate.computes_own_old:
            pytest.skip("the loop gives this loss a separate old pass (no computes_own_old)")

        def run(own: bool):
            wrapper.module.zero_grad()
            part = rows_update_batch(rows, corrupted, None if own else old, old)
            objective = PolicyObjective(components, wrapper)
            loss, _ = objective.backward(part, objective.totals(part), 1.0)
            grads = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in wrapper.module.parameters()]
            return float(loss), grads

        (l_sep, g_sep), (l_own, g_own) = run(False), run(True)
        assert l_own == pytest.approx(l_sep, rel=1e-5, abs=1e-7)
        assert any(g.abs().sum() > 0 for g in g_sep), "the loss has no gradient"
        for a, b in zip(g_sep, g_own):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-7)

    def test_corruption_is_drawn_once_and_reused(self, spec, components, config):
        wrapper = make_toy_wrapper()
        rows = self._rows(components, wrapper, config)
        corrupted = _corrupted(components, wrapper, rows)
        if corrupted is None:
            pytest.skip("no corruption")
        with torch.no_grad():
            a = components.estimator(wrapper, rows.batch, corrupted)
            b = components.estimator(wrapper, rows.batch, corrupted)
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def _corrupted(components, wrapper, rows):
    """The states the rows bring (from the rollout record), else one draw of the algorithm's
    corruption; ``None`` when it has neither."""
    if rows.corrupted is not None or components.corruption is None:
        return rows.corrupted
    return components.corruption(wrapper, rows.batch, torch.Generator().manual_seed(0))


def _rl_members(components: Any) -> tuple[Any, Any]:
    """``(trajectory, advantage)`` of an RL bundle; ``(None, None)`` for another workflow's."""
    if isinstance(components, RLComponents):
        return components.trajectory, components.advantage
    return None, None


def _rollout(plugins, algorithm, components, wrapper, lengths=None, config=None):
    """A random rollout (response lengths ``lengths``, default all full), or (when the trajectory
    builder asks for records, or the algorithm adjusts or wraps its rollout) a real one from the
    core sampler recording them, through the algorithm's :class:`RolloutNeeds` (on the algorithm
    ``config`` the components were built with; default: its defaults)."""
    roll = fake_rollout(wrapper)
    if lengths is not None:
        keep = torch.arange(roll.response_ids.shape[1])[None] < torch.tensor(lengths)[:, None]
        roll = attrs.evolve(roll, response_mask=keep.long())
    trajectory, _ = _rl_members(components)
    records = trajectory.records if trajectory is not None else frozenset()
    dare = build_for(*plugins)
    algo = dare.registries.algorithms.get(algorithm)
    needs = algo.rollout
    if not records and needs.adjust is None and needs.wrap is None:
        return roll
    spec = _recording_backend(dare, wrapper, records, needs.methods)
    cfg, problems = structure(spec.config_cls, dict(gen_length=8, block_length=4, steps=4, temperature=1.0), "rollout")
    assert not problems, problems
    run = RunConfig(  # the rollout's rows are one prompt's group
        algo=algorithm,
        algorithm=algo.config_cls() if config is None else config,
        rollout=cfg,
        trainer=TrainerConfig(group_size=roll.prompt_ids.shape[0]),
    )
    backend = spec.build(cfg if needs.adjust is None else needs.adjust(run.algorithm, cfg))
    if needs.wrap is not None:
        backend = needs.wrap(backend, run)
    return backend.generate(
        wrapper, roll.prompt_ids, roll.prompt_mask, record=records, generator=torch.Generator().manual_seed(0)
    )


def toy_rows(plugins, algorithm, components, wrapper, lengths=None, config=None):
    """``TrainingRows`` of one 4-row rollout (:func:`_rollout`; the algorithm's trajectory builder,
    the final sequence when it has none; ``config``: the algorithm config of ``components``)."""
    from dare_core.components import FinalSequence
    from dare_core.interfaces import TrajectoryContext

    roll = _rollout(plugins, algorithm, components, wrapper, lengths, config)
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0])
    groups = torch.tensor([0, 0, 1, 1])
    trajectory, advantage = _rl_members(components)
    adv = advantage(rewards, groups) if advantage is not None else rewards

    def score(ids, mask, rows):  # a reward that depends on the response tokens
        return ((ids % 3 == 0).float() * mask).sum(-1) / mask.sum(-1).clamp_min(1)

    traj = trajectory or FinalSequence()
    return traj.rows(wrapper, roll, TrajectoryContext(rewards, adv, groups, score))
