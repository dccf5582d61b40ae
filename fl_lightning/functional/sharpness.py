"""Sharpness-aware minimisation (SAM): the math of the two-pass local step.

SAM (Foret et al., ICLR 2021, eqs. 2-3; FedSMOO paper Sec. 3.1, eqs. 2-4) replaces the gradient at ``w``
by the gradient at the approximate worst point of an ``r``-ball around it::

    eps = r * d / (||d|| + 1e-7)        d = g = grad f(w; xi)      (one L2 norm over ALL parameters)
    w  <- w - lr * grad f(w + eps; xi)                              (same mini-batch xi)

so one local step costs two forward/backward passes. The functions below are the math (a single global
norm, the offsets, perturb/restore); ``strategies.mixins.sharpness.SharpnessAware`` turns them into the
local step of a strategy through the ``Strategy.local_step`` hook. The ``1e-7`` in the denominator is the
one of the reference code (FL-Simulator's ``ESAM``/``DRegSAM``), so ``||eps|| = r * ||d|| / (||d|| + 1e-7)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor

NORM_EPS = 1e-7

Grads = list[Tensor | None]


@torch.no_grad()
def global_norm(tensors: Iterable[Tensor | None], stacked: bool = False) -> Tensor:
    """The L2 norm of the concatenation of ``tensors`` (None entries skipped): ``sqrt(sum_j ||t_j||^2)``.

    ``stacked=True``: every tensor holds ``C`` clients along dim 0 (vectorised clients) and the result is
    the ``[C]`` vector of each client's own global norm ``sqrt(sum_j ||t_j[c]||^2)`` (one concatenation
    of the flattened tensors and one norm over dim 1 per dtype).

    One norm across all tensors, never a per-tensor norm (spec P1, P20). Computed as the reference
    does, ``||(||t_1||, ..., ||t_n||)||``, with one multi-tensor ``torch._foreach_norm`` per dtype and
    device (no per-tensor dispatch, no host sync). Returns a 0-dim tensor on the device of the first
    tensor: float32 for 16-bit inputs (their norms are accumulated in float32), else the inputs' dtype
    (0 for no tensors).
    """
    present = [t for t in tensors if t is not None]
    if not present:
        return torch.zeros(())
    if stacked:
        return _client_norms(present)
    groups = _by_device_and_dtype(present)
    norms: list[Tensor] = []
    for (_, dtype), group in groups.items():
        norms.extend(torch._foreach_norm(group, 2, dtype=_accumulation_dtype(dtype)))
    if len(groups) > 1:
        first = present[0].device
        norms = [n.to(first, torch.promote_types(n.dtype, torch.float32)) for n in norms]
    return torch.linalg.vector_norm(torch.stack(norms), 2)


def _client_norms(tensors: Sequence[Tensor]) -> Tensor:
    """``[C]`` per-client global norms of tensors stacked over ``C`` clients along dim 0."""
    first = tensors[0]
    squares = [
        torch.linalg.vector_norm(
            torch.cat([t.reshape(t.shape[0], -1) for t in group], 1),
            2,
            dim=1,
            dtype=_accumulation_dtype(dtype),
        )
        .to(first.device)
        .square()
        for (_, dtype), group in _by_device_and_dtype(tensors).items()
    ]
    return torch.stack(squares).sum(0).sqrt() if len(squares) > 1 else squares[0].sqrt()


def per_client(scale: Tensor, tensors: Sequence[Tensor]) -> list[Tensor]:
    """``scale`` (``[C]``) as ``[C, 1, ..., 1]`` views broadcasting against each ``[C, ...]`` tensor."""
    return [scale.view(-1, *([1] * (t.dim() - 1))) for t in tensors]


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _by_device_and_dtype(tensors: Sequence[Tensor]) -> dict[tuple[torch.device, torch.dtype], list[Tensor]]:
    first = tensors[0]
    key = (first.device, first.dtype)
    if all(t.device == key[0] and t.dtype == key[1] for t in tensors):
        return {key: list(tensors)}
    groups: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    return groups


def global_grad_norm(params: Iterable[Tensor]) -> Tensor:
    """:func:`global_norm` of the ``.grad`` of ``params`` (parameters without a gradient are skipped)."""
    return global_norm(p.grad for p in params)


@torch.no_grad()
def clip_grads_(params: Sequence[Tensor], max_norm: float, stacked: bool = False) -> Tensor:
    """Scale the gradients of ``params`` to global norm at most ``max_norm``; returns the norm before.

    The rule of ``torch.nn.utils.clip_grad_norm_``, ``g <- g * min(1, max_norm / (||g|| + 1e-6))``
    with one global norm, without its per-tensor device copies of the partial norms: one
    :func:`global_norm` and one multi-tensor multiply, no host sync. ``stacked=True``: clients stacked
    along dim 0, each clipped by its own global norm (returns the ``[C]`` norms).
    """
    grads = [p.grad for p in params if p.grad is not None]
    total = global_norm(grads, stacked)
    if grads:
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0).to(grads[0].dtype)
        torch._foreach_mul_(grads, per_client(coef, grads) if stacked else coef)
    return total


def missing(tensors: Sequence[Tensor | None]) -> bool:
    """True when some entry of ``tensors`` is None (a parameter without a gradient)."""
    return any(t is None for t in tensors)


@torch.no_grad()
def sam_offsets(
    direction: Sequence[Tensor | None], rho: float, eps: float = NORM_EPS, stacked: bool = False
) -> Grads:
    """The SAM perturbation ``e_j = rho * d_j / (||d|| + eps)``, ``||d||`` the global norm of ``direction``.

    ``rho = 0`` gives exact zeros. None entries (parameters without a gradient) stay None. One
    global norm and one multi-tensor multiply by the 0-dim scale (no host sync). ``stacked=True``:
    clients stacked along dim 0, each normalised by its own global norm.
    """
    present = [d for d in direction if d is not None]
    if not present:
        return [None] * len(direction)
    scale = (rho / (global_norm(present, stacked) + eps)).to(present[0].dtype)
    scaled = iter(torch._foreach_mul(present, per_client(scale, present) if stacked else scale))
    return [None if d is None else next(scaled) for d in direction]


@torch.no_grad()
def perturb(
    params: Sequence[Tensor], offsets: Sequence[Tensor | None], saved: Sequence[Tensor] | None = None
) -> list[Tensor]:
    """``w_j <- w_j + e_j`` in place (None offsets: unchanged); returns the saved ``w`` for :func:`restore`.

    ``saved``: buffers like ``params`` to copy the values into (allocated if None), so a caller can
    reuse them at every step. Two multi-tensor ops.
    """
    if saved is None:
        saved = [torch.empty_like(p) for p in params]
    torch._foreach_copy_(list(saved), list(params))
    pairs = [(p, e) for p, e in zip(params, offsets, strict=True) if e is not None]
    if pairs:
        torch._foreach_add_([p for p, _ in pairs], [e for _, e in pairs])
    return list(saved)


@torch.no_grad()
def restore(params: Sequence[Tensor], saved: Sequence[Tensor | None]) -> None:
    """Copy the values saved by :func:`perturb` back: ``w`` is restored bit for bit (no ``(w+e)-e``)."""
    pairs = [(p, s) for p, s in zip(params, saved, strict=True) if s is not None]
    if pairs:
        torch._foreach_copy_([p for p, _ in pairs], [s for _, s in pairs])
