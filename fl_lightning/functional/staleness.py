"""Staleness weights of asynchronous aggregation: how much an update computed on an old model counts.

An update's staleness ``tau = t - tau_k`` is the number of server steps taken since the model its client
started from (version ``tau_k``), at server step ``t``.

- FedBuff (Nguyen et al., AISTATS 2022, Sec. 3 and Alg. 1) scales each buffered update by
  ``s(tau) = 1 / sqrt(1 + tau)``.
- FedAsync (Xie, Koyejo & Gupta, 2019, Sec. 3 and Sec. 5.2) mixes ``x <- (1 - alpha_t) x + alpha_t x_new``
  with ``alpha_t = alpha * s(tau)`` and one of: constant ``s = 1``; polynomial ``s_a(tau) = (tau + 1)^(-a)``;
  hinge ``s_{a,b}(tau) = 1`` for ``tau <= b``, else ``1 / (a (tau - b) + 1)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor

#: The staleness functions FedAsync defines, by name.
STALENESS = ("constant", "polynomial", "hinge")


def fedbuff_weight(tau: int) -> float:
    """FedBuff's ``s(tau) = 1 / sqrt(1 + tau)``."""
    return 1.0 / math.sqrt(1.0 + tau)


def polynomial_weight(tau: int, a: float) -> float:
    """FedAsync's polynomial ``s_a(tau) = (tau + 1)^(-a)``."""
    return (tau + 1.0) ** (-a)


def hinge_weight(tau: int, a: float, b: float) -> float:
    """FedAsync's hinge ``s_{a,b}(tau) = 1`` if ``tau <= b`` else ``1 / (a (tau - b) + 1)``."""
    return 1.0 if tau <= b else 1.0 / (a * (tau - b) + 1.0)


def staleness_weight(kind: str, tau: int, a: float = 0.5, b: float = 4.0) -> float:
    """FedAsync's ``s(tau)`` of the named kind (:data:`STALENESS`)."""
    if tau < 0:
        raise ValueError(f"staleness must be >= 0, got {tau}")
    if kind == "constant":
        return 1.0
    if kind == "polynomial":
        return polynomial_weight(tau, a)
    if kind == "hinge":
        return hinge_weight(tau, a, b)
    raise ValueError(f"staleness kind must be one of {', '.join(STALENESS)}, got {kind!r}")


def scaled_difference(x: Mapping[str, Tensor], y: Mapping[str, Tensor], factor: float) -> dict[str, Tensor]:
    """``factor * (x - y)`` for every name of ``y`` (new tensors; one multi-tensor op each).

    FedBuff's client update ``Delta = x^tau - y`` scaled by ``s(tau)``; FedAsync's step
    ``alpha_t (x - x_new)``, after which ``x - alpha_t (x - x_new) = (1 - alpha_t) x + alpha_t x_new``.
    """
    names = list(y)
    if not names:
        return {}
    with torch.no_grad():
        diff = torch._foreach_sub([x[n].detach() for n in names], [y[n].detach() for n in names])
        if factor != 1.0:
            torch._foreach_mul_(diff, factor)
    return dict(zip(names, diff, strict=True))


__all__ = [
    "STALENESS",
    "fedbuff_weight",
    "hinge_weight",
    "polynomial_weight",
    "scaled_difference",
    "staleness_weight",
]
