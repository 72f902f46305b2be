"""The Monte-Carlo ELBO of log p(continuation | context) on the bundled tiny checkpoints of a masked
(llada) and a block (sdar) family: exact for one token, equal to the bound enumerated by hand for
two, deterministic for a seed whatever the batching, and preferring the right Sudoku answer."""

import pytest
import torch

from dare_core.api import DareError, Example, get_dare
from dare_objectives.likelihood import choose, elbo_loglikelihood

ANSWER = "<reasoning>\nFill the empty cells.\n</reasoning>\n<answer>\n{}\n</answer>"
PUZZLE = "Solve the following Sudoku puzzle: 3102200002100320\n"
SOLUTION = "3142243142131324"


@pytest.fixture(scope="module", params=["llada", "sdar"])
def wrapper(request):
    dare = get_dare()
    if request.param not in dare.registries.models:
        pytest.skip(f"family {request.param} not installed")
    fam = dare.registries.models.get(request.param)
    return fam.load(fam.default_checkpoint)


def _context(w, text=PUZZLE):
    return w.encode(w.render_prompt([{"role": "user", "content": text}]))


def _logp(w, seq, noisy):
    """log p(seq[i] | noisy) at every position, the wrapper's own layout (block: [noisy | clean])."""
    ids = torch.tensor([seq])
    with torch.no_grad():
        return w.token_logprobs(torch.tensor([noisy]), ids, torch.ones_like(ids), clean_ids=ids)[0]


def test_one_token_is_exact(wrapper):
    ctx, y = _context(wrapper), wrapper.encode("<")[:1]
    want = _logp(wrapper, ctx + y, ctx + [wrapper.mask_token_id])[-1]
    for seed in (0, 1):
        got = elbo_loglikelihood(wrapper, [(ctx, y)], samples=3, seed=seed)
        assert got.item() == pytest.approx(want.item(), abs=1e-5)


def test_two_tokens_match_the_bound_enumerated_by_hand(wrapper):
    ctx, y = _context(wrapper), wrapper.encode(SOLUTION)[:2]
    m, n = wrapper.mask_token_id, len(ctx)
    seq = ctx + y
    a = _logp(wrapper, seq, ctx + [m, y[1]])[n].item()  # first masked alone (weight L/l = 2)
    b = _logp(wrapper, seq, ctx + [y[0], m])[n + 1].item()  # second masked alone
    both = _logp(wrapper, seq, ctx + [m, m])[n:].sum().item()  # both masked (weight 1)
    # samples=2: the stratified counts are {1, 2}, so each estimate is (2·a or 2·b)/2 + both/2
    seen = set()
    for seed in range(8):
        got = elbo_loglikelihood(wrapper, [(ctx, y)], samples=2, seed=seed).item()
        hit = [abs(got - (x + both / 2)) < 1e-4 for x in (a, b)]
        assert any(hit), (got, a, b, both)
        seen.add(hit.index(True))
    assert seen == {0, 1}
    # many samples approach the exact bound E_l E_M[(L/l) Σ log p] = (a + b)/2 + both/2
    exact = (a + b) / 2 + both / 2
    got = elbo_loglikelihood(wrapper, [(ctx, y)], samples=512, seed=0, batch_size=512).item()
    assert got == pytest.approx(exact, abs=5 * abs(a - b) / (2 * 16) + 1e-4)


def test_deterministic_for_a_seed_whatever_the_batching(wrapper):
    ctx = _context(wrapper)
    pairs = [
        (ctx, wrapper.encode(ANSWER.format(SOLUTION))),
        (ctx, wrapper.encode("1234")),
        (_context(wrapper, "Solve: 0140432014020000\n"), wrapper.encode(ANSWER.format("2143432114323214"))),
        (ctx, []),
    ]
    one = elbo_loglikelihood(wrapper, pairs, samples=8, seed=3, return_samples=True)
    again = elbo_loglikelihood(wrapper, pairs, samples=8, seed=3, return_samples=True)
    assert torch.equal(one, again)
    split = elbo_loglikelihood(wrapper, pairs[::-1], samples=8, seed=3, batch_size=5, return_samples=True)
    torch.testing.assert_close(split.flip(0), one, atol=1e-4, rtol=1e-5)
    other = elbo_loglikelihood(wrapper, pairs, samples=8, seed=4, return_samples=True)
    assert not torch.equal(other[:3], one[:3])
    assert one[3].abs().sum() == 0  # an empty continuation scores 0
    assert bool((one[:3] <= 0).all())


def test_choose_prefers_the_right_answer(wrapper):
    wrong = ["1111222233334444", "4321432143214321", "3142243132141324"]
    examples = [
        Example(
            prompt=[{"role": "user", "content": PUZZLE}],
            ground_truth=SOLUTION,
            data_source="multiple_choice",
            extra_info={"choices": [ANSWER.format(s) for s in order]},
        )
        for order in ([SOLUTION, *wrong[:2]], [wrong[0], SOLUTION, wrong[1]])
    ]
    assert choose(wrapper, examples, samples=8, seed=0) == [0, 1]
    with pytest.raises(DareError, match="choices"):
        choose(wrapper, [Example(prompt=[{"role": "user", "content": "x"}], ground_truth="", data_source="")])
