"""FedPAC's math: class statistics, global prototypes, alignment, head statistics, the simplex QP."""

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from fl_lightning.functional.prototypes import (
    alignment_loss,
    class_statistics,
    collaboration_matrix,
    combination_weights,
    combine_heads,
    global_prototypes,
    head_statistics,
    local_prototypes,
    project_simplex,
    simplex_qp,
)


def test_class_statistics_and_prototypes_by_hand():
    f = torch.tensor([[1.0, 0.0], [3.0, 2.0], [0.0, 4.0]])
    y = torch.tensor([0, 0, 2])
    sums, counts, sq = class_statistics(f, y, 3)
    assert torch.equal(sums, torch.tensor([[4.0, 2.0], [0.0, 0.0], [0.0, 4.0]]))
    assert torch.equal(counts, torch.tensor([2.0, 0.0, 1.0]))
    assert torch.equal(sq, torch.tensor([1.0 + 13.0, 0.0, 16.0]))
    assert torch.equal(local_prototypes(sums, counts), torch.tensor([[2.0, 1.0], [0.0, 0.0], [0.0, 4.0]]))


def test_global_prototypes_weight_each_client_by_its_class_count():
    protos = torch.tensor([[[1.0], [5.0]], [[4.0], [0.0]]])  # 2 clients, 2 classes, d = 1
    counts = torch.tensor([[1.0, 2.0], [3.0, 0.0]])
    c, total = global_prototypes(protos, counts)
    assert torch.allclose(c, torch.tensor([[(1 * 1 + 3 * 4) / 4], [5.0]]))
    assert torch.equal(total, torch.tensor([4.0, 2.0]))


def test_alignment_loss_is_the_mean_squared_distance_to_the_class_prototype():
    f = torch.tensor([[1.0, 1.0], [0.0, 2.0], [5.0, 5.0]])
    y = torch.tensor([0, 1, 2])
    protos = torch.tensor([[0.0, 0.0], [0.0, 0.0], [9.0, 9.0]])
    present = torch.tensor([True, True, False])  # class 2 has no global prototype: no pull
    expected = ((1 + 1) + (0 + 4) + 0) / (3 * 2)
    assert alignment_loss(f, y, protos, present).item() == pytest.approx(expected)
    f.requires_grad_(True)
    alignment_loss(f, y, protos, present).backward()
    assert torch.equal(f.grad[2], torch.zeros(2)) and torch.allclose(f.grad[0], 2 * torch.ones(2) / 6)


def test_head_statistics_by_hand():
    f = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 2.0]])
    y = torch.tensor([0, 0, 1])
    h, v = head_statistics(*class_statistics(f, y, 2))
    p = torch.tensor([2 / 3, 1 / 3])
    mu = torch.tensor([[2.0, 0.0], [0.0, 2.0]])
    assert torch.allclose(h, p.unsqueeze(1) * mu)
    second = torch.tensor([(1 + 9) / 2, 4.0])
    expected = (p * second - p**2 * mu.pow(2).sum(1)).sum() / 3
    assert v.item() == pytest.approx(expected.item())


def test_collaboration_matrix_is_the_quadratic_form_of_bias_plus_variance():
    torch.manual_seed(0)
    h, v, a = torch.randn(4, 3, 2, dtype=torch.float64), torch.rand(4, dtype=torch.float64), torch.rand(4)
    a = (a / a.sum()).double()
    P = collaboration_matrix(h[1], h, v)
    direct = (a**2 * v).sum() + (h[1] - torch.einsum("j,jcd->cd", a, h)).pow(2).sum()
    assert torch.allclose(a @ P @ a, direct)


def test_project_simplex():
    x = torch.tensor([[0.5, 0.5, 0.5], [2.0, 0.0, 0.0], [-1.0, -1.0, 3.0], [0.2, 0.3, 0.5]])
    out = project_simplex(x)
    assert torch.allclose(out, torch.tensor([[1 / 3] * 3, [1.0, 0, 0], [0, 0, 1.0], [0.2, 0.3, 0.5]]))


@pytest.mark.parametrize("m", [2, 3, 7, 20])
def test_simplex_qp_matches_a_reference_solver(m):
    g = torch.Generator().manual_seed(m)
    A = torch.randn(m, m, generator=g, dtype=torch.float64)
    P = A @ A.T / m + torch.diag(torch.rand(m, generator=g, dtype=torch.float64)) * 0.1
    alpha = simplex_qp(P)
    assert alpha.min() >= 0 and alpha.sum().item() == pytest.approx(1.0)
    Pn = P.numpy()
    ref = minimize(
        lambda x: x @ Pn @ x,
        np.full(m, 1 / m),
        jac=lambda x: 2 * Pn @ x,
        bounds=[(0, 1)] * m,
        constraints=[{"type": "eq", "fun": lambda x: x.sum() - 1}],
        method="SLSQP",
        options={"ftol": 1e-15, "maxiter": 2000},
    )
    assert (alpha @ P @ alpha).item() <= ref.fun + 1e-9
    grad = 2 * P @ alpha  # KKT: the gradient is minimal (and equal) on the support
    assert (grad[alpha > 1e-8] - grad.min()).abs().max() < 1e-6


def test_combination_weights_trade_bias_against_variance():
    h = torch.randn(3, 4, 5, dtype=torch.float64)
    # no variance: each client keeps its own head (zero bias)
    assert torch.allclose(
        combination_weights(h, torch.zeros(3, dtype=torch.float64)), torch.eye(3, dtype=torch.float64)
    )
    # identical statistics and equal variances: the plain average (least variance)
    same = h[:1].expand(3, 4, 5)
    assert torch.allclose(
        combination_weights(same, torch.ones(3, dtype=torch.float64)),
        torch.full((3, 3), 1 / 3, dtype=torch.float64),
    )


def test_combine_heads_is_a_convex_combination_per_client():
    heads = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]])
    A = torch.tensor([[1.0, 0, 0], [0.5, 0.5, 0], [0.25, 0.25, 0.5]])
    assert torch.allclose(combine_heads(A, heads), torch.tensor([[1.0, 0.0], [0.5, 0.5], [1.25, 1.25]]))
