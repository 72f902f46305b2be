"""MDPO (He et al. 2025, "MDPO: Overcoming the Training-Inference Divide of Masked Diffusion
Language Models", arXiv:2508.13148).

Every denoising step is an action. The rollout records, per step, the state the sampler saw, its
prediction of the whole clean response and the confidence of that prediction; the prediction of
every step is rewarded, step-wise advantages reward steps that improved the prediction and steps
followed by good predictions, and the one-step denoiser is trained on the states actually visited
(``state_k → x̂0_k``) with a clipped, confidence-weighted objective.

Composition:

* trajectory ``intermediate_states`` (:class:`StepStateRows`, needs the rollout record
  ``step_states``) — step rewards, advantages, step selection and one training row per
  (rollout, selected step);
* estimator ``response_token_logprob`` (core) — ``ℓ_j = log p_θ(x̂0_{k,j} | state_k)``;
* loss ``mdpo_loss`` (:class:`MDPOLoss`).
"""

from __future__ import annotations

from typing import Optional

import torch

from dare_core.api import (
    Corrupted,
    DareError,
    RLComponents,
    SequenceBatch,
    TrainingRows,
    TrajectoryContext,
    mask_totals,
)
from dare_plugin_mdpo.config import RECORDS, MDPOConfig


def step_scores(rewards: torch.Tensor) -> torch.Tensor:
    r"""Step scores from per-step rewards ``r`` ``[B, K]``:

    ``a_t = r_t − r_{t−1} + 1`` (``r_{−1} = 0``), ``fut_t = mean(r_{t+1..K−1})`` (``fut_{K−1} =
    r_{K−1}``), ``score_t = a_t + fut_t``.
    """
    B, K = rewards.shape
    prev = torch.cat([torch.zeros(B, 1, dtype=rewards.dtype), rewards[:, :-1]], 1)
    a = rewards - prev + 1.0
    tail = rewards.flip(1).cumsum(1).flip(1)  # tail[t] = Σ_{s >= t} r_s
    count = torch.arange(K - 1, -1, -1, dtype=rewards.dtype)  # K-1-t future steps
    fut = torch.where(count > 0, (tail - rewards) / count.clamp_min(1), rewards)
    return a + fut


def step_advantages(scores: torch.Tensor, group_ids: torch.Tensor, advantage) -> torch.Tensor:
    """Group-normalise every step's scores over rows of the same prompt group (by id)."""
    return torch.stack([advantage(scores[:, k], group_ids) for k in range(scores.shape[1])], 1)


def select_steps(adv: torch.Tensor, n: int) -> torch.Tensor:
    """The ``n`` steps of largest ``Σ_b |A_bk|`` (``torch.topk`` tie order), ascending."""
    importance = adv.abs().sum(0)
    top = torch.topk(importance, min(n, adv.shape[1])).indices
    return top.sort().values


class StepStateRows:
    """Trajectory builder: step rewards → step advantages → top steps → training rows.

    For every step ``k`` the reward ``r_k`` is the task reward of the step's predicted response
    ``x̂0_k`` (scored with the final response mask). Advantages: :func:`step_scores` then the
    group normalisation per step; the ``sample_train_steps`` steps of largest total ``|A|`` are
    trained, step-major: row ``(k, b)`` has target ``[prompt | x̂0_{b,k}]``, model input
    ``[prompt | state_{b,k}]``, advantage ``A_{b,k}``, loss weights = the positions still masked
    in the state (within the final response unless ``count_after_eos``) and ``extras["confidence"]``.
    """

    records = RECORDS

    def __init__(self, advantage, sample_train_steps: int = 16, count_after_eos: bool = False):
        self.advantage = advantage
        self.sample_train_steps = sample_train_steps
        self.count_after_eos = count_after_eos

    def rows(self, wrapper, rollout, context: TrajectoryContext) -> TrainingRows:
        ex = rollout.extras
        if not {"step_inputs", "step_predictions", "step_confidence"} <= set(ex):
            raise DareError(
                "mdpo needs the rollout record step_states (intermediate states, "
                "predictions, confidences); choose a rollout backend listing "
                "step_states in `dare list rollouts`"
            )
        inputs, preds, conf = ex["step_inputs"], ex["step_predictions"], ex["step_confidence"]
        B, K, R = inputs.shape
        final = rollout.sequences()
        rows = torch.arange(B)
        resp_mask = rollout.response_mask
        rewards = torch.stack([context.score(preds[:, k], resp_mask, rows) for k in range(K)], 1).to(torch.float32)
        adv = step_advantages(step_scores(rewards), context.group_ids, self.advantage)
        steps = select_steps(adv, self.sample_train_steps)
        P = final.prompt_len
        n = len(steps)
        idx = steps.to(inputs.device)
        state = inputs.index_select(1, idx).transpose(0, 1).reshape(n * B, R)
        target = preds.index_select(1, idx).transpose(0, 1).reshape(n * B, R)
        confidence = conf.index_select(1, idx).transpose(0, 1).reshape(n * B, R).to(torch.float32)
        prompt = final.input_ids[:, :P].repeat(n, 1)
        attention = final.attention_mask.repeat(n, 1)
        batch = SequenceBatch(torch.cat([prompt, target], 1), attention, P)
        noisy = torch.cat([prompt, state], 1)
        masked = torch.zeros_like(noisy, dtype=torch.bool)
        masked[:, P:] = state == wrapper.mask_token_id
        if not self.count_after_eos:
            masked[:, P:] &= attention[:, P:].bool()
        corrupted = Corrupted(noisy[None], masked[None], masked[None].float())
        advantages = adv.index_select(1, steps).transpose(0, 1).reshape(n * B)
        metrics = {
            "step_reward_mean": rewards.mean().item(),
            "step_reward_first": rewards[:, 0].mean().item(),
            "steps_trained": float(n),
        }
        return TrainingRows(batch, advantages, corrupted, masked[:, P:].float(), {"confidence": confidence}, metrics)


class MDPOLoss:
    r"""MDPO objective (arXiv:2508.13148; no dual clip), normalised by the masked positions of the
    whole mini-batch:

    .. math::
        λ_b = R / \max(1, Σ_j m_{bj}),\quad r = e^{ℓ-ℓ_{old}},\quad
        L_{bj} = \max(-A_b r λ_b,\; -A_b\,\mathrm{clip}(r, 1-ε, 1+ε) λ_b)
                 \;[+\, β (ℓ_{ref} - ℓ)^2 / 2]

    .. math::
        \mathcal L = Σ_{b,j} L_{bj}\, m_{bj}\, c_{bj} \,/\, \max(10^{-4}, T_{tokens}),\quad
        T_{tokens} = Σ_{b' ∈ \text{mini-batch}} Σ_j m_{b'j}

    ``m`` = positions masked in the state (``mask``), ``c`` = the rollout's confidence in the
    prediction (``extras["confidence"]``), ``R`` = the padded response length; ``b`` runs over this
    call's rows, ``T_tokens`` (``totals["tokens"]``, :func:`~dare_core.api.mask_totals`) over the
    mini-batch's, so the calls of a mini-batch add up to its loss (the KL term included).
    ``logp`` etc.: ``[1, B, R]`` or ``[B, R]``.
    """

    def __init__(self, epsilon: float = 0.2, kl_coef: float = 0.0):
        self.epsilon = epsilon
        self.kl_coef = kl_coef

    def totals(self, mask: torch.Tensor, extras: Optional[dict] = None) -> dict[str, torch.Tensor]:
        """:func:`~dare_core.api.mask_totals` of ``mask`` ``[B, R]`` (``"tokens"`` = Σ m)."""
        return mask_totals(mask)

    def __call__(
        self,
        logp,
        old_logp,
        ref_logp: Optional[torch.Tensor],
        advantages,
        mask,
        *,
        extras: Optional[dict] = None,
        totals: Optional[dict[str, torch.Tensor]] = None,
    ):
        if extras is None or "confidence" not in extras:
            raise ValueError("the mdpo loss needs extras['confidence'] from its trajectory builder")
        if logp.dim() == 3:
            logp, old_logp = logp[0], old_logp[0]
            ref_logp = ref_logp[0] if ref_logp is not None else None
        m = mask.to(logp.dtype)
        conf = extras["confidence"].to(logp.dtype)
        R = m.shape[-1]
        lam = R / m.sum(-1, keepdim=True).clamp_min(1.0)
        adv = advantages.to(logp.dtype)[:, None]
        ratio = torch.exp(logp - old_logp)
        l1 = -adv * ratio * lam
        l2 = -adv * ratio.clamp(1 - self.epsilon, 1 + self.epsilon) * lam
        token = torch.maximum(l1, l2)
        metrics = {}
        if self.kl_coef > 0:
            if ref_logp is None:
                raise ValueError("kl_coef > 0 needs reference log-probabilities")
            kl = 0.5 * (ref_logp - logp).square()
            token = token + self.kl_coef * kl
            metrics["kl_loss"] = float(((kl * m).sum() / m.sum().clamp_min(1e-4)).detach())
        tokens = (mask_totals(m) if totals is None else totals)["tokens"].to(m).clamp_min(1e-4)
        loss = (token * m * conf).sum() / tokens
        with torch.no_grad():
            denom = m.sum() + 1e-8
            metrics["pg_clipfrac"] = float(((l2 > l1).to(m.dtype) * m).sum() / denom)
            metrics["ppo_kl"] = float(((torch.exp(old_logp - logp) - (old_logp - logp) - 1) * m).sum() / denom)
            metrics["ratio_mean"] = float((ratio * m).sum() / denom) if m.sum() > 0 else 1.0
            metrics["ratio_max"] = float(ratio[m > 0].max()) if m.sum() > 0 else 1.0
        return loss, metrics


def build(cfg: MDPOConfig, lookup) -> RLComponents:
    advantage = lookup.advantage(norm_by_std=cfg.norm_adv_by_std)
    return RLComponents(
        trajectory=lookup.trajectory(
            advantage=advantage,
            sample_train_steps=cfg.sample_train_steps,
            count_after_eos=cfg.count_after_eos,
        ),
        estimator=lookup.estimator(),
        loss=lookup.loss(epsilon=cfg.epsilon, kl_coef=cfg.kl_coef),
        advantage=advantage,
        needs_ref=cfg.kl_coef > 0,
    )
