"""Splits with replacement: the FedDyn / FL-Simulator sampler used by the FedSMOO paper (equal client sizes;
a sample may be held by several clients; unequal per-class totals)."""

from __future__ import annotations

import bisect

import numpy as np

from fl_lightning.data.partition.base import (
    Partitioner,
    _as_labels,
    _check_alpha,
    _check_classes_per_client,
    _class_indices,
    _dirichlet_rows,
    _sorted_parts,
    check_num_clients,
)


def refill_partition(
    labels: np.ndarray, num_clients: int, prior: np.ndarray, rng: np.random.Generator
) -> list[np.ndarray]:
    """Equal-size client datasets drawn from per-client class priors, refilling exhausted classes.

    The "sampling with replacement" partitioner of the FedDyn code base and FL-Simulator (used by the
    FedSMOO paper). Every client gets ``n = N // m`` samples; the remainder ``N - n*m`` goes to client
    0, so the sizes sum to ``N``. Each class ``k`` has a pool of its shuffled indices with a
    countdown ``a_k`` (initially the class size). Until every client is full: pick a client ``i``
    uniformly among those with capacity left; draw a class ``k`` from its prior ``prior[i]``; if the
    pool of ``k`` is exhausted (``a_k == 0``), refill it (``a_k`` = class size, same order) and draw
    the class again; otherwise decrement ``a_k`` and give sample ``pool_k[a_k]`` to client ``i``.

    Consequences: client sizes are equal, the same sample can be held by several clients (and twice
    by one client after a refill; such repeats are kept), classes with zero prior mass are never
    drawn, and the per-class totals over the federation are unequal.

    References: D. A. E. Acar et al., "Federated Learning Based on Dynamic Regularization" (FedDyn),
    ICLR 2021; Y. Sun et al., "Dynamic Regularized Sharpness Aware Minimization in Federated
    Learning" (FedSMOO), ICML 2023.

    Args:
        labels: 1-D int class labels of the training set (``N`` samples).
        num_clients: Number of clients ``m``.
        prior: ``[m, C]`` non-negative class priors with ``C >= max(labels) + 1``; rows are
            normalised to sum to one. Mass on a class with no samples is an error.
        rng: Source of randomness.

    Returns:
        ``m`` sorted int64 index arrays (repeats possible) of sizes ``n + (N - n*m)``, ``n``, ..., ``n``.
    """
    y = _as_labels(labels)
    n_total = len(y)
    check_num_clients(n_total, num_clients)
    per_class = _class_indices(y)
    prior = np.asarray(prior, dtype=np.float64)
    if prior.ndim != 2 or prior.shape[0] != num_clients or prior.shape[1] < len(per_class):
        raise ValueError(
            f"prior must have shape [num_clients={num_clients}, >= {len(per_class)} classes], "
            f"got {prior.shape}"
        )
    if not np.isfinite(prior).all() or (prior < 0).any() or (prior.sum(axis=1) <= 0).any():
        raise ValueError("prior rows must be finite, non-negative and have a positive sum")
    num_classes = prior.shape[1]
    sizes = np.array([len(idx) for idx in per_class] + [0] * (num_classes - len(per_class)), dtype=np.int64)
    empty_with_mass = np.flatnonzero((prior > 0).any(axis=0) & (sizes == 0))
    if len(empty_with_mass):
        raise ValueError(f"prior puts mass on classes without samples: {empty_with_mass.tolist()}")

    # Cumulative priors, exact at the top: the last class with mass (and every class after it) ends at
    # 1.0, so u in [0, 1) always lands, via bisect_right, on a class with positive mass.
    cum = np.cumsum(prior / prior.sum(axis=1, keepdims=True), axis=1)
    last = num_classes - 1 - np.argmax(prior[:, ::-1] > 0, axis=1)
    cum[np.arange(num_classes)[None, :] >= last[:, None]] = 1.0
    cum_rows = cum.tolist()

    n = n_total // num_clients
    caps = [n] * num_clients
    caps[0] += n_total - n * num_clients
    pools = [rng.permutation(idx).tolist() for idx in per_class] + [
        [] for _ in range(num_classes - len(per_class))
    ]
    amount = [len(p) for p in pools]
    # Clients with capacity left; picking uniformly among them is the same as the reference's uniform
    # pick over all clients that skips the full ones.
    active = [i for i in range(num_clients) if caps[i] > 0]
    owner = np.empty(n_total, dtype=np.int64)
    sample = np.empty(n_total, dtype=np.int64)
    u_client = rng.random(n_total).tolist()
    u_class = rng.random(n_total).tolist()
    for t in range(n_total):
        j = min(int(u_client[t] * len(active)), len(active) - 1)
        i = active[j]
        caps[i] -= 1
        if caps[i] == 0:  # swap-remove a full client
            active[j] = active[-1]
            active.pop()
        row = cum_rows[i]
        k = bisect.bisect_right(row, u_class[t])
        while amount[k] <= 0:  # refill the exhausted class pool, then draw the class again
            amount[k] = len(pools[k])
            k = bisect.bisect_right(row, rng.random())
        amount[k] -= 1
        owner[t] = i
        sample[t] = pools[k][amount[k]]
    order = np.argsort(owner, kind="stable")
    bounds = np.searchsorted(owner[order], np.arange(num_clients + 1))
    return _sorted_parts([sample[order[bounds[i] : bounds[i + 1]]] for i in range(num_clients)])


def dirichlet_with_replacement(
    labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator
) -> list[np.ndarray]:
    """Dirichlet label skew with equal client sizes, sampled with replacement (FedDyn / FedSMOO).

    Each client's class prior is drawn as ``Dir(alpha * 1_C)`` over the classes present in
    ``labels``; the clients are then filled by :func:`refill_partition`. Unlike
    :func:`dirichlet_partition`, samples can be shared between clients and per-class totals differ.

    Args:
        labels: 1-D int class labels of the training set.
        num_clients: Number of clients ``m``.
        alpha: Dirichlet concentration, > 0.
        rng: Source of randomness.

    Returns:
        ``m`` sorted int64 index arrays of equal size (client 0 gets the remainder ``N mod m``).
    """
    y = _as_labels(labels)
    check_num_clients(len(y), num_clients)
    alpha = _check_alpha(alpha)
    per_class = _class_indices(y)
    present = np.array([k for k, idx in enumerate(per_class) if len(idx)], dtype=np.int64)
    prior = np.zeros((num_clients, len(per_class)))
    prior[:, present] = _dirichlet_rows(rng, np.full(len(present), alpha), num_clients)
    return refill_partition(y, num_clients, prior, rng)


def pathological_with_replacement(
    labels: np.ndarray, num_clients: int, classes_per_client: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Pathological label skew with equal client sizes, sampled with replacement (FedDyn / FedSMOO).

    Each client independently picks ``c`` distinct classes uniformly at random among those present;
    its prior is uniform (``1/c``) over them and zero elsewhere. The clients are then filled by
    :func:`refill_partition`, so every client's labels lie within its ``c`` classes.

    Args:
        labels: 1-D int class labels of the training set.
        num_clients: Number of clients ``m``.
        classes_per_client: Classes per client ``c``, between 1 and the number of classes present.
        rng: Source of randomness.

    Returns:
        ``m`` sorted int64 index arrays of equal size (client 0 gets the remainder ``N mod m``).
    """
    y = _as_labels(labels)
    check_num_clients(len(y), num_clients)
    per_class = _class_indices(y)
    present = np.array([k for k, idx in enumerate(per_class) if len(idx)], dtype=np.int64)
    c = _check_classes_per_client(classes_per_client, len(present))
    prior = np.zeros((num_clients, len(per_class)))
    for i in range(num_clients):
        prior[i, rng.choice(present, size=c, replace=False)] = 1.0 / c
    return refill_partition(y, num_clients, prior, rng)


# ---------------------------------------------------------------------------------- configurable classes
class DirichletWithReplacement(Partitioner):
    """Dirichlet class priors, equal client sizes, sampling with replacement (FedDyn / FedSMOO).

    See :func:`dirichlet_with_replacement` and :func:`refill_partition`.

    Args:
        alpha: Dirichlet concentration (> 0) of each client's class prior.
    """

    name = "dirichlet_with_replacement"

    def __init__(self, alpha: float = 0.1) -> None:
        self.alpha = _check_alpha(alpha)

    def __call__(self, labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        return dirichlet_with_replacement(labels, num_clients, self.alpha, rng)


class PathologicalWithReplacement(Partitioner):
    """``classes_per_client`` random classes per client, equal sizes, sampling with replacement.

    See :func:`pathological_with_replacement` and :func:`refill_partition` (FedDyn / FedSMOO).

    Args:
        classes_per_client: Number of distinct classes in each client's uniform class prior.
    """

    name = "pathological_with_replacement"

    def __init__(self, classes_per_client: int = 3) -> None:
        self.classes_per_client = _check_classes_per_client(classes_per_client)

    def __call__(self, labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        return pathological_with_replacement(labels, num_clients, self.classes_per_client, rng)
