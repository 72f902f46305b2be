"""Generic corruption and estimator behaviour on the family-free toy model."""

import torch

from dare_core.components import MaskedTokenLogProb, RandomRatioMasking, ResponseTokenLogProb
from dare_core.testing import fake_rollout, make_toy_wrapper


def test_random_ratio_masks_only_valid_response_tokens():
    w = make_toy_wrapper()
    batch = fake_rollout(w, batch=6, response_len=10).sequences()
    batch.attention_mask[0, -3:] = 0  # right padding in the response of row 0
    c = RandomRatioMasking(eps=1e-3, mc_num=3)(w, batch, torch.Generator().manual_seed(0))
    assert c.noisy_ids.shape == (3,) + batch.input_ids.shape
    P = batch.prompt_len
    assert not c.masked[:, :, :P].any()
    assert not c.masked[:, 0, -3:].any()
    assert (c.noisy_ids[c.masked] == w.mask_token_id).all()
    assert torch.equal(c.noisy_ids[~c.masked], batch.input_ids[None].expand_as(c.noisy_ids)[~c.masked])
    t = c.extras["t"]
    assert ((t >= 1e-3) & (t <= 1.0)).all()
    torch.testing.assert_close(c.p_mask[:, 1, P:], t[:, 1, None].expand(3, batch.response_ids.shape[1]))
    assert (c.p_mask[:, :, :P] == 0).all()


def test_random_ratio_rate_matches_t():
    w = make_toy_wrapper()
    batch = fake_rollout(w, batch=2, response_len=4000).sequences()
    c = RandomRatioMasking(mc_num=1)(w, batch, torch.Generator().manual_seed(1))
    rate = c.masked[0, :, batch.prompt_len :].float().mean(-1)
    torch.testing.assert_close(rate, c.extras["t"][0], atol=0.03, rtol=0)


def test_estimators_read_targets_at_corrupted_positions():
    w = make_toy_wrapper()
    batch = fake_rollout(w).sequences()
    c = RandomRatioMasking(mc_num=2)(w, batch, torch.Generator().manual_seed(0))
    tok = ResponseTokenLogProb()(w, batch, c)
    assert tok.shape == (2, batch.batch_size, batch.response_ids.shape[1])
    masked = MaskedTokenLogProb()(w, batch, c)
    assert masked.shape == (2,) + batch.input_ids.shape
    assert (masked[~c.masked] == 0).all()
    logits = w.logits(c.noisy_ids[1], batch.attention_mask)
    ref = torch.log_softmax(logits.float(), -1).gather(-1, batch.input_ids[..., None])[..., 0]
    torch.testing.assert_close(tok[1], ref[:, batch.prompt_len :], rtol=1e-5, atol=1e-5)
