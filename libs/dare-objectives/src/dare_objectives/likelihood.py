r"""Conditional log-likelihood of a continuation under a diffusion LM, by Monte-Carlo ELBO.

A masked diffusion model defines no tractable ``log p(y | c)``; it defines a lower bound. For a
continuation ``y`` of ``L`` tokens after a context ``c`` (LLaDA, Nie et al. 2025,
arXiv:2502.09992, Eq. 6 and Algorithm 3):

.. math::

    \log p_θ(y \mid c) \;\ge\; \mathbb E_{l \sim U\{1..L\}}\; \mathbb E_{\mathcal M \subset [L],\,|\mathcal M| = l}
        \Big[\frac{L}{l} \sum_{j \in \mathcal M} \log p_θ(y_j \mid c, y_{\setminus \mathcal M})\Big]

where ``y_{\setminus M}`` is ``y`` with the positions ``M`` replaced by the mask token. This is the
lowest-variance form of the ELBO (a fixed number ``l`` of masked tokens instead of an independent
mask ratio per token, Algorithm 3); it equals the any-order autoregressive bound
``E_σ Σ_k log p(y_{σ(k)} | c, y_{σ(<k)})`` over uniformly random orders ``σ``.

Estimator (:func:`elbo_loglikelihood`): ``M = samples`` rows; row ``m`` masks exactly ``l_m``
continuation tokens with the stratified counts of :class:`~dare_objectives.elbo.StratifiedCountMasking`
(one ``k ~ U{1..L}``, ``l_m = ((round(k + mL/M) − 1) mod L) + 1``: the counts cover ``1..L``
evenly, as LLaDA's ``get_log_likelihood`` does within a batch) and scores the masked tokens with
one forward (:class:`~dare_objectives.elbo.SequenceELBO`, weights ``1/p = L/l``); the estimate is
the mean over rows. It is unbiased for the bound, not for ``log p``; the bound is tight when the
model's conditionals are consistent. Variance: stratifying ``l`` removes most of the variance the
mask ratio contributes, what remains comes from which positions are masked; it grows with ``L``
and shrinks as ``1/M``. A one-token continuation has ``l = 1`` always, so the estimate is exactly
``log p(y_1 | c, [MASK])`` for any ``M``.

Block-diffusion (semi-autoregressive) wrappers use the same estimator: ``token_logprobs`` with
``clean_ids`` builds their ``[noisy | clean]`` layout, in which a token sees the noisy copy of its
own block and the clean earlier blocks. Restricted to one block, a random order of ``y`` is a random
order of that block, so the row sum above is the sum over blocks of the any-order bound of
``log p(y^b | c, y^{<b})``: a lower bound of ``log p(y | c)`` for block models as well.

Determinism: each (context, continuation) pair draws its masks from its own generator, seeded by
``seed`` and the context's token ids, so an estimate does not depend on which other pairs share the
batch or on their order (up to float rounding of padded forwards), and the choices of one question
are scored with common random numbers (equal-length choices get the same masked positions), which
lowers the variance of their comparison.

Greedy check: lm-eval's ``is_greedy`` asks whether greedy decoding from ``c`` yields ``y``. For a
dLLM that depends on the sampler (steps, block length, remasking) and costs one decode of ``L``
steps per request; no cheap quantity answers it, so this module offers none and the lm-eval adapter
reports ``False``.
"""

from __future__ import annotations

import zlib
from typing import Any, Sequence

import torch

from dare_core.api import CapabilityError, Corrupted, DareError, SequenceBatch, mask_tokens
from dare_objectives.elbo import SequenceELBO, StratifiedCountMasking

#: a (context token ids, continuation token ids) pair
Pair = tuple[Sequence[int], Sequence[int]]


def pair_generator(seed: int, context: Sequence[int]) -> torch.Generator:
    """The generator of a pair: keyed by ``seed`` and the context's token ids."""
    key = zlib.crc32(torch.tensor(list(context), dtype=torch.int64).numpy().tobytes())
    return torch.Generator().manual_seed((int(seed) * 0x9E3779B97F4A7C15 + key) % (2**63))


def _padded(pairs: Sequence[Pair], pad_id: int) -> SequenceBatch:
    """``[context | continuation]`` rows, contexts left-padded, continuations right-padded."""
    P = max(len(c) for c, _ in pairs)
    R = max(len(y) for _, y in pairs)
    ids = torch.full((len(pairs), P + R), pad_id, dtype=torch.long)
    att = torch.zeros_like(ids)
    for b, (c, y) in enumerate(pairs):
        row = torch.tensor([*c, *y], dtype=torch.long)
        ids[b, P - len(c) : P + len(y)] = row
        att[b, P - len(c) : P + len(y)] = 1
    return SequenceBatch(ids, att, P)


def _corrupt(wrapper: Any, pairs: Sequence[Pair], batch: SequenceBatch, samples: int, seed: int) -> Corrupted:
    """Each pair's stratified-count corruption drawn on its unpadded row, placed into ``batch``."""
    M, (B, S), P = samples, batch.input_ids.shape, batch.prompt_len
    masked = torch.zeros(M, B, S, dtype=torch.bool)
    p_mask = torch.zeros(M, B, S)
    draw = StratifiedCountMasking(mc_num=M, n_l=M)
    for b, (c, y) in enumerate(pairs):
        row = SequenceBatch(
            torch.tensor([[*c, *y]], dtype=torch.long), torch.ones(1, len(c) + len(y), dtype=torch.long), len(c)
        )
        cor = draw(wrapper, row, pair_generator(seed, c))
        masked[:, b, P - len(c) : P + len(y)] = cor.masked[:, 0]
        p_mask[:, b, P - len(c) : P + len(y)] = cor.p_mask[:, 0]
    return Corrupted(mask_tokens(batch.input_ids, masked, wrapper.mask_token_id), masked, p_mask, {})


@torch.no_grad()
def elbo_loglikelihood(
    wrapper: Any,
    pairs: Sequence[Pair],
    *,
    samples: int = 32,
    seed: int = 0,
    batch_size: int = 64,
    return_samples: bool = False,
) -> torch.Tensor:
    """Monte-Carlo ELBO of ``log p(continuation | context)`` (nats, summed over the continuation's
    tokens) for every pair, with ``samples`` corruption rows each (see the module docstring).

    :param wrapper: a loaded family wrapper (any kind; it supplies ``token_logprobs`` and the mask id)
        with the ``absorbing_elbo`` capability: the bound holds for absorbing-state (MASK) families
        only, so any other is refused with a :class:`~dare_core.api.CapabilityError`.
    :param pairs: ``(context_ids, continuation_ids)``; an empty continuation scores 0.
    :param batch_size: rows (pairs x samples) per forward.
    :returns: ``[N]`` float32 estimates on the CPU, or ``[N, samples]`` per-row values with
        ``return_samples`` (their spread is the Monte-Carlo error).
    """
    if samples < 1 or batch_size < 1:
        raise ValueError(f"samples and batch_size must be >= 1, got {samples} and {batch_size}")
    if "absorbing_elbo" not in wrapper.capabilities:
        raise CapabilityError(
            f"likelihood scoring (multiple choice, lm-eval loglikelihood) uses the masked-diffusion "
            f"ELBO and needs model capability absorbing_elbo which {wrapper.family!r} lacks; "
            "evaluate this model on generation tasks"
        )
    out = torch.zeros(len(pairs), samples)
    todo = [i for i, (_, y) in enumerate(pairs) if len(y)]
    todo.sort(key=lambda i: len(pairs[i][0]) + len(pairs[i][1]))  # similar lengths share a batch
    group = max(1, batch_size // samples)
    estimator = SequenceELBO(norm="none")
    device = wrapper.device
    was_training = wrapper.module.training
    wrapper.module.eval()
    try:
        for start in range(0, len(todo), group):
            idx = todo[start : start + group]
            sub = [(list(pairs[i][0]), list(pairs[i][1])) for i in idx]
            batch = _padded(sub, wrapper.pad_token_id)
            cor = _corrupt(wrapper, sub, batch, samples, seed)
            n, S = samples * len(sub), batch.input_ids.shape[1]
            # rows m-major: row m * len(sub) + b is sample m of pair b
            flat = SequenceBatch(
                batch.input_ids.repeat(samples, 1), batch.attention_mask.repeat(samples, 1), batch.prompt_len
            )
            noisy, masked, p = (t.reshape(1, n, S) for t in (cor.noisy_ids, cor.masked, cor.p_mask))
            values = []
            for lo in range(0, n, batch_size):
                sl = slice(lo, min(lo + batch_size, n))
                rows = SequenceBatch(flat.input_ids[sl], flat.attention_mask[sl], flat.prompt_len).to(device)
                part = Corrupted(noisy[:, sl].to(device), masked[:, sl].to(device), p[:, sl].to(device), {})
                values.append(estimator(wrapper, rows, part)[0].float().cpu())
            out[idx] = torch.cat(values).reshape(samples, len(sub)).T
    finally:
        wrapper.module.train(was_training)
    return out if return_samples else out.mean(-1)


def choose(
    ctx_or_wrapper: Any, examples: Sequence[Any], samples: int = 32, seed: int = 0, batch_size: int = 64
) -> list[int]:
    """The index of the most likely choice for each multiple-choice example.

    ``examples``: :class:`~dare_core.api.Example`\\ s with ``extra_info["choices"]`` (a list of
    strings, as the ``multiple_choice`` task builds them); the context is the example's prompt
    rendered with the chat template, each choice the continuation, scored by
    :func:`elbo_loglikelihood` (summed over tokens, no length normalisation). Ties go to the first
    choice. ``ctx_or_wrapper``: a run context (its ``wrapper``) or a wrapper.
    """
    wrapper = getattr(ctx_or_wrapper, "wrapper", ctx_or_wrapper)
    pairs: list[Pair] = []
    sizes: list[int] = []
    for ex in examples:
        choices = ex.extra_info.get("choices") if isinstance(ex.extra_info, dict) else None
        if not choices:
            raise DareError(
                "a multiple-choice example has no extra_info['choices']; use the "
                "multiple_choice task (choices and answer fields)"
            )
        context = wrapper.encode(wrapper.render_prompt(ex.prompt))
        pairs += [(context, wrapper.encode(str(c))) for c in choices]
        sizes.append(len(choices))
    scores = elbo_loglikelihood(wrapper, pairs, samples=samples, seed=seed, batch_size=batch_size).tolist()
    picks, at = [], 0
    for n in sizes:
        best = max(range(n), key=lambda j: (scores[at + j], -j))
        picks.append(best)
        at += n
    return picks
