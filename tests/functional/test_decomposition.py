"""Plain math of filter-atom decomposition: reconstruction, both forward forms, SVD init, cross terms."""

import itertools

import pytest
import torch
import torch.nn.functional as F

from fl_lightning.functional.decomposition import (
    atom_conv2d,
    conv_from_decomposed,
    cross_term_expansion,
    decomposed_num_params,
    fast_slow_ratio,
    orthonormal_atoms,
    reconstruct_filters,
    svd_atoms,
)


def _factors(c_out=4, c_in=3, m=5, k=3, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(c_out, c_in, m, generator=g, dtype=dtype), torch.randn(
        m, k, k, generator=g, dtype=dtype
    )


def test_reconstruction_is_the_element_formula():
    alpha, atoms = _factors()
    w = reconstruct_filters(alpha, atoms)
    assert w.shape == (4, 3, 3, 3)
    for o, i in itertools.product(range(4), range(3)):
        expected = sum(alpha[o, i, q] * atoms[q] for q in range(5))
        torch.testing.assert_close(w[o, i], expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("padding", [0, 1, 2])
@pytest.mark.parametrize("dilation", [1, 2])
@pytest.mark.parametrize("size", [9, 10])
def test_both_forward_forms_equal_the_dense_conv(stride, padding, dilation, size):
    alpha, atoms = _factors()
    bias = torch.randn(4, dtype=torch.float64)
    x = torch.randn(2, 3, size, size, dtype=torch.float64)
    dense = F.conv2d(x, reconstruct_filters(alpha, atoms), bias, stride, padding, dilation)
    for fn in (conv_from_decomposed, atom_conv2d):
        torch.testing.assert_close(
            fn(x, alpha, atoms, bias, stride, padding, dilation), dense, rtol=0, atol=1e-10
        )


def test_two_stage_form_with_groups_and_same_padding():
    alpha, atoms = _factors(c_out=6, c_in=2, m=4)  # groups=2: c_in=4 inputs, 2 per group
    x = torch.randn(2, 4, 7, 7, dtype=torch.float64)
    dense = F.conv2d(x, reconstruct_filters(alpha, atoms), None, 1, "same", 1, 2)
    torch.testing.assert_close(atom_conv2d(x, alpha, atoms, None, 1, "same", 1, 2), dense, rtol=0, atol=1e-10)


def test_orthonormal_atoms_rows_or_columns():
    d = orthonormal_atoms(5, (3, 3), torch.Generator().manual_seed(0)).reshape(5, 9)
    torch.testing.assert_close(d @ d.T, torch.eye(5), rtol=0, atol=1e-5)
    d = orthonormal_atoms(12, (3, 3), torch.Generator().manual_seed(0)).reshape(12, 9)
    torch.testing.assert_close(d.T @ d, torch.eye(9), rtol=0, atol=1e-5)


@pytest.mark.parametrize("m", [9, 12])
def test_svd_atoms_are_exact_when_there_are_at_least_k_squared(m):
    w = torch.randn(8, 5, 3, 3, dtype=torch.float64)
    alpha, atoms = svd_atoms(w, m)
    assert alpha.shape == (8, 5, m) and atoms.shape == (m, 3, 3)
    torch.testing.assert_close(reconstruct_filters(alpha, atoms), w, rtol=0, atol=1e-10)


def test_svd_atoms_error_is_the_discarded_singular_values():
    w = torch.randn(6, 4, 5, 5, dtype=torch.float64)
    s = torch.linalg.svdvals(w.reshape(24, 25))
    for m in (1, 3, 9, 20):
        alpha, atoms = svd_atoms(w, m)
        err = (w - reconstruct_filters(alpha, atoms)).pow(2).sum()
        torch.testing.assert_close(err, s[m:].pow(2).sum(), rtol=1e-9, atol=1e-9)


def test_cross_terms_sum_to_the_product_of_averages():
    m = 4
    p = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    alphas = [_factors(seed=s)[0] for s in range(m)]
    atoms = [_factors(seed=10 + s)[1] for s in range(m)]
    own, cross = cross_term_expansion(alphas, atoms, p.tolist())
    product = reconstruct_filters(
        sum(pk * a for pk, a in zip(p, alphas)), sum(pk * d for pk, d in zip(p, atoms))
    )
    torch.testing.assert_close(own + cross, product, rtol=0, atol=1e-10)
    # own terms by hand: sum_k p_k^2 alpha_k x D_k; the weights sum to (sum p)^2 = 1 over m^2 models
    torch.testing.assert_close(
        own, sum(pk**2 * reconstruct_filters(a, d) for pk, a, d in zip(p, alphas, atoms))
    )
    # cross terms by hand: sum_{i != j} p_i p_j alpha_i x D_j, the m^2 - m latent clients
    torch.testing.assert_close(
        cross,
        sum(
            p[i] * p[j] * reconstruct_filters(alphas[i], atoms[j])
            for i in range(m)
            for j in range(m)
            if i != j
        ),
        rtol=0,
        atol=1e-10,
    )
    weights = [float(p[i] * p[j]) for i in range(m) for j in range(m)]
    assert len(weights) - m == m * m - m == 12
    assert sum(weights) == pytest.approx(1.0)
    # the product of averages is not FedAvg on the reconstructed filters ...
    fedavg = sum(pk * reconstruct_filters(a, d) for pk, a, d in zip(p, alphas, atoms))
    assert (fedavg - product).abs().max() > 1e-3
    # ... except when every client has the same atoms
    shared = cross_term_expansion(alphas, [atoms[0]] * m, p.tolist())
    fedavg_shared = sum(pk * reconstruct_filters(a, atoms[0]) for pk, a in zip(p, alphas))
    torch.testing.assert_close(shared[0] + shared[1], fedavg_shared, rtol=0, atol=1e-10)


def test_one_client_has_no_cross_terms():
    alpha, atoms = _factors()
    own, cross = cross_term_expansion([alpha], [atoms], [1.0])
    torch.testing.assert_close(own, reconstruct_filters(alpha, atoms))
    assert torch.count_nonzero(cross) == 0


def test_product_of_averages_varies_less_than_average_of_products():
    """Spec §8.2: Var(product of means) <= Var(mean of products) (statistically, not by 1/m)."""
    g = torch.Generator().manual_seed(0)
    m, trials = 10, 2000
    a = 1.0 + 0.3 * torch.randn(trials, m, generator=g, dtype=torch.float64)
    d = 1.0 + 0.3 * torch.randn(trials, m, generator=g, dtype=torch.float64)
    decomposed = a.mean(1) * d.mean(1)
    fedavg = (a * d).mean(1)
    assert decomposed.var() <= fedavg.var()


def test_parameter_count_and_fast_slow_ratio_formulas():
    assert decomposed_num_params(64, 128, 5, 9) == 128 * 64 * 9 + 9 * 25
    assert decomposed_num_params(4, 6, (3, 3), 2, groups=2) == 6 * 2 * 2 + 2 * 9
    assert fast_slow_ratio(slow=100, fast=0, period=5) == pytest.approx(0.2)
    assert fast_slow_ratio(slow=100, fast=50, period=1) == pytest.approx(1.0)
    # CIFAR-100 LeNet with m_a = 9 (spec §7.4): alpha 75,456 of 941,350 -> about 0.936 for beta = 1/5
    assert fast_slow_ratio(slow=75_456, fast=941_350 - 75_456, period=5) == pytest.approx(0.936, abs=5e-4)
