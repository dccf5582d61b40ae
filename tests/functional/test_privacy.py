"""Differential-privacy math: clipping, noise, adaptive clipping, the noise split and Opacus accounting."""

import math
import sys

import pytest
import torch
from opacus.accountants import PRVAccountant, RDPAccountant

from fl_lightning.errors import ConfigError
from fl_lightning.functional.privacy import (
    add_step,
    clip_update,
    default_delta,
    epsilon_spent,
    gaussian_noise,
    global_norm,
    make_accountant,
    noised_fraction,
    noised_mean_update,
    update_clip_norm,
    update_noise_multiplier,
)


def test_global_norm_is_the_norm_of_all_tensors_as_one_vector():
    tensors = [torch.tensor([3.0]), torch.tensor([[0.0, 4.0]]), torch.tensor([12.0], dtype=torch.float64)]
    assert global_norm(tensors).item() == pytest.approx(13.0)
    assert global_norm([]).item() == 0.0


def test_clip_update_by_hand():
    x = [torch.ones(1), torch.ones(1, 1)]
    clipped, norm = clip_update([torch.tensor([4.0]), torch.tensor([[5.0]])], x, max_norm=1.0)  # Delta=(3,4)
    assert norm.item() == pytest.approx(5.0)
    assert clipped[0].item() == pytest.approx(1.6) and clipped[1].item() == pytest.approx(1.8)
    assert clipped[1].shape == (1, 1)
    inside, norm = clip_update(
        [torch.tensor([1.3]), torch.tensor([[1.4]])], x, max_norm=1.0
    )  # ||Delta|| = 0.5
    assert norm.item() == pytest.approx(0.5)
    assert torch.equal(inside[0], torch.tensor([1.3])) and torch.equal(inside[1], torch.tensor([[1.4]]))
    same, norm = clip_update(x, x, max_norm=1.0)  # zero update: unchanged, no division by zero
    assert norm.item() == 0.0 and all(torch.equal(a, b) for a, b in zip(same, x))


def test_clip_update_bounds_every_update():
    gen = torch.Generator().manual_seed(0)
    x = [torch.randn(7, 3, generator=gen), torch.randn(5, generator=gen)]
    for scale in (0.01, 0.3, 1.0, 10.0, 1e3):
        y = [t + scale * torch.randn(t.shape, generator=gen) for t in x]
        clipped, norm = clip_update(y, x, max_norm=0.7)
        after = global_norm([c - r for c, r in zip(clipped, x)]).item()
        assert after <= 0.7 * (1 + 1e-5)
        if norm <= 0.7:
            assert all(torch.equal(c, t) for c, t in zip(clipped, y))
        else:
            assert after == pytest.approx(0.7, rel=1e-5)


def test_gaussian_noise_is_seeded_and_has_the_requested_std():
    like = [torch.zeros(200, 100), torch.zeros(30_000)]
    a = gaussian_noise(like, 0.3, torch.Generator().manual_seed(5))
    b = gaussian_noise(like, 0.3, torch.Generator().manual_seed(5))
    c = gaussian_noise(like, 0.3, torch.Generator().manual_seed(6))
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    assert not torch.equal(a[0], c[0])
    assert a[0].shape == (200, 100)
    flat = torch.cat([t.reshape(-1) for t in a])
    assert flat.std().item() == pytest.approx(0.3, rel=0.02)
    assert abs(flat.mean().item()) < 0.01


def test_noised_mean_update_uses_the_fixed_denominator():
    x = [torch.zeros(3)]
    mean = [torch.tensor([1.0, 2.0, 3.0])]  # the mean of K = 2 uploads, n = 4 sampled
    out = noised_mean_update(mean, x, count=2, denominator=4, std=0.0, generator=torch.Generator())
    torch.testing.assert_close(out[0], torch.tensor([0.5, 1.0, 1.5]))
    x = [torch.full((100_000,), 2.0)]
    out = noised_mean_update(
        x, x, count=5, denominator=5, std=1.5, generator=torch.Generator().manual_seed(0)
    )
    assert (out[0] - 2.0).std().item() == pytest.approx(1.5 / 5, rel=0.02)


def test_noised_fraction():
    assert noised_fraction(3, 10, 10, 0.0, torch.Generator()) == pytest.approx(0.3)
    draws = [noised_fraction(3, 10, 10, 2.0, torch.Generator().manual_seed(s)) for s in range(2000)]
    mean = sum(draws) / len(draws)
    std = math.sqrt(sum((d - mean) ** 2 for d in draws) / len(draws))
    assert mean == pytest.approx(0.3, abs=0.02) and std == pytest.approx(0.2, rel=0.1)


def test_noised_fraction_has_sensitivity_one_half():
    # Andrew et al. (2021), Thm. 1 budgets the count with noise multiplier 2 sigma_b: adding or removing
    # one client (clipped or not) must move n * b~ by at most 1/2, as with centred b_k - 1/2
    gen = torch.Generator()
    for below, count in [(0, 3), (3, 3), (2, 5)]:
        base = 8 * noised_fraction(below, count, 8, 0.0, gen)
        assert abs(8 * noised_fraction(below + 1, count + 1, 8, 0.0, gen) - base) == pytest.approx(0.5)
        assert abs(8 * noised_fraction(below, count + 1, 8, 0.0, gen) - base) == pytest.approx(0.5)
    # a sampled client that failed is neutral: 2 of 4 reported, both unclipped -> 1/2 + (2 - 1) / 4
    assert noised_fraction(2, 2, 4, 0.0, gen) == pytest.approx(0.75)
    assert noised_fraction(0, 0, 4, 0.0, gen) == pytest.approx(0.5)


def test_update_clip_norm_by_hand():
    # Andrew et al. (2021), geometric update: C <- C exp(-eta (b - gamma))
    assert update_clip_norm(2.0, 0.2, 0.5, 0.2) == pytest.approx(2.0 * math.exp(0.06))
    assert update_clip_norm(2.0, 0.9, 0.5, 0.2) == pytest.approx(2.0 * math.exp(-0.08))
    assert update_clip_norm(2.0, 0.5, 0.5, 0.2) == 2.0


@pytest.mark.parametrize("start", [0.1, 50.0])
def test_adaptive_clipping_moves_towards_the_target_quantile(start):
    norms = torch.arange(1.0, 11.0)  # ten clients with update norms 1..10
    clip = start
    for _ in range(200):
        unclipped = (norms <= clip).float().mean().item()
        clip = update_clip_norm(clip, unclipped, 0.3, 0.2)
    assert 2.5 < clip < 4.5  # oscillates around the 0.3-quantile of the norms (3 unclipped of 10)


def test_update_noise_multiplier_splits_z_by_hand():
    # Andrew et al. (2021), Thm. 1: z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2)
    assert update_noise_multiplier(1.0, 1.0) == pytest.approx((1 - 0.25) ** -0.5)
    z_delta = update_noise_multiplier(0.8, 5.0)
    assert z_delta**-2 + 10.0**-2 == pytest.approx(0.8**-2)  # the two releases compose to z
    assert update_noise_multiplier(0.0, 1.0) == 0.0
    with pytest.raises(ValueError, match="must exceed z/2"):
        update_noise_multiplier(2.0, 1.0)


def test_default_delta():
    assert default_delta(100) == pytest.approx(100**-1.1) and default_delta(100) < 1 / 100


@pytest.mark.parametrize(("name", "cls"), [("rdp", RDPAccountant), ("prv", PRVAccountant)])
def test_epsilon_equals_opacus(name, cls):
    reference = cls()
    for _ in range(30):
        reference.step(noise_multiplier=1.1, sample_rate=0.05)
    for _ in range(10):
        reference.step(noise_multiplier=0.9, sample_rate=0.1)
    history = []
    for _ in range(30):
        history = add_step(history, 1.1, 0.05)
    history = add_step(history, 0.9, 0.1, steps=10)
    assert history == [(1.1, 0.05, 30), (0.9, 0.1, 10)]
    assert epsilon_spent(history, 1e-5, name) == pytest.approx(reference.get_epsilon(delta=1e-5), rel=1e-9)


def test_epsilon_edge_cases():
    assert epsilon_spent([], 1e-5) == 0.0
    assert epsilon_spent([(0.0, 0.1, 3)], 1e-5) == math.inf
    assert epsilon_spent([(1.0, 0.1, 5)], 1e-5) < epsilon_spent([(1.0, 0.1, 6)], 1e-5)


def test_unknown_accountant_and_missing_opacus_are_one_line(monkeypatch):
    with pytest.raises(ConfigError, match=r"^model\.strategy\.accountant='gdp' must be one of rdp, prv$"):
        make_accountant("gdp", [])
    monkeypatch.setitem(sys.modules, "opacus", None)  # import opacus -> ImportError
    with pytest.raises(ConfigError) as info:
        make_accountant("rdp", [])
    assert "pip install fl_lightning[dp]" in str(info.value) and "\n" not in str(info.value)
