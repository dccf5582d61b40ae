"""CP math of TDPFed (spec §8): identities, Table I ranks, closed-form gradient, ALS, AFM/ACT algebra."""

import itertools
import math

import pytest
import torch

from fl_lightning.functional.cp import (
    act_tensor,
    afm,
    compression_ratio,
    cp_als,
    cp_factor_grads,
    cp_num_params,
    cp_random_factors,
    cp_reconstruct,
    khatri_rao,
    rank_for,
    unfold,
)

# TDPFed Table I, verbatim: (dims as the paper writes them, R1 at x1.5, R2 at x2).
TABLE_I = [
    ((784, 100), 59, 44),
    ((100, 10), 6, 5),
    ((3, 32, 3, 3), 14, 11),
    ((32, 64, 3, 3), 120, 90),
    ((64, 128, 3, 3), 248, 186),
    ((128, 256, 3, 3), 504, 378),
    ((256, 256, 3, 3), 759, 569),
    ((256, 256), 85, 64),
    ((256, 256), 85, 64),
    ((256, 10), 6, 5),
]


def factors64(shape, rank, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, rank, generator=g, dtype=torch.float64) for n in shape]


@pytest.mark.parametrize(("dims", "r1", "r2"), TABLE_I)
def test_rank_rule_reproduces_every_table_i_entry(dims, r1, r2):
    assert rank_for(dims, 1.5) == r1
    assert rank_for(dims, 2.0) == r2
    # and the achieved compression is within 0.2 of the target (worst: fc3 x1.5 -> 1.604)
    assert abs(compression_ratio(dims, r1) - 1.5) <= 0.2
    assert abs(compression_ratio(dims, r2) - 2.0) <= 0.2


def test_rank_rule_rounds_half_up_and_compression_formula():
    assert rank_for((100, 10), 2.0) == 5  # 4.545 -> 5 (floor would give 4)
    assert rank_for((3, 32, 3, 3), 2.0) == 11  # 10.54 -> 11
    assert rank_for((2, 2), 100.0) == 1
    assert cp_num_params((784, 100), 44) == 38_896
    assert compression_ratio((784, 100), 44) == pytest.approx(78_400 / 38_896)


def test_reconstruction_is_the_elementwise_sum_of_products():
    a = factors64((2, 3, 4), 5)
    x = cp_reconstruct(a)
    for i, j, k in itertools.product(range(2), range(3), range(4)):
        expected = sum(a[0][i, r] * a[1][j, r] * a[2][k, r] for r in range(5))
        assert x[i, j, k] == pytest.approx(float(expected), rel=1e-12)
    m = factors64((6, 7), 3)
    torch.testing.assert_close(cp_reconstruct(m), m[0] @ m[1].T)


def test_khatri_rao_and_unfolding_identity():
    a, b = factors64((3, 4), 2)
    kr = khatri_rao([a, b])
    assert kr.shape == (12, 2)
    assert kr[1 * 4 + 2, 1] == a[1, 1] * b[2, 1]
    a = factors64((3, 4, 2, 5), 6)
    x = cp_reconstruct(a)
    for n in range(4):
        others = [f for m, f in enumerate(a) if m != n]
        torch.testing.assert_close(unfold(x, n), a[n] @ khatri_rao(others).T)


@pytest.mark.parametrize("shape", [(7, 5), (4, 3, 3, 3)])
def test_closed_form_factor_gradient_equals_autograd(shape):
    lam = 2.5
    a = [f.requires_grad_() for f in factors64(shape, 4, seed=1)]
    theta = torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    loss = 0.5 * lam * (theta - cp_reconstruct(a)).pow(2).sum()
    auto = torch.autograd.grad(loss, a)
    closed = cp_factor_grads(theta, [f.detach() for f in a], lam)
    for g1, g2 in zip(auto, closed):
        torch.testing.assert_close(g1, g2, rtol=1e-10, atol=1e-10)


def test_closed_form_gradient_for_matrices_matches_the_spec_formula():
    a1, a2 = factors64((5, 4), 3)
    theta = torch.randn(5, 4, dtype=torch.float64)
    g1, g2 = cp_factor_grads(theta, [a1, a2], 3.0)
    torch.testing.assert_close(g1, 3.0 * (-theta @ a2 + a1 @ (a2.T @ a2)))
    torch.testing.assert_close(g2, 3.0 * (-theta.T @ a1 + a2 @ (a1.T @ a1)))


def test_gradient_vanishes_at_an_exact_fit():
    a = factors64((3, 4, 2, 2), 3)
    for g in cp_factor_grads(cp_reconstruct(a), a, 7.0):
        assert g.abs().max() < 1e-10


def test_als_recovers_an_exact_rank_tensor_and_never_increases_the_residual():
    target = cp_reconstruct(factors64((5, 6, 3, 3), 2, seed=3))
    start = factors64((5, 6, 3, 3), 2, seed=4)
    residuals = [float((target - cp_reconstruct(cp_als(target, start, k))).norm()) for k in range(0, 30, 3)]
    assert all(b <= a + 1e-9 for a, b in itertools.pairwise(residuals))
    assert residuals[-1] < 1e-6 * float(target.norm())


def test_random_factors_have_the_requested_reconstruction_variance():
    g = torch.Generator().manual_seed(0)
    x = cp_reconstruct(cp_random_factors((64, 64, 3, 3), 50, 0.01, g))
    assert x.var().item() == pytest.approx(0.01, rel=0.15)


# ------------------------------------------------------------------------------ AFM / ACT algebra
def test_afm_weights_beta_and_single_client():
    g = factors64((4, 3), 2, seed=0)
    c1, c2 = factors64((4, 3), 2, seed=1), factors64((4, 3), 2, seed=2)
    mean = afm(g, [c1, c2], [20, 20], beta=1.0)  # equal |B_k|: plain mean, per mode
    for n in range(2):
        torch.testing.assert_close(mean[n], (c1[n] + c2[n]) / 2)
    for n, f in enumerate(afm(g, [c1, c2], [20, 20], beta=0.0)):
        torch.testing.assert_close(f, g[n])
    for n, f in enumerate(afm(g, [c1], [20], beta=1.0)):
        torch.testing.assert_close(f, c1[n])
    weighted = afm(g, [c1, c2], [30, 10], beta=1.0)
    torch.testing.assert_close(weighted[0], 0.75 * c1[0] + 0.25 * c2[0])
    extra = afm(g, [c1, c2], [1, 1], beta=1.8)  # beta > 1 extrapolates A_t + beta (avg - A_t)
    torch.testing.assert_close(extra[1], g[1] + 1.8 * (mean[1] - g[1]))


def test_act_is_the_weighted_mean_of_composed_tensors():
    g = factors64((4, 3, 2, 2), 2, seed=0)
    c1, c2 = factors64((4, 3, 2, 2), 2, seed=1), factors64((4, 3, 2, 2), 2, seed=2)
    w = act_tensor(g, [c1, c2], [3, 1], beta=1.0)
    torch.testing.assert_close(w, 0.75 * cp_reconstruct(c1) + 0.25 * cp_reconstruct(c2))
    torch.testing.assert_close(act_tensor(g, [c1, c2], [3, 1], beta=0.0), cp_reconstruct(g))


def test_identical_uploads_give_the_same_tensor_under_afm_and_act():
    g = factors64((5, 4), 3, seed=0)
    c = factors64((5, 4), 3, seed=1)
    torch.testing.assert_close(
        cp_reconstruct(afm(g, [c, c], [1, 1], 1.0)), act_tensor(g, [c, c], [1, 1], 1.0)
    )


def test_act_is_invariant_to_the_cp_gauge_and_afm_is_not():
    g = factors64((6, 5, 3, 3), 4, seed=0)
    c = factors64((6, 5, 3, 3), 4, seed=1)
    perm = torch.tensor([2, 0, 3, 1])
    permuted = [f[:, perm] for f in c]
    rescaled = [c[0] * 3.0, c[1] / 3.0, c[2], c[3]]
    common = cp_reconstruct(c)
    for other in (permuted, rescaled):
        torch.testing.assert_close(cp_reconstruct(other), common)
        torch.testing.assert_close(act_tensor(g, [c, other], [1, 1], 1.0), common)
        afm_tensor = cp_reconstruct(afm(g, [c, other], [1, 1], 1.0))
        assert (afm_tensor - common).norm() > 0.1 * common.norm()


def test_act_refit_from_the_afm_start_is_no_worse_than_afm():
    g = factors64((6, 5, 3, 3), 3, seed=0)
    clients = [factors64((6, 5, 3, 3), 3, seed=s) for s in (1, 2, 3)]
    omega = act_tensor(g, clients, [1, 2, 3], 1.0)
    start = afm(g, clients, [1, 2, 3], 1.0)
    refit = cp_als(omega, start, 5)
    assert (omega - cp_reconstruct(refit)).norm() <= (omega - cp_reconstruct(start)).norm()
    assert math.isfinite(float(cp_reconstruct(refit).sum()))
