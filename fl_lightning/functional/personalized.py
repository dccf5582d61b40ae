"""The update rules of the personalised-FL baselines (APFL, FedRoD, FedALA, Per-FedAvg) on parameter groups.

Each function is one equation of its paper, on aligned lists (or dicts) of tensors; the strategies in
:mod:`fl_lightning.strategies` decide which tensors and when.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor


def apfl_mixture(
    v: Mapping[str, Tensor], w: Mapping[str, Tensor], alpha: Tensor | float
) -> dict[str, Tensor]:
    """APFL's personalised model (Deng, Kamani & Mahdavi, 2020, Alg. 1): ``v_bar = alpha v + (1 - alpha) w``.

    Differentiable in ``v`` and ``alpha`` (a 0-d tensor): the gradient of ``f(v_bar)`` is ``alpha g`` for
    ``v`` and ``<v - w, g>`` for ``alpha`` (the adaptive-alpha update), ``g = grad f(v_bar)``.
    """
    return {n: alpha * v[n] + (1 - alpha) * w[n] for n in v}


def balanced_softmax_loss(logits: Tensor, target: Tensor, log_prior: Tensor) -> Tensor:
    """The balanced softmax loss of FedRoD's generic head (Chen & Chao, ICLR 2022, Sec. 4; Ren et al.,
    2020): the cross-entropy of ``logits + log pi`` with ``pi`` the client's class prior.

    ``log_prior`` is ``[C]`` (``-inf`` for a class the client does not have, which then gets no
    probability); any constant added to it leaves the loss unchanged, so log counts work as well.
    """
    return F.cross_entropy(logits + log_prior.to(logits.dtype), target)


def ala_mix(local: Sequence[Tensor], global_: Sequence[Tensor], weights: Sequence[Tensor]) -> list[Tensor]:
    """FedALA's adaptive local aggregation (Zhang et al., AAAI 2023, Sec. 3):
    ``theta_hat = theta_local + (theta_global - theta_local) * W``, element-wise."""
    return [lo + (g - lo) * wt for lo, g, wt in zip(local, global_, weights)]


def ala_weight_step(
    weights: Sequence[Tensor],
    grads: Sequence[Tensor],
    local: Sequence[Tensor],
    global_: Sequence[Tensor],
    eta: float,
) -> list[Tensor]:
    """One step on FedALA's aggregation weights (Sec. 3): ``W <- clip(W - eta * grad ⊙ (theta_g - theta_l),
    0, 1)``, ``grad`` the loss gradient at the mixed model ``theta_hat`` (the chain rule through
    :func:`ala_mix`)."""
    return [
        (wt - eta * g * (gl - lo)).clamp_(0.0, 1.0) for wt, g, lo, gl in zip(weights, grads, local, global_)
    ]


def hessian_free_direction(
    outer: Sequence[Tensor], plus: Sequence[Tensor], minus: Sequence[Tensor], alpha: float, delta: float
) -> list[Tensor]:
    """Per-FedAvg (HF)'s outer gradient (Fallah, Mokhtari & Ozdaglar, NeurIPS 2020, Sec. 5):
    ``(I - alpha H) g`` with the Hessian-vector product ``H g`` on a third batch taken by finite
    differences, ``[grad f(w + delta g) - grad f(w - delta g)] / (2 delta)``.

    Args:
        outer: ``g = grad f(w - alpha grad f(w; D); D')``.
        plus: ``grad f(w + delta g; D'')``.
        minus: ``grad f(w - delta g; D'')``.
        alpha: The inner step size.
        delta: The finite-difference step.
    """
    return [g - alpha * (p - m) / (2 * delta) for g, p, m in zip(outer, plus, minus)]


def std_below(losses: Sequence[float], window: int, threshold: float) -> bool:
    """FedALA's stopping rule for the first weight learning (the authors' code): more than ``window``
    recorded losses and the (population) standard deviation of the last ``window`` below ``threshold``."""
    if len(losses) <= window:
        return False
    return float(torch.tensor(losses[-window:], dtype=torch.float64).std(correction=0)) < threshold


__all__ = [
    "ala_mix",
    "ala_weight_step",
    "apfl_mixture",
    "balanced_softmax_loss",
    "hessian_free_direction",
    "std_below",
]
