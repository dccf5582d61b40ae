"""Plain math of the drift-correcting strategies (SCAFFOLD, FedDyn, FedDC, FedCM) and FedNova's step count.

Each rule comes twice: on one tensor (one parameter; ``feddyn_gradient``), and on a whole parameter
group as aligned lists (``feddyn_gradients``), computed with multi-tensor ``torch._foreach_*`` ops
in the same order of float operations, so both give the same values bit for bit. The strategies use
the list versions in their per-step hooks: a step then costs a few kernel launches whatever the number
of parameter tensors, and no host sync. Functions return new tensors, except the ``*_`` ones that
edit gradients in place. The strategies in :mod:`fl_lightning.strategies` hold the state and call
these; the tests check them against hand-computed values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

Tensors = Sequence[Tensor]


def trainable_parameters(
    module: nn.Module, names: Mapping[str, object] | None = None
) -> dict[str, nn.Parameter]:
    """``{name: parameter}`` of the parameters that require a gradient (and are in ``names``, if given)."""
    return {n: p for n, p in module.named_parameters() if p.requires_grad and (names is None or n in names)}


def add_grad_(param: Tensor, term: Tensor) -> None:
    """``param.grad += term``; a parameter without a gradient gets ``term`` as its gradient.

    A parameter that did not enter the loss has gradient zero, so its corrected gradient is the term.
    """
    if param.grad is None:
        param.grad = term.detach().clone()
    else:
        param.grad.add_(term)


@torch.no_grad()
def add_grads_(params: Tensors, terms: Tensors) -> None:
    """:func:`add_grad_` for aligned lists: one multi-tensor ``g_j += t_j`` (gradients None get ``t_j``)."""
    grads = [p.grad for p in params]
    if all(g is not None for g in grads):
        torch._foreach_add_(grads, list(terms))
        return
    pairs = [(g, t) for g, t in zip(grads, terms, strict=True) if g is not None]
    if pairs:
        torch._foreach_add_([g for g, _ in pairs], [t for _, t in pairs])
    for p, t in zip(params, terms):
        if p.grad is None:
            p.grad = t.detach().clone()


def fill_missing(tensors: Sequence[Tensor | None], like: Tensors) -> list[Tensor] | None:
    """``tensors`` with None entries replaced by zeros like ``like``; None if every entry is None.

    For per-client state that is zero until a client is first sampled: the list versions take one
    list or None (all zero), so a partial state is filled once per client, not per step.
    """
    if all(t is None for t in tensors):
        return None
    return [torch.zeros_like(x) if t is None else t for t, x in zip(tensors, like, strict=True)]


def scaffold_control_update(
    c_i: Tensor | None, c: Tensor, start: Tensor, end: Tensor, steps: int, lr: float
) -> Tensor:
    """SCAFFOLD option II (Karimireddy et al., 2020, Alg. 1 line 12): ``c_i+ = c_i - c + (x - y_i)/(K lr)``.

    Args:
        c_i: The client's control variate (None: zero, a client never sampled before).
        c: The server control variate ``c`` of the round.
        start: The global model ``x`` the client started from.
        end: The client's model ``y_i`` after ``steps`` local steps.
        steps: Local steps ``K``.
        lr: The local learning rate of the round.
    """
    new = (start - end).div_(steps * lr).sub_(c)
    return new if c_i is None else new.add_(c_i)


@torch.no_grad()
def scaffold_step_correction_(params: Tensors, corrections: Tensors, lr: float) -> None:
    """``y_j <- y_j - lr (c - c_i)_j`` in place: SCAFFOLD's correction (Alg. 1 line 10) applied to the
    parameters after the optimizer's own step, outside its momentum and weight decay (NIID-Bench's
    ``train_net_scaffold``).

    Args:
        params: The client's parameters ``y_i``.
        corrections: ``c - c_i``, aligned with ``params``.
        lr: The round's local learning rate ``eta_l``.
    """
    torch._foreach_add_(list(params), list(corrections), alpha=-lr)


def feddyn_gradient(param: Tensor, anchor: Tensor, dual: Tensor | None, alpha: float) -> Tensor:
    """Gradient of FedDyn's local terms ``-<lambda_i, w> + alpha/2 ||w - w^t||^2``.

    Returns ``alpha (w - w^t) - lambda_i``; ``dual`` None means ``lambda_i = 0`` (client never sampled).
    """
    term = (param.detach() - anchor).mul_(alpha)
    return term if dual is None else term.sub_(dual)


@torch.no_grad()
def feddyn_gradients(params: Tensors, anchors: Tensors, duals: Tensors | None, alpha: float) -> list[Tensor]:
    """:func:`feddyn_gradient` on aligned lists: ``alpha (w_j - w^t_j) - lambda_{i,j}`` for every j.

    Acar et al. (2021), Alg. 1: the gradient of ``-<lambda_i, w> + alpha/2 ||w - w^t||^2``; ``duals``
    None means ``lambda_i = 0``. Three multi-tensor ops.
    """
    terms = torch._foreach_sub(list(params), list(anchors))
    torch._foreach_mul_(terms, alpha)
    if duals is not None:
        torch._foreach_sub_(terms, list(duals))
    return terms


def feddyn_dual_update(dual: Tensor | None, param: Tensor, anchor: Tensor, alpha: float) -> Tensor:
    """FedDyn client dual (Acar et al., 2021, Alg. 1): ``lambda_i <- lambda_i - alpha (w_i - w^t)``.

    ``lambda_i`` is the client's ``grad L_i(theta_i^t)``; ``dual`` None means zero.
    """
    step = (param.detach() - anchor).mul_(alpha)
    return step.neg_() if dual is None else dual - step


@torch.no_grad()
def feddyn_dual_updates(
    duals: Tensors | None, params: Tensors, anchors: Tensors, alpha: float
) -> list[Tensor]:
    """:func:`feddyn_dual_update` on aligned lists: ``lambda_i <- lambda_i - alpha (w_i - w^t)``.

    Returns new tensors; ``duals`` None means zero.
    """
    steps = torch._foreach_sub(list(params), list(anchors))
    torch._foreach_mul_(steps, alpha)
    if duals is None:
        torch._foreach_neg_(steps)
        return steps
    return torch._foreach_sub(list(duals), steps)


def feddc_gradient(
    param: Tensor, anchor: Tensor, drift: Tensor | None, correction: Tensor | None, alpha: float
) -> Tensor:
    """Gradient of FedDC's local terms ``alpha/2 ||h_i + theta - w||^2 + <theta, c - c_i>``.

    Returns ``alpha (theta + h_i - w) + (c - c_i)``; ``drift`` (``h_i``) or ``correction``
    (``c - c_i``) None means zero.
    """
    diff = param.detach() - anchor
    if drift is not None:
        diff.add_(drift)
    term = diff.mul_(alpha)
    return term if correction is None else term.add_(correction)


@torch.no_grad()
def feddc_gradients(
    params: Tensors,
    anchors: Tensors,
    drifts: Tensors | None,
    corrections: Tensors | None,
    alpha: float,
) -> list[Tensor]:
    """:func:`feddc_gradient` on aligned lists: ``alpha (theta_j + h_{i,j} - w_j) + (c - c_i)_j``.

    Gao et al. (2022), Sec. 3: the gradient of ``alpha/2 ||h_i + theta - w||^2 + <theta, c - c_i>``;
    ``drifts`` or ``corrections`` None means zero. At most four multi-tensor ops.
    """
    terms = torch._foreach_sub(list(params), list(anchors))
    if drifts is not None:
        torch._foreach_add_(terms, list(drifts))
    torch._foreach_mul_(terms, alpha)
    if corrections is not None:
        torch._foreach_add_(terms, list(corrections))
    return terms


def fedcm_direction_(grad: Tensor, momentum: Tensor, alpha: float) -> Tensor:
    """FedCM's client-level momentum in place (Xu et al., 2021): ``g <- alpha g + (1 - alpha) Delta``."""
    return grad.mul_(alpha).add_(momentum, alpha=1.0 - alpha)


@torch.no_grad()
def fedcm_directions_(params: Tensors, momenta: Tensors, alpha: float) -> None:
    """:func:`fedcm_direction_` on the gradients of ``params``: ``g_j <- alpha g_j + (1 - alpha) Delta_j``.

    Xu et al. (2021), Alg. 1; a parameter without a gradient (``g = 0``) gets ``(1 - alpha) Delta_j``.
    Two multi-tensor ops.
    """
    grads = [p.grad for p in params]
    present = [(g, m) for g, m in zip(grads, momenta, strict=True) if g is not None]
    if present:
        gs, ms = [g for g, _ in present], [m for _, m in present]
        torch._foreach_mul_(gs, alpha)
        torch._foreach_add_(gs, ms, alpha=1.0 - alpha)
    if len(present) < len(grads):
        for p, m in zip(params, momenta):
            if p.grad is None:  # shaped like p: stacked clients' parameters broadcast a shared Delta
                p.grad = torch.zeros_like(p).add_(m, alpha=1.0 - alpha)


def fednova_norm(steps: int, momentum: float = 0.0, prox: float = 0.0) -> float:
    """``||a_i||_1`` of FedNova (Wang et al., NeurIPS 2020, Sec. 4): how many plain-SGD steps' worth of
    gradient a client's local change holds.

    A client that took ``tau = steps`` local steps from ``x^t`` moved by ``x^t - x_i = eta sum_k a_{i,k} g_k``
    (``g_k`` the step's stochastic gradient, weight decay included); ``||a_i||_1 = sum_k |a_{i,k}|``:

    - plain SGD: ``a_i = [1, ..., 1]``, ``||a_i||_1 = tau``;
    - heavy-ball momentum ``rho`` (``v <- rho v + g``, ``x <- x - eta v``; torch's SGD without dampening or
      Nesterov): ``a_{i,k} = (1 - rho^(tau-k)) / (1 - rho)``,
      ``||a_i||_1 = [tau - rho (1 - rho^tau) / (1 - rho)] / (1 - rho)``;
    - a proximal term ``mu/2 ||x - x^t||^2`` (FedProx), ``prox = alpha = eta mu``:
      ``a_{i,k} = (1 - alpha)^(tau-1-k)``, ``||a_i||_1 = [1 - (1 - alpha)^tau] / alpha``;
    - both: the sum of the coefficients of the same linear recursion (``v <- rho v + g + mu (x - x^t)``),
      for which the paper gives no closed form; the sum equals ``||a_i||_1`` while the coefficients are
      non-negative (as in every case the paper treats), and keeps ``d_i = G_i a_i / sum_k a_{i,k}`` a
      gradient average (``g`` for a constant gradient ``g``) when an underdamped recursion makes some of
      them negative.
    """
    tau = int(steps)
    if momentum == 0 and prox == 0:
        return float(tau)
    if prox == 0:
        return (tau - momentum * (1 - momentum**tau) / (1 - momentum)) / (1 - momentum)
    if momentum == 0:
        return (1 - (1 - prox) ** tau) / prox
    # the response Y_m of -(x - x^t)/eta, m steps after one unit gradient: V <- rho V - alpha Y, Y <- Y + V
    total, v, y = 0.0, 1.0, 1.0
    for m in range(tau):
        if m:
            v = momentum * v - prox * y
            y = y + v
        total += y
    return total
