"""The distribution of a metric over clients: the fairness set of pFL-Bench and the generalisation gaps of
Yuan et al. (ICLR 2022, "What Do We Mean by Generalization in Federated Learning?", Sec. 2).

Plain Python on a list of per-client values (one value per client, e.g. its accuracy on its local test
split); nothing here knows where the values came from.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

#: The keys of :func:`client_spread`, in the order tables show them.
SPREAD_KEYS = (
    "n",
    "mean",
    "weighted_mean",
    "std",
    "min",
    "max",
    "bottom10",
    "top10",
    "p10",
    "p50",
    "p90",
)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (``q`` in [0, 100]) of ascending ``sorted_values`` by linear interpolation
    between the closest ranks: position ``(n - 1) q / 100`` (numpy's default ``linear`` method)."""
    n = len(sorted_values)
    if n == 0:
        raise ValueError("percentile of no values")
    pos = (n - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    return float(sorted_values[lo]) + (float(sorted_values[hi]) - float(sorted_values[lo])) * frac


def tail_mean(sorted_values: Sequence[float], fraction: float, top: bool = False) -> float:
    """Mean of the ``ceil(fraction * n)`` lowest (``top``: highest) of ascending ``sorted_values`` (at least
    one client: with fewer than 10 clients the bottom 10% is the worst client)."""
    n = len(sorted_values)
    k = max(1, math.ceil(fraction * n - 1e-9))
    part = sorted_values[n - k :] if top else sorted_values[:k]
    return sum(float(v) for v in part) / k


def client_spread(values: Sequence[float], weights: Sequence[float] | None = None) -> dict[str, float]:
    """The spread of a per-client metric.

    With ``v_k`` the value of client ``k`` of ``n`` and ``n_k`` its weight (its test samples)::

        mean          = (1/n) sum_k v_k                   (uniform: every client counts once)
        weighted_mean = sum_k n_k v_k / sum_k n_k          (every sample counts once)
        std           = sqrt((1/n) sum_k (v_k - mean)^2)   (population std over clients)
        min, max      = the worst and the best client
        bottom10      = mean of the ceil(0.1 n) worst clients; top10 of the ceil(0.1 n) best
        p10, p50, p90 = percentiles over clients, linear interpolation between ranks (numpy's default)

    Args:
        values: One value per client (at least one).
        weights: Each client's weight (None or all zero: ``weighted_mean`` equals ``mean``).

    Returns:
        ``{key: value}`` for the keys :data:`SPREAD_KEYS` (``n`` as a float count).
    """
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError("client_spread needs at least one client's value")
    if weights is not None and len(weights) != len(vals):
        raise ValueError(f"client_spread: {len(weights)} weights for {len(vals)} values")
    n = len(vals)
    mean = sum(vals) / n
    total = sum(float(w) for w in weights) if weights is not None else 0.0
    weighted = sum(float(w) * v for w, v in zip(weights, vals, strict=True)) / total if total > 0 else mean
    ordered = sorted(vals)
    return {
        "n": float(n),
        "mean": mean,
        "weighted_mean": weighted,
        "std": math.sqrt(sum((v - mean) ** 2 for v in vals) / n),
        "min": ordered[0],
        "max": ordered[-1],
        "bottom10": tail_mean(ordered, 0.1),
        "top10": tail_mean(ordered, 0.1, top=True),
        "p10": percentile(ordered, 10),
        "p50": percentile(ordered, 50),
        "p90": percentile(ordered, 90),
    }


def generalization_gaps(
    participating_train: float | None, participating_test: float | None, unseen_test: float | None
) -> dict[str, float]:
    """Yuan et al.'s two gaps (Sec. 2) from a metric's mean over clients (accuracy: higher is better)::

        out_of_sample_gap  = participating clients, train data - participating clients, test data
        participation_gap  = participating clients, test data  - unseen clients, test data

    A gap whose two terms are not both known is left out.
    """
    out: dict[str, float] = {}
    if participating_train is not None and participating_test is not None:
        out["out_of_sample_gap"] = float(participating_train) - float(participating_test)
    if participating_test is not None and unseen_test is not None:
        out["participation_gap"] = float(participating_test) - float(unseen_test)
    return out


__all__ = ["SPREAD_KEYS", "client_spread", "generalization_gaps", "percentile", "tail_mean"]
