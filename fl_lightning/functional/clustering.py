"""Clustered federated learning: flat models, IFCA's cluster estimate, CFL's split test and bi-partition.

IFCA (Ghosh, Chung, Yin & Ramchandran, NeurIPS 2020) and CFL (Sattler, Müller & Samek, IEEE TNNLS 2020)
keep one model per cluster of clients. The strategies hold each cluster's model as one flat vector
(:func:`flatten_state`, :func:`unflatten_state`); the math that decides who belongs where is here:
:func:`lowest_loss` (IFCA's estimate of a client's cluster), :func:`update_norms` and :func:`should_split`
(CFL's stopping criteria), :func:`pairwise_cosine` and :func:`bipartition` (CFL's split), and
:func:`adjusted_rand` (agreement of the found clusters with the true groups, for the record).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

#: ``(name, shape)`` of each entry of a flat model, in order.
Layout = list[tuple[str, torch.Size]]


def flatten_state(tensors: Mapping[str, Tensor], layout: Layout, dtype: torch.dtype | None = None) -> Tensor:
    """The entries of ``tensors`` named by ``layout``, concatenated into one vector (in ``dtype``)."""
    parts = [tensors[name].detach().reshape(-1) for name, _ in layout]
    flat = torch.cat(parts) if parts else torch.zeros(0)
    return flat if dtype is None else flat.to(dtype)


def unflatten_state(
    flat: Tensor, layout: Layout, like: Mapping[str, Tensor] | None = None
) -> dict[str, Tensor]:
    """``{name: view of flat}`` shaped by ``layout`` (cast to ``like[name]``'s dtype where it differs)."""
    out: dict[str, Tensor] = {}
    offset = 0
    for name, shape in layout:
        n = shape.numel()
        t = flat[offset : offset + n].view(shape)
        if like is not None and like[name].dtype != t.dtype:
            t = t.to(like[name].dtype)
        out[name] = t
        offset += n
    return out


def lowest_loss(losses: Tensor) -> int:
    """IFCA's cluster estimate (Alg. 1/2, step 4): ``argmin_j F_i(theta_j)``, the first index on ties."""
    return int(torch.argmin(losses).item())


def update_norms(updates: Tensor, weights: Tensor) -> tuple[float, float]:
    """CFL's two norms of a cluster's updates ``Delta_i`` ``(K, D)`` with weights ``|D_i|`` ``(K,)``:

    .. math:: \\Big\\lVert \\sum_i \\frac{|D_i|}{|D_c|} \\Delta_i \\Big\\rVert,
        \\qquad \\max_i \\lVert \\Delta_i \\rVert

    (Sattler et al., 2020, Alg. 1: the mean update is small near a stationary point of the cluster's
    objective, while some client's update stays large when the clients' objectives disagree).
    """
    w = weights.to(updates.dtype)
    mean = (updates * (w / w.sum()).unsqueeze(1)).sum(dim=0)
    return float(mean.norm()), float(updates.norm(dim=1).max())


def should_split(mean_norm: float, max_norm: float, eps_1: float, eps_2: float, size: int) -> bool:
    """CFL's criterion (Alg. 1): split when ``mean_norm < eps_1`` and ``max_norm > eps_2`` and the cluster has
    more than two clients (the authors' code, ``len(idc) > 2``)."""
    return mean_norm < eps_1 and max_norm > eps_2 and size > 2


def pairwise_cosine(updates: Tensor, eps: float = 1e-12) -> Tensor:
    """``alpha_ij = <Delta_i, Delta_j> / (||Delta_i|| ||Delta_j|| + eps)`` for updates ``(K, D)`` (Sec. III,
    eq. 11; ``eps`` as in the authors' code)."""
    norms = updates.norm(dim=1)
    return (updates @ updates.T) / (norms.unsqueeze(1) * norms.unsqueeze(0) + eps)


def bipartition(similarity: Tensor) -> tuple[list[int], list[int]]:
    """Split ``K >= 2`` clients in two by complete-linkage agglomeration on the distance ``-alpha``.

    CFL's bi-partition (Sattler et al., 2020, Sec. III-B; the authors' code runs scikit-learn's
    ``AgglomerativeClustering(linkage="complete")`` on ``-alpha``): start from singletons, repeatedly merge
    the two groups whose largest pairwise distance is smallest, until two groups remain. Ties merge the
    pair with the lowest indices. Returns the two groups as sorted index lists, the one holding client 0
    first.
    """
    k = similarity.shape[0]
    if k < 2:
        raise ValueError(f"a bi-partition needs at least 2 clients, got {k}")
    dist = (-similarity.detach().double()).cpu()
    groups: list[list[int]] = [[i] for i in range(k)]
    # linkage[a][b]: the largest distance between members of groups a and b (complete linkage)
    linkage = dist.clone()
    alive = list(range(k))
    while len(alive) > 2:
        best: tuple[float, int, int] | None = None
        for x, a in enumerate(alive):
            for b in alive[x + 1 :]:
                d = float(linkage[a, b])
                if best is None or d < best[0]:
                    best = (d, a, b)
        assert best is not None
        _, a, b = best
        groups[a] = sorted(groups[a] + groups[b])
        merged = torch.maximum(linkage[a], linkage[b])
        linkage[a, :], linkage[:, a] = merged, merged
        alive.remove(b)
    first, second = (groups[i] for i in alive)
    return (first, second) if 0 in first else (second, first)


def adjusted_rand(truth: Sequence[int], found: Sequence[int]) -> float:
    """The adjusted Rand index of ``found`` cluster ids against ``truth`` group ids (1: the same partition up
    to relabelling, about 0: chance); scikit-learn's ``adjusted_rand_score``."""
    from sklearn.metrics import adjusted_rand_score

    return float(adjusted_rand_score(list(truth), list(found)))


__all__ = [
    "Layout",
    "adjusted_rand",
    "bipartition",
    "flatten_state",
    "lowest_loss",
    "pairwise_cosine",
    "should_split",
    "unflatten_state",
    "update_norms",
]
