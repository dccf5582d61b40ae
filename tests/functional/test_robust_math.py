"""Robust aggregation math against hand-computed values."""

import pytest
import torch

from fl_lightning.functional import (
    attack_update,
    clip_norms,
    coordinate_median,
    krum,
    krum_scores,
    malicious_clients,
    stack_flat,
    trimmed_mean,
    unflatten,
)


def test_stack_flat_and_unflatten_round_trip():
    a = {"w": torch.tensor([[1.0, 2.0]]), "b": torch.tensor([3.0])}
    b = {"w": torch.tensor([[4.0, 5.0]]), "b": torch.tensor([6.0])}
    x = stack_flat([a, b], ["w", "b"])
    assert torch.equal(x, torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]))
    back = unflatten(x[1], a)
    assert back["w"].shape == (1, 2) and torch.equal(back["w"], b["w"]) and torch.equal(back["b"], b["b"])


def test_coordinate_median_odd_and_even():
    x = torch.tensor([[1.0, 10.0], [3.0, -2.0], [2.0, 100.0]])
    assert torch.equal(coordinate_median(x), torch.tensor([2.0, 10.0]))
    x4 = torch.tensor([[1.0], [4.0], [2.0], [100.0]])
    assert torch.equal(coordinate_median(x4), torch.tensor([3.0]))  # (2 + 4) / 2


def test_trimmed_mean_drops_beta_k_each_side():
    x = torch.tensor([[1.0], [2.0], [3.0], [4.0], [100.0]])
    assert torch.equal(trimmed_mean(x, 0.2), torch.tensor([3.0]))  # drop 1 and 100: (2+3+4)/3
    assert torch.equal(trimmed_mean(x, 0.0), torch.tensor([22.0]))  # plain mean
    assert torch.equal(trimmed_mean(x, 0.1), torch.tensor([22.0]))  # floor(0.5) = 0 trimmed
    with pytest.raises(ValueError, match="beta"):
        trimmed_mean(x, 0.5)


def test_krum_scores_and_selection():
    # K=5, f=1: each score sums the K-f-2 = 2 smallest squared distances to the others
    x = torch.tensor([[0.0], [1.0], [2.0], [3.0], [10.0]])
    # 0: {1,4,9,100} -> 5; 1: {1,1,4,81} -> 2; 2: {4,1,1,64} -> 2; 3: {9,4,1,49} -> 5; 4: 49+64 = 113
    assert torch.equal(krum_scores(x, 1), torch.tensor([5.0, 2.0, 2.0, 5.0, 113.0]))
    agg, sel = krum(x, 1)
    assert sel.tolist() == [1] and torch.equal(agg, torch.tensor([1.0]))  # tie 1/2: lower index
    agg, sel = krum(x, 1, m=3)
    assert sorted(sel.tolist()) == [0, 1, 2] and torch.allclose(agg, torch.tensor([1.0]))
    with pytest.raises(ValueError, match="f \\+ 2"):
        krum(x, 3)


def test_clip_norms_bounds_each_row_and_keeps_small_ones():
    x = torch.tensor([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]])
    out = clip_norms(x, 1.0)
    assert torch.allclose(out, torch.tensor([[0.6, 0.8], [0.3, 0.4], [0.0, 0.0]]))
    assert (out.norm(dim=1) <= 1.0 + 1e-6).all()


def test_attack_update_by_hand():
    sent = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.5])}
    upload = {"w": torch.tensor([2.0, 0.0]), "b": torch.tensor([1.5]), "extra": torch.tensor([9.0])}
    out = attack_update(upload, sent, -2.0)  # w^t - 2 (w_k - w^t)
    assert torch.equal(out["w"], torch.tensor([-1.0, 6.0])) and torch.equal(out["b"], torch.tensor([-1.5]))
    assert out["extra"] is upload["extra"]  # not sent: unchanged
    assert torch.equal(attack_update(upload, sent, 1.0)["w"], upload["w"])


def test_malicious_clients_is_a_seeded_fixed_draw():
    assert malicious_clients(10, 0.25, 7) == malicious_clients(10, 0.25, 7)
    assert len(malicious_clients(10, 0.25, 7)) == 2  # round(2.5) = 2
    assert all(0 <= c < 10 for c in malicious_clients(10, 0.9, 1))
    assert len({malicious_clients(10, 0.5, s) for s in range(5)}) > 1
