"""Draws from the run's generator on any device (dare_core.rng)."""

import torch

from dare_core import rng


def test_same_device_keeps_the_generator_and_none_stays_none():
    g = torch.Generator().manual_seed(3)
    assert rng.for_device(g, "cpu") is g
    assert rng.for_device(g, torch.device("cpu")) is g
    assert rng.for_device(None, "cuda") is None


def test_another_device_gets_a_generator_seeded_from_one_draw(monkeypatch):
    made = []

    class FakeGenerator:
        def __init__(self, device):
            self.device = torch.device(device)

        def manual_seed(self, seed):
            made.append((self.device.type, seed))
            return self

    a, b = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    want = int(torch.randint(0, 2**63 - 1, (1,), generator=b))
    monkeypatch.setattr(rng.torch, "Generator", FakeGenerator)
    out = rng.for_device(a, "cuda")
    assert isinstance(out, FakeGenerator) and made == [("cuda", want)]
    # the run's generator advanced by exactly one draw: the next one matches b's next one
    monkeypatch.undo()
    assert torch.equal(torch.rand(4, generator=a), torch.rand(4, generator=b))
