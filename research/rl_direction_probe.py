"""Does one policy-gradient step of an RL algorithm improve what it should?

    python research/rl_direction_probe.py --algo d1 --model llada [--prompts 32] [--group 8]
        [--step-norm 0.008] [--samples 16] [--sign] [KEY=VALUE ...]

Takes the first ``--prompts`` training prompts of the run's task, rolls out ``--group`` responses
each with the run's training sampler, and computes the algorithm's loss gradient ``g`` exactly as
the RL loop does (advantages, trajectory rows, one corruption draw, estimator, loss; old
log-likelihoods = the update's own, as with one optimizer step per batch). It then moves the
weights by ``--step-norm`` (in parameter L2 norm) along

* ``-g`` (the direction training takes), ``+g`` (the opposite), and a random direction and its
  negative (a control: how much any step of that size changes the samples),
* with ``--sign``, also ``-sign(g)`` and ``+sign(g)``: the direction of Adam's first step
  (``m / sqrt(v)`` after one step is ``g / |g|`` per weight), to see whether the per-weight
  normalisation of the optimizer the runs use keeps the gradient's effect,

and evaluates each on the same prompts, ``--samples`` sampled responses per prompt with the run's
evaluation sampler (``eval.temperature``, default 1.0 here) and *common random numbers*: every
evaluation uses the same sampling noise, so a difference is the step's effect, not sampling luck.
For every direction it prints accuracy and reward and how many samples flipped to solved / to
unsolved against no step. An algorithm whose ``-g`` row is worse than its ``+g`` row is moving
the policy the wrong way on the prompts it trains on (docs/results.md).
Any ``KEY=VALUE`` is a run-config override (e.g. ``task.reward=acc``, ``rollout.backend=fast``).
"""

from __future__ import annotations

import argparse

import torch

from dare_core.api import (
    DareError,
    FinalSequence,
    GroupNormAdvantage,
    PolicyObjective,
    RLComponents,
    UpdatePlan,
    backward_minibatch,
    build,
    collect,
    evaluate,
    resolve,
    rows_update_batch,
    run_script,
    setup,
    training_rollout,
)


def _norm(tensors) -> torch.Tensor:
    """L2 norm of a list of tensors taken as one vector."""
    return torch.sqrt(sum((x.float() ** 2).sum() for x in tensors))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--algo", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", type=int, default=32, help="training prompts in the batch")
    ap.add_argument("--group", type=int, default=8, help="rollouts per prompt")
    ap.add_argument("--step-norm", type=float, default=0.008, help="L2 norm of the weight step")
    ap.add_argument("--samples", type=int, default=16, help="evaluation samples per prompt")
    ap.add_argument("--sign", action="store_true", help="also step along -sign(g) and +sign(g) (Adam's first step)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("overrides", nargs="*", help="KEY=VALUE run-config overrides")
    args = ap.parse_args(argv)

    dare = build()
    cfg = resolve(
        dare,
        algo=args.algo,
        model=args.model,
        overrides=["progress=false", "eval.temperature=1.0", f"seed={args.seed}", *args.overrides],
    )
    ctx = setup(dare, cfg)
    wrapper, comps = ctx.wrapper, ctx.bundle(RLComponents)
    examples = ctx.task.examples("train", limit=args.prompts, seed=cfg.seed)[: args.prompts]
    n = args.group
    c = collect(
        ctx,
        training_rollout(ctx),
        comps.trajectory or FinalSequence(),
        comps.advantage or GroupNormAdvantage(),
        examples,
        n,
        1,
    )
    rows, rewards = c.rows, c.rewards
    if comps.accumulate is not None and c.corrupted is not None and not comps.accumulate.computes_own_old:
        raise DareError(
            f"{args.algo}'s loss needs separate old log-likelihoods, which this probe does "
            "not compute; probe an algorithm whose loss takes the update's own"
        )
    wrapper.module.train()
    wrapper.module.zero_grad()
    # the whole batch as one mini-batch, in the run's micro-batches (as the loop accumulates it)
    backward_minibatch(
        None,
        PolicyObjective(comps, wrapper),
        rows_update_batch(rows, c.corrupted),
        UpdatePlan(micro_batch=cfg.trainer.micro_batch_size),
    )
    params = [p for p in wrapper.module.parameters() if p.requires_grad]
    grad = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in params]
    g_norm = _norm(grad)
    noise = torch.Generator().manual_seed(args.seed + 1)
    rand = [torch.randn(p.shape, generator=noise).to(p) for p in params]
    r_norm = _norm(rand)
    print(
        f"{args.algo} x {args.model}: {len(examples)} prompts x {n} rollouts, mean reward "
        f"{rewards.mean():.3f} ({cfg.task.reward}), gradient norm {g_norm:.4f}, step norm {args.step_norm}"
    )

    theta = [p.detach().clone() for p in params]
    directions = {
        "no step": None,
        "-g (training)": [-x / g_norm for x in grad],
        "+g (opposite)": [x / g_norm for x in grad],
        "random": [x / r_norm for x in rand],
        "-random": [-x / r_norm for x in rand],
    }
    if args.sign:
        sign = [torch.sign(x) for x in grad]
        s_norm = _norm(sign)
        directions["-sign(g) (Adam)"] = [-x / s_norm for x in sign]
        directions["+sign(g)"] = [x / s_norm for x in sign]
    eval_examples = [ex for ex in examples for _ in range(args.samples)]
    base = None
    wrapper.module.eval()
    print(f"{'direction':<16} {'accuracy':>9} {'reward':>8}  flips vs no step ({len(eval_examples)} samples)")
    for name, d in directions.items():
        with torch.no_grad():
            for i, (p, t) in enumerate(zip(params, theta)):
                p.copy_(t if d is None else t + args.step_norm * d[i])
        items: list[float] = []
        res = evaluate(ctx, eval_examples, "probe", items)  # fixed eval seed: common random numbers
        base = items if base is None else base
        up = sum(1 for a, b in zip(base, items) if b > a)
        down = sum(1 for a, b in zip(base, items) if b < a)
        print(f"{name:<16} {res['accuracy']:>9.4f} {res['reward']:>8.4f}  +{up} / -{down}", flush=True)
    return 0


if __name__ == "__main__":
    run_script(main)
