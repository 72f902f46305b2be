"""d-TreeRPO (arXiv:2512.09675): branch-point / schedule / tree-advantage oracles, the tree
rollout (resumed partial denoising = one uninterrupted run), the transition rows, hand-computed
losses (clip without dual clip, k3 KL, self-distillation), contract, states once per batch."""

import math

import pytest
import torch

import dare_plugin_dtreerpo
from dare_core.api import sum_totals
from dare_core.config.structure import structure
from dare_core.errors import DareError
from dare_core.interfaces.rows import TrajectoryContext
from dare_core.testing import make_toy_wrapper, toy
from dare_core.testing.contracts import AlgorithmContract
from dare_core.testing.rl_probe import assert_one_draw_per_batch, spy_run
from dare_plugin_dtreerpo.algorithm import (
    DTreeConfig,
    TreeLoss,
    TreeRollout,
    TreeTransitions,
    branch_points,
    sd_schedule,
    sibling_distillation,
    tree_values_and_advantages,
)
from dare_plugin_samplers.low_confidence import LowConfidenceConfig, LowConfidenceSampler

TREE_2X2 = {"num_tree_samples": 2, "branch_factor": 2}


class TestDTreeContract(AlgorithmContract):
    algorithm = "dtreerpo"
    plugins = (dare_plugin_dtreerpo,)

    @pytest.fixture(scope="class")
    @classmethod
    def config(cls, spec):  # a 2 x 2 tree: the contract's 4 rollout rows are one prompt's leaves
        cfg, problems = structure(spec.config_cls, TREE_2X2)
        assert not problems, problems
        return cfg

    def test_gradient_does_not_depend_on_the_partition(self, spec, monkeypatch):
        """The contract's check on the 2 x 2 tree (the default tree needs trainer.group_size)."""
        from dare_core.testing import algorithm_checks

        monkeypatch.setattr(algorithm_checks, "_options", lambda plugins, algo: [TREE_2X2])
        algorithm_checks.check_partition_invariance(self.plugins, self.algorithm)


def test_branch_points_and_schedule_oracles():
    assert branch_points(128, 2) == [128, 64, 0]
    assert branch_points(20, 3) == [20, 14, 7, 0]
    kw = dict(max_steps=30000, lambda_max=3e-3, gamma=2.0, tau_max=2.0, beta=0.7)
    for step, lam, tau in [(0, 0.0, 2.0), (100, 3.1408e-6, 1.99533), (1000, 3.2371e-5, 1.95310), (30000, 3e-3, 1e-6)]:
        got = sd_schedule(step, **kw)
        assert got[0] == pytest.approx(lam, rel=1e-4, abs=1e-12)
        assert got[1] == pytest.approx(tau, rel=1e-5)


def test_tree_advantage_oracle():
    """root → c1, c2; c1 leaves [1, 0], c2 leaves [1, 1]."""
    level1, leaves = tree_values_and_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), [2, 2])
    torch.testing.assert_close(level1, torch.tensor([-0.5, 0.5]))
    torch.testing.assert_close(leaves, torch.tensor([1.0, -1.0, 0.0, 0.0]))
    # no std normalisation, mean of the *other* siblings as baseline (3 siblings)
    (adv,) = tree_values_and_advantages(torch.tensor([1.0, 0.0, 0.0]), [3])
    torch.testing.assert_close(adv, torch.tensor([1.0, -0.5, -0.5]))


def _tree(widths=(2, 2), steps=4):
    w = make_toy_wrapper()
    sampler = LowConfidenceSampler(LowConfidenceConfig(gen_length=8, block_length=8, steps=steps, temperature=1.0))
    tree = TreeRollout(sampler, widths[0], widths[1], 2)
    leaves = widths[0] * widths[1]
    prompts = torch.randint(4, 60, (2, 5), generator=torch.Generator().manual_seed(0)).repeat_interleave(leaves, 0)
    pmask = torch.ones_like(prompts)
    roll = tree.generate(w, prompts, pmask, generator=torch.Generator().manual_seed(1))
    return w, roll, prompts


def test_tree_rollout_structure():
    w, roll, prompts = _tree()
    level1, leaves = roll.extras["tree_states"]
    assert level1.shape == (4, 8) and leaves.shape == (8, 8)
    assert torch.equal(roll.response_ids, leaves) and torch.equal(roll.prompt_ids, prompts)
    # half of the tokens are decided at the branch point; every leaf keeps its parent's tokens
    assert ((level1 != w.mask_token_id).sum(1) == 4).all()
    parent = level1.repeat_interleave(2, 0)
    kept = parent != w.mask_token_id
    assert torch.equal(leaves[kept], parent[kept]) and not (leaves == w.mask_token_id).any()
    assert (roll.reveal_step[kept] < 2).all() and (roll.reveal_step[~kept] >= 2).all()
    small = TreeRollout(LowConfidenceSampler(LowConfidenceConfig(gen_length=8, block_length=8, steps=4)), 2, 2, 2)
    with pytest.raises(DareError, match="group_size"):
        small.generate(w, prompts[:6], torch.ones_like(prompts[:6]))


def test_transition_rows():
    w, roll, prompts = _tree()
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0])
    ctx = TrajectoryContext(rewards, torch.zeros(8), torch.arange(8) // 4, lambda *a: None, step=100)
    sched = dict(max_steps=30000, lambda_max=3e-3, gamma=2.0, tau_max=2.0, beta=0.7)
    rows = TreeTransitions(sched).rows(w, roll, ctx)
    level1, leaves = roll.extras["tree_states"]
    P = rows.batch.prompt_len
    assert rows.num_rows == 4 + 8
    # level-1 rows: parent = all MASK, child = level-1 state; leaf rows: parent = level-1 node
    assert (rows.corrupted.noisy_ids[0, :4, P:] == w.mask_token_id).all()
    assert torch.equal(rows.batch.input_ids[:4, P:], level1)
    assert torch.equal(rows.corrupted.noisy_ids[0, 4:, P:], level1.repeat_interleave(2, 0))
    assert torch.equal(rows.batch.input_ids[4:, P:], leaves)
    torch.testing.assert_close(rows.advantages, torch.tensor([-0.5, 0.5, -0.5, 0.5, 1, -1, 0, 0, 0, 0, -1, 1.0]))
    assert rows.extras["parent_id"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    moved = rows.corrupted.masked[0, :, P:]
    assert torch.equal(
        moved,
        (rows.corrupted.noisy_ids[0, :, P:] == w.mask_token_id) & (rows.batch.input_ids[:, P:] != w.mask_token_id),
    )
    assert not (rows.weights.bool() & ~moved).any()
    assert rows.extras["sd_lambda"][0].item() == pytest.approx(3.1408e-6, rel=1e-4)


def test_policy_and_kl_hand_computed():
    loss = TreeLoss(clip_ratio=0.4, kl_coef=0.5, self_distillation=False)
    old = torch.zeros(2, 3)
    new = torch.tensor([[math.log(2.0), 0.0, 0.0], [math.log(0.5), 0.0, 0.0]])
    active = torch.tensor([[1.0, 1, 0], [1, 0, 0]])
    adv = torch.tensor([1.0, -1.0])
    total, m = loss(new, old, new, adv, active)  # ref = new: KL 0
    # row 0: min(2·1, 1.4·1) = 1.4 and 1 → mean 1.2; row 1: min(0.5·-1, 0.6·-1) = -0.6 (no dual clip)
    assert total.item() == pytest.approx(-(1.2 + -0.6) / 2, abs=1e-6)
    total_kl, m = loss(old, old, old - 1.0, adv, active)  # d = -1: e^-1 + 1 - 1
    kl = math.exp(-1.0)
    assert m["kl_loss"] == pytest.approx(kl, abs=1e-6)
    assert total_kl.item() == pytest.approx(-(1.0 - 1.0) / 2 + 0.5 * kl, abs=1e-6)
    # a gap of 200 nats (e^200 overflows float32) on an inactive position: finite loss and gradient
    far = old.clone().requires_grad_(True)
    total_far, m = loss(far, old, old + torch.tensor([[0.0, 0.0, 200.0], [0.0, 0.0, 0.0]]), adv, active)
    total_far.backward()
    assert m["kl_loss"] == pytest.approx(0.0, abs=1e-6) and bool(torch.isfinite(far.grad).all())


def _sd(logp, active, adv, parent, tokens, tau=1.0):
    """The self-distillation term of ``TreeLoss`` on these rows (statistics of the whole set)."""
    extras = {
        "parent_id": parent,
        "sd_lambda": torch.ones(len(adv), dtype=torch.float64),
        "sd_tau": torch.full((len(adv),), tau, dtype=torch.float64),
        **sibling_distillation(active, adv, parent, tokens, tau),
    }
    _, m = TreeLoss(kl_coef=0.0)(logp, logp.detach(), None, adv, active, extras=extras)
    return m.get("sd_loss", 0.0)


def test_self_distillation_hand_computed():
    """Two positive siblings with advantages a and b (τ = 1) agree at position 0 and differ at 1."""
    logp = torch.tensor([[-0.5, -1.0], [-0.5, -2.0], [-3.0, -3.0]])
    tokens = torch.tensor([[7, 8], [7, 9], [5, 5]])
    active = torch.ones(3, 2)
    adv = torch.tensor([1.0, 0.5, -1.5])
    parent = torch.tensor([0, 0, 0])
    wa, wb = torch.softmax(torch.tensor([1.0, 0.5]), 0).tolist()
    kl0 = 1.0 * (0.0 - (-0.5))  # q = 1 on token 7
    kl1 = wa * (math.log(wa) + 1.0) + wb * (math.log(wb) + 2.0)
    assert _sd(logp, active, adv, parent, tokens) == pytest.approx((kl0 + kl1) / 2, abs=1e-6)
    assert sibling_distillation(active, adv, parent, tokens, 1.0)["sd_cells"].sum().item() == pytest.approx(2.0)
    # singleton groups and groups without a positive sibling contribute nothing
    assert _sd(logp, active, -adv.abs(), parent, tokens) == 0.0
    assert _sd(logp[:1], active[:1], adv[:1], parent[:1], tokens[:1]) == 0.0


def _tree_batch(seed: int = 0, groups: int = 4, width: int = 3, R: int = 6):
    """Transitions of ``groups`` sibling groups of ``width`` with ragged active masks (fp64)."""
    g = torch.Generator().manual_seed(seed)
    N = groups * width
    active = (torch.rand(N, R, generator=g) < 0.6).double()
    active[0] = 0.0  # a row without active positions
    tokens = torch.randint(5, 8, (N, R), generator=g)
    adv = torch.randn(N, generator=g, dtype=torch.float64)
    parent = torch.arange(N) // width
    extras = {
        "parent_id": parent,
        "sd_lambda": torch.full((N,), 0.7, dtype=torch.float64),
        "sd_tau": torch.full((N,), 0.5, dtype=torch.float64),
        **sibling_distillation(active, adv, parent, tokens, 0.5),
    }
    logp = -torch.rand(N, R, generator=g, dtype=torch.float64) * 3
    old = logp + 0.3 * torch.randn(N, R, generator=g, dtype=torch.float64)
    ref = logp + 0.3 * torch.randn(N, R, generator=g, dtype=torch.float64)
    return logp, old, ref, adv, active, extras


def _split_loss_and_grad(loss_fn, logp, old, ref, adv, active, extras, parts):
    """Σ over ``parts`` (row index tensors) of the loss with the summed totals, and its gradient."""
    x = logp.clone().requires_grad_(True)
    pick = lambda idx: {k: v[idx] for k, v in extras.items()}  # noqa: E731
    T = sum_totals([loss_fn.totals(active[idx], pick(idx)) for idx in parts])
    total = sum(
        loss_fn(x[idx], old[idx], ref[idx], adv[idx], active[idx], extras=pick(idx), totals=T)[0] for idx in parts
    )
    total.backward()
    return total.detach(), x.grad


def test_loss_is_the_mini_batch_loss_for_every_split_and_shuffle():
    """Siblings are grouped over the whole batch: the loss and its gradient do not depend on how
    the rows are shuffled and split into micro-batches (pg, KL and self-distillation terms)."""
    loss_fn = TreeLoss(clip_ratio=0.2, kl_coef=0.3)
    logp, old, ref, adv, active, extras = _tree_batch()
    N = len(adv)
    whole, g_whole = _split_loss_and_grad(loss_fn, logp, old, ref, adv, active, extras, [torch.arange(N)])
    standalone = loss_fn(logp, old, ref, adv, active, extras=extras)[0]
    torch.testing.assert_close(standalone, whole, rtol=0, atol=1e-12)
    assert extras["sd_weight"].sum() > 0 and loss_fn(logp, old, ref, adv, active, extras=extras)[1]["sd_loss"] != 0
    for seed, size in [(1, 1), (2, 2), (3, 5), (4, 7)]:
        perm = torch.randperm(N, generator=torch.Generator().manual_seed(seed))
        parts = list(perm.split(size))
        got, grad = _split_loss_and_grad(loss_fn, logp, old, ref, adv, active, extras, parts)
        torch.testing.assert_close(got, whole, rtol=0, atol=1e-10)
        torch.testing.assert_close(grad, g_whole, rtol=0, atol=1e-10)


def test_config_and_group_size_errors():
    cfg = DTreeConfig()
    assert cfg.tree_samples(16) == 4 and cfg.tree_samples(8) == 2
    with pytest.raises(DareError, match="multiple"):
        cfg.tree_samples(6)
    with pytest.raises(DareError, match="group_size=16"):
        DTreeConfig(num_tree_samples=4).tree_samples(8)
    _, problems = structure(DTreeConfig, {"clip_ratio": 0.0, "branch_factor": 0}, "algorithm")
    assert len(problems) == 2


def test_states_built_once_per_rollout_batch_and_shared_by_old_ref_new(tmp_path):
    log = spy_run(
        tmp_path,
        dare_plugin_dtreerpo,
        "dtreerpo",
        toy,
        [
            "trainer.ppo_epochs=2",
            "trainer.micro_batch_size=5",
            "rollout.gen_length=4",
            "rollout.block_length=4",
            "rollout.steps=4",
            "algorithm.branch_factor=2",
            "algorithm.sd_max_steps=4",
        ],
    )
    assert_one_draw_per_batch(log, steps=2)


# ---------------------------------------------------------------- block diffusion (BD3LM layout)
def _block_tree():
    """Two prompts of one full block, 12 response tokens = 3 blocks of 4, 2 iterations per block
    (6 global steps): the tree branches at step 3, in the middle of the second block."""
    from dare_nn.testing.toy_block import make_toy_block_wrapper
    from dare_plugin_samplers.block import BlockRolloutConfig, BlockSampler

    w = make_toy_block_wrapper(seed=1)
    assert w.block_size == 4
    sampler = BlockSampler(
        BlockRolloutConfig(
            gen_length=12, steps=2, temperature=1.0, remasking="low_confidence_static", stop_at_stop_token=False
        )
    )
    tree = TreeRollout(sampler, 2, 2, 2)
    prompts = torch.randint(4, 60, (2, 4), generator=torch.Generator().manual_seed(0)).repeat_interleave(4, 0)
    roll = tree.generate(w, prompts, torch.ones_like(prompts), generator=torch.Generator().manual_seed(1))
    return w, roll, prompts


def test_block_tree_branches_inside_a_block():
    w, roll, _ = _block_tree()
    level1, leaves = roll.extras["tree_states"]
    mask_id = w.mask_token_id
    # after 3 of 6 iterations: block 0 complete, block 1 half decided, block 2 untouched
    assert not (level1[:, :4] == mask_id).any()
    assert ((level1[:, 4:8] != mask_id).sum(1) == 2).all()
    assert (level1[:, 8:] == mask_id).all()
    parent = level1.repeat_interleave(2, 0)
    kept = parent != mask_id
    assert torch.equal(leaves[kept], parent[kept]) and not (leaves == mask_id).any()
    assert (roll.reveal_step[kept] < 3).all() and (roll.reveal_step[~kept] >= 3).all()
    assert roll.num_steps == 6


def test_block_transition_logprobs_condition_on_the_parent_block_and_the_child_prefix():
    """On a block model a transition's ℓ_j is read through the BD3LM layout: position j of block
    b sees the parent's state of block b and the child's (complete) blocks before b — the context
    the sampler decoded it in, up to the mean-field step (an independent block-causal forward)."""
    w, roll, _ = _block_tree()
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0])
    ctx = TrajectoryContext(rewards, torch.zeros(8), torch.arange(8) // 4, lambda *a: None, step=1)
    rows = TreeTransitions().rows(w, roll, ctx)
    from dare_core.components.estimators import ResponseTokenLogProb  # d-TreeRPO's estimator

    est = ResponseTokenLogProb()(w, rows.batch, rows.corrupted)[0]  # [rows, R]
    P = rows.batch.prompt_len
    child = rows.batch.input_ids[:, P:]
    parent = rows.corrupted.noisy_ids[0, :, P:]
    checked = 0
    with torch.no_grad():
        for r in range(rows.num_rows):
            for b in range(3):
                lo, hi = 4 * b, 4 * b + 4
                moved = rows.weights[r, lo:hi] > 0
                if not moved.any():
                    continue
                x = torch.cat([rows.batch.input_ids[r : r + 1, :P], child[r : r + 1, :lo], parent[r : r + 1, lo:hi]], 1)
                want = torch.log_softmax(w.logits(x)[0, P + lo : P + hi].float(), -1)
                want = want.gather(-1, child[r, lo:hi, None]).squeeze(-1)
                torch.testing.assert_close(est[r, lo:hi][moved], want[moved], rtol=1e-4, atol=1e-5)
                checked += int(moved.sum())
    assert checked == int((rows.weights > 0).sum()) > 0


def test_one_rl_step_on_the_block_toy(tmp_path):
    from dare_core.testing.algorithm_checks import one_rl_step
    from dare_nn.testing import toy_block

    rec = one_rl_step(
        (toy_block, dare_plugin_dtreerpo),
        "dtreerpo",
        "block_toy",
        tmp_path,
        ["algorithm.branch_factor=2"],
        gen_length=8,
    )
    assert rec["tree_rows"] == 2 * (2 + 4) and rec["grad_norm"] > 0
