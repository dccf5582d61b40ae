"""Class prototypes, feature alignment and classifier collaboration (FedPAC, Xu, Tong & Huang, ICLR 2023).

FedPAC splits a network into a feature extractor ``f_theta`` (the body, shared) and a linear classifier
head ``phi_i`` (personal). Its two mechanisms are plain functions of per-client feature statistics:

* **Feature alignment** (Sec. 4.2): every client pulls its features toward the *global* class prototypes
  ``c_k`` (the sample-weighted mean of the clients' local prototypes, :func:`global_prototypes`) with the
  regulariser :func:`alignment_loss`.
* **Classifier collaboration** (Sec. 4.3): the server replaces client ``i``'s head by a convex combination
  ``phi_hat_i = sum_j alpha_ij phi_j`` of the round's heads, with the weights minimising the quadratic
  estimate of the combined head's test loss (bias + variance, :func:`collaboration_matrix`) over the
  probability simplex (:func:`simplex_qp`).

All statistics are computed from ``[N, d]`` features and integer labels by :func:`class_statistics`.
"""

from __future__ import annotations

import torch
from torch import Tensor


def class_statistics(features: Tensor, labels: Tensor, num_classes: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per-class sums of features, sample counts and sums of squared feature norms.

    Args:
        features: ``[N, d]`` features.
        labels: ``[N]`` integer labels in ``0..num_classes-1``.
        num_classes: ``C``.

    Returns:
        ``(sums [C, d], counts [C], sq_norms [C])`` in ``features``' dtype: ``sum_{l: y_l=k} f_l``,
        ``n_k`` and ``sum_{l: y_l=k} ||f_l||^2``. Additive over batches (accumulate them with ``+``).
    """
    f = features.detach()
    sums = f.new_zeros(num_classes, f.shape[1]).index_add_(0, labels, f)
    counts = f.new_zeros(num_classes).index_add_(0, labels, torch.ones_like(labels, dtype=f.dtype))
    sq = f.new_zeros(num_classes).index_add_(0, labels, f.pow(2).sum(dim=1))
    return sums, counts, sq


def local_prototypes(sums: Tensor, counts: Tensor) -> Tensor:
    """Local class prototypes ``c_hat_k = sums_k / n_k`` (``[C, d]``; zero rows for absent classes)."""
    return sums / counts.clamp_min(1).unsqueeze(1)


def global_prototypes(protos: Tensor, counts: Tensor) -> tuple[Tensor, Tensor]:
    """The server's global prototypes from the clients' local ones (FedPAC Sec. 4.2).

    .. math:: c_k = \\frac{\\sum_i n_{i,k} \\hat c_{i,k}}{\\sum_i n_{i,k}}

    Args:
        protos: ``[m, C, d]`` local prototypes of ``m`` clients.
        counts: ``[m, C]`` their per-class sample counts ``n_{i,k}``.

    Returns:
        ``(c [C, d], total [C])``: the global prototypes (zero rows for classes no client holds) and
        ``sum_i n_{i,k}``.
    """
    total = counts.sum(dim=0)
    c = torch.einsum("mc,mcd->cd", counts, protos) / total.clamp_min(1).unsqueeze(1)
    return c, total


def alignment_loss(features: Tensor, labels: Tensor, protos: Tensor, present: Tensor) -> Tensor:
    """FedPAC's feature-alignment regulariser (Sec. 4.2) on a batch, averaged over samples and dimensions.

    .. math:: R_i(\\theta) = \\frac{1}{n\\, d} \\sum_{l} \\lVert f_\\theta(x_l) - c_{y_l} \\rVert_2^2

    i.e. the squared distance of every feature to its class's global prototype; the mean over the ``d``
    feature dimensions follows the authors' code (``nn.MSELoss``), for which their ``lambda = 1`` is set.
    Samples whose class has no global prototype (``present[y] == False``) contribute nothing (they count
    in ``n``).

    Args:
        features: ``[N, d]`` features (with gradient).
        labels: ``[N]`` integer labels.
        protos: ``[C, d]`` global prototypes (no gradient).
        present: ``[C]`` bool, classes that have a global prototype.
    """
    target = protos[labels].to(features.dtype)
    mask = present[labels].to(features.dtype).unsqueeze(1)
    return ((features - target).pow(2) * mask).mean()


def head_statistics(sums: Tensor, counts: Tensor, sq_norms: Tensor) -> tuple[Tensor, Tensor]:
    """A client's statistics for classifier collaboration (FedPAC Sec. 4.3), from :func:`class_statistics`.

    With ``p_k = n_k / n`` the client's label distribution and ``mu_k`` its class-conditional feature
    means,

    .. math:: h_{k} = p_k \\mu_k, \\qquad
              V = \\frac{1}{n} \\sum_k \\Big( p_k\\, \\mathbb{E}[\\lVert f \\rVert^2 \\mid y=k]
              - p_k^2 \\lVert \\mu_k \\rVert^2 \\Big)

    (``h`` is ``[C, d]``; ``V`` a scalar: the variance term of the combined head's loss, shrinking with
    the client's sample count ``n``; the estimator of the authors' code).

    Returns:
        ``(h [C, d], v [])``.
    """
    n = counts.sum().clamp_min(1)
    p = counts / n
    mu = local_prototypes(sums, counts)
    second = sq_norms / counts.clamp_min(1)
    v = (p * second - p.pow(2) * mu.pow(2).sum(dim=1)).sum() / n
    return p.unsqueeze(1) * mu, v


def collaboration_matrix(h_ref: Tensor, h: Tensor, v: Tensor) -> Tensor:
    """The quadratic form of client ``i``'s combination problem (FedPAC Sec. 4.3, eq. 10).

    .. math:: \\min_{\\alpha_i \\in \\Delta} \\; \\sum_j \\alpha_{ij}^2 V_j
              + \\Big\\lVert \\sum_j \\alpha_{ij} (h_i - h_j) \\Big\\rVert_F^2
              = \\alpha_i^\\top P_i \\alpha_i, \\qquad
              P_i = \\mathrm{diag}(V) + B_i,\\; (B_i)_{j j'} = \\langle h_i - h_j, h_i - h_{j'} \\rangle_F

    (on the simplex ``sum_j alpha_ij = 1``, the bias term is ``||h_i - sum_j alpha_ij h_j||^2``).

    Args:
        h_ref: ``[C, d]`` client ``i``'s ``h``.
        h: ``[m, C, d]`` the ``h`` of the ``m`` clients combined (including ``i``).
        v: ``[m]`` their variance terms ``V_j``.

    Returns:
        ``P_i``, ``[m, m]``, symmetric positive semi-definite.
    """
    diff = (h_ref.unsqueeze(0) - h).flatten(1)
    return torch.diag(v) + diff @ diff.T


def project_simplex(x: Tensor) -> Tensor:
    """Euclidean projection of the rows of ``x`` onto the probability simplex (sort-based, exact)."""
    m = x.shape[-1]
    u, _ = torch.sort(x, dim=-1, descending=True)
    css = u.cumsum(dim=-1) - 1
    k = torch.arange(1, m + 1, device=x.device, dtype=x.dtype)
    rho = ((u - css / k) > 0).to(x.dtype).cumsum(dim=-1).argmax(dim=-1, keepdim=True)
    tau = css.gather(-1, rho) / (rho + 1).to(x.dtype)
    return (x - tau).clamp_min(0)


def simplex_qp(P: Tensor, max_iter: int = 5000, tol: float = 1e-10) -> Tensor:
    """``argmin_alpha alpha^T P alpha`` over the probability simplex, for a PSD ``P`` (``[m, m]``).

    Solved by accelerated projected gradient (FISTA with the exact simplex projection, step ``1/L`` with
    ``L = 2 lambda_max(P)``, in float64). The problem is convex, so the iteration converges to a global
    minimiser; it stops when the Frank-Wolfe gap ``g^T alpha - min_j g_j`` (``g = 2 P alpha``; an upper
    bound on ``f(alpha) - f*``) falls below ``tol * L``. (The authors solve the same problem with
    cvxpy; no exact QP solver is among this package's dependencies.)

    Returns:
        ``alpha``, ``[m]``, non-negative, summing to 1, in ``P``'s dtype.
    """
    Q = P.detach().to(torch.float64)
    Q = (Q + Q.T) / 2
    m = Q.shape[0]
    lipschitz = 2 * float(torch.linalg.eigvalsh(Q).max().clamp_min(0))
    x = torch.full((m,), 1.0 / m, dtype=torch.float64, device=Q.device)
    if m == 1 or lipschitz == 0:
        return x.to(P.dtype)
    y, t = x.clone(), 1.0
    for _ in range(max_iter):
        x_new = project_simplex(y - (2 * Q @ y) / lipschitz)
        t_new = (1 + (1 + 4 * t * t) ** 0.5) / 2
        y = x_new + ((t - 1) / t_new) * (x_new - x)
        x, t = x_new, t_new
        g = 2 * Q @ x
        if float(g @ x - g.min()) <= tol * lipschitz:  # Frank-Wolfe gap >= f(x) - f*
            break
    return x.to(P.dtype)


def combination_weights(h: Tensor, v: Tensor, **qp: float) -> Tensor:
    """Every client's combination weights: row ``i`` solves client ``i``'s problem (:func:`simplex_qp`).

    Args:
        h: ``[m, C, d]`` the clients' ``h``.
        v: ``[m]`` their ``V``.

    Returns:
        ``A`` ``[m, m]`` with ``A[i] = alpha_i`` (rows on the simplex).
    """
    return torch.stack([simplex_qp(collaboration_matrix(h[i], h, v), **qp) for i in range(h.shape[0])])


def combine_heads(weights: Tensor, heads: Tensor) -> Tensor:
    """``phi_hat_i = sum_j A_ij phi_j`` for all clients at once: ``A @ heads`` (heads flat, ``[m, P]``)."""
    return weights.to(heads.dtype) @ heads


__all__ = [
    "alignment_loss",
    "class_statistics",
    "collaboration_matrix",
    "combination_weights",
    "combine_heads",
    "global_prototypes",
    "head_statistics",
    "local_prototypes",
    "project_simplex",
    "simplex_qp",
]
