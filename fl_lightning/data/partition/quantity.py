"""NIID-Bench's quantity skew (IID labels, Dirichlet client sizes) and mixed skew (label and quantity skew
together), without replacement."""

from __future__ import annotations

import math

import numpy as np

from fl_lightning.data.partition.base import (
    RUNAWAY_DRAWS,
    Partitioner,
    _as_labels,
    _check_alpha,
    _check_classes_per_client,
    _check_max_draws,
    _check_positive_min_size,
    _class_indices,
    _dirichlet_rows,
    _first_valid_draw,
    _runaway_error,
    _sorted_parts,
    check_num_clients,
)
from fl_lightning.errors import ConfigError


def _cuts(proportions: np.ndarray, n: int) -> np.ndarray:
    """Cut points of ``n`` items in the shares ``proportions``: ``floor(cumsum(p) * n)``, last one ``n``.

    ``proportions`` is one row of shares or a ``[b, m]`` batch of rows (cut points ``[b, m + 1]``).
    """
    p = np.asarray(proportions)
    edges = np.zeros((*p.shape[:-1], p.shape[-1] + 1), dtype=np.int64)
    edges[..., 1:] = (np.cumsum(p, axis=-1) * n).astype(np.int64)
    edges[..., -1] = n
    return np.maximum.accumulate(edges, axis=-1)


def quantity_skew_partition(
    num_samples: int,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator,
    min_size: int = 10,
    max_draws: int = RUNAWAY_DRAWS,
) -> list[np.ndarray]:
    """Quantity skew with IID labels: Dirichlet client sizes (NIID-Bench's ``iid-diff-quantity``).

    Shuffle the indices; draw the clients' shares ``q ~ Dir(alpha * 1_m)`` until every client's size
    ``floor(cumsum(q) * N)`` differences is at least ``min_size``; cut the shuffled indices there. Labels
    stay IID (every client's samples are a uniform draw); only the amounts differ.

    Redraw until valid, as NIID-Bench: its loop has no cap (at ``beta = 0.1`` with 10 parties it takes a
    median of ~200 draws, up to ~1,400). Here the draws are made in vectorised batches and the first valid
    draw of the sequence is accepted (:func:`_first_valid_draw`): exactly the distribution of one-at-a-time
    redraws, and for the same ``rng`` the same accepted shares (numpy draws the rows of a batch in
    sequence). Every setting with ``min_size * m <= N`` succeeds; only the run-away guard ``max_draws``
    (far beyond any valid setting's needs) can stop it. NIID-Bench's check is ``min(q) * N >= 10`` on the
    unrounded shares, which can still leave a client 9 samples after the flooring; here the integer sizes
    are checked, so every client holds at least ``min_size``.

    Reference: Q. Li, Y. Diao, Q. Chen, B. He, "Federated Learning on Non-IID Data Silos: An Experimental
    Study", ICDE 2022, Sec. III-C (quantity skew); ``utils.partition_data`` of Xtra-Computing/NIID-Bench.

    Args:
        num_samples: Size ``N`` of the training set.
        num_clients: Number of clients ``m``.
        alpha: Dirichlet concentration, > 0 (small: very unequal sizes).
        rng: Source of randomness.
        min_size: Minimum samples per client, >= 1.
        max_draws: Run-away guard on the number of draws (default :data:`RUNAWAY_DRAWS`).

    Returns:
        ``m`` sorted int64 index arrays covering every index exactly once.

    Raises:
        ConfigError: For a bad ``alpha``/``min_size``, ``min_size * m > N`` (impossible), or no valid draw
            within ``max_draws`` (the run-away guard).
    """
    check_num_clients(num_samples, num_clients)
    alpha = _check_alpha(alpha)
    min_size = _check_positive_min_size(min_size)
    max_draws = _check_max_draws(max_draws)
    if min_size * num_clients > num_samples:
        raise ConfigError(
            f"data.partition.min_size={min_size} is impossible: {num_clients} clients x {min_size} > the "
            f"{num_samples} training samples; use data.partition.min_size <= {num_samples // num_clients}"
        )
    perm = rng.permutation(num_samples)
    conc = np.full(num_clients, alpha)

    def draw(b: int) -> tuple[np.ndarray, np.ndarray]:
        edges = _cuts(_dirichlet_rows(rng, conc, b), num_samples)
        return np.diff(edges, axis=-1), edges

    edges, row, draws = _first_valid_draw(draw, num_clients, min_size, max_draws)
    if row < 0:
        raise _runaway_error(min_size, draws, f"alpha={alpha}, {num_clients} clients, {num_samples} samples")
    e = edges[row]  # type: ignore[index]
    return _sorted_parts([perm[e[i] : e[i + 1]] for i in range(num_clients)])


def mixed_class_assignment(
    num_clients: int,
    classes: np.ndarray,
    classes_per_client: int,
    rng: np.random.Generator,
    max_tries: int = 100,
) -> list[list[int]]:
    """The classes of each client in NIID-Bench's ``mixed`` split.

    Client ``i`` holds class ``classes[i mod C]`` and ``c - 1`` more, each drawn uniformly among the classes
    it does not hold yet that have fewer than ``ceil(m * c / C)`` holders (the first classes counted in
    advance), so the holders are as balanced as possible: NIID-Bench's 10 parties x 10 classes x 2 give
    every class exactly two holders. A draw that runs into a dead end (a client left with no class under
    the cap, where NIID-Bench's rejection loop would never end) is redrawn; after ``max_tries`` the
    least-held classes are allowed past the cap.
    """
    num_classes = len(classes)
    c = _check_classes_per_client(classes_per_client, num_classes)
    cap = math.ceil(num_clients * c / num_classes)
    for attempt in range(max_tries + 1):
        holders = np.bincount(np.arange(num_clients) % num_classes, minlength=num_classes)
        assignment, stuck = [], False
        for i in range(num_clients):
            mine = [i % num_classes]
            while len(mine) < c:
                free = np.array([k for k in range(num_classes) if k not in mine])
                eligible = free[holders[free] < cap]
                if not len(eligible):
                    stuck = True
                    eligible = free[holders[free] == holders[free].min()]
                k = int(rng.choice(eligible))
                mine.append(k)
                holders[k] += 1
            assignment.append(mine)
        if not stuck or attempt == max_tries:
            break
    return [[int(classes[k]) for k in mine] for mine in assignment]


def mixed_partition(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator,
    classes_per_client: int = 2,
    min_size: int = 10,
    max_draws: int = RUNAWAY_DRAWS,
) -> list[np.ndarray]:
    """Label skew plus quantity skew (NIID-Bench's ``mixed``).

    Each client holds ``c`` classes (:func:`mixed_class_assignment`: client ``i`` has class ``i mod C`` and
    ``c - 1`` balanced random ones); each class's shuffled samples are split among its ``h`` holders in
    shares ``Dir(alpha * 1_h)`` (NIID-Bench: ``Dir(beta, 2)`` between the two holders of each class), so
    clients differ both in which labels they hold and in how many samples. The shares (all classes') are
    redrawn until every client holds at least ``min_size`` samples (NIID-Bench does not check; a client can
    end up nearly empty there), in vectorised batches whose first valid draw is accepted
    (:func:`_first_valid_draw`): exactly the distribution of one-at-a-time redraws.

    Reference: Li et al., ICDE 2022, Sec. III-D (mixed skew); ``utils.partition_data`` of
    Xtra-Computing/NIID-Bench (``partition == "mixed"``).

    Args:
        labels: 1-D int class labels of the training set.
        num_clients: Number of clients ``m``.
        alpha: Dirichlet concentration of each class's split among its holders, > 0.
        rng: Source of randomness.
        classes_per_client: Classes per client ``c``.
        min_size: Minimum samples per client, >= 1.
        max_draws: Run-away guard on the number of draws of the shares (default :data:`RUNAWAY_DRAWS`).

    Returns:
        ``m`` sorted int64 index arrays; every sample of a held class is assigned once.

    Raises:
        ConfigError: For bad arguments; if ``min_size`` is impossible (more than the held samples, or more
            than a client's classes hold); or if no draw within ``max_draws`` met it (the run-away guard,
            which also catches a class assignment that cannot feed every client ``min_size``).
    """
    y = _as_labels(labels)
    check_num_clients(len(y), num_clients)
    alpha = _check_alpha(alpha)
    min_size = _check_positive_min_size(min_size)
    max_draws = _check_max_draws(max_draws)
    per_class = _class_indices(y)
    present = np.array([k for k, idx in enumerate(per_class) if len(idx)], dtype=np.int64)
    assignment = mixed_class_assignment(num_clients, present, classes_per_client, rng)
    owners: dict[int, list[int]] = {int(k): [] for k in present}
    for i, ks in enumerate(assignment):
        for k in ks:
            owners[k].append(i)
    held = {k: who for k, who in owners.items() if who}
    reach = [sum(len(per_class[k]) for k in ks) for ks in assignment]
    total = sum(len(per_class[k]) for k in held)
    if min_size * num_clients > total or min(reach) < min_size:
        worst = int(np.argmin(reach))
        raise ConfigError(
            f"data.partition.min_size={min_size} is impossible: {num_clients} clients share {total} samples "
            f"of their classes and client {worst}'s classes hold {reach[worst]}; use "
            f"data.partition.min_size <= {min(total // num_clients, min(reach))} or fewer data.num_clients"
        )
    shuffled = {k: rng.permutation(per_class[k]) for k in owners}

    def draw(b: int) -> tuple[np.ndarray, list[np.ndarray]]:
        sizes = np.zeros((b, num_clients), dtype=np.int64)
        cuts = []
        for k, who in held.items():
            edges = _cuts(_dirichlet_rows(rng, np.full(len(who), alpha), b), len(shuffled[k]))
            sizes[:, who] += np.diff(edges, axis=-1)
            cuts.append(edges)
        return sizes, cuts

    cells = sum(len(who) for who in held.values())
    cuts, row, draws = _first_valid_draw(draw, cells, min_size, max_draws)
    if row < 0:
        raise _runaway_error(
            min_size, draws, f"alpha={alpha}, {num_clients} clients, {classes_per_client} classes each"
        )
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for (k, who), edges in zip(held.items(), cuts):  # type: ignore[call-overload]
        e = edges[row]
        for j, i in enumerate(who):
            parts[i].append(shuffled[k][e[j] : e[j + 1]])
    return _sorted_parts([np.concatenate(ps) for ps in parts])


# ---------------------------------------------------------------------------------- configurable classes
class QuantitySkew(Partitioner):
    """IID labels, Dirichlet client sizes (NIID-Bench's ``iid-diff-quantity``).

    See :func:`quantity_skew_partition`.

    Args:
        alpha: Dirichlet concentration of the clients' shares (> 0); e.g. 0.5 as in NIID-Bench, smaller
            for more unequal sizes.
        min_size: Every client holds at least this many samples (NIID-Bench: 10).
    """

    name = "quantity_skew"

    def __init__(self, alpha: float = 0.5, min_size: int = 10) -> None:
        self.alpha = _check_alpha(alpha)
        self.min_size = _check_positive_min_size(min_size)

    def __call__(self, labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        return quantity_skew_partition(len(labels), num_clients, self.alpha, rng, min_size=self.min_size)


class MixedSkew(Partitioner):
    """Label and quantity skew together (NIID-Bench's ``mixed``; :func:`mixed_partition`).

    Args:
        alpha: Dirichlet concentration of each class's split among the clients holding it (> 0).
        classes_per_client: Classes each client holds (NIID-Bench: 2).
        min_size: Every client holds at least this many samples.
    """

    name = "mixed_skew"

    def __init__(self, alpha: float = 0.5, classes_per_client: int = 2, min_size: int = 10) -> None:
        self.alpha = _check_alpha(alpha)
        self.classes_per_client = _check_classes_per_client(classes_per_client)
        self.min_size = _check_positive_min_size(min_size)

    def __call__(self, labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        return mixed_partition(
            labels, num_clients, self.alpha, rng, self.classes_per_client, min_size=self.min_size
        )
