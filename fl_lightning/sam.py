"""Sharpness-aware minimisation (SAM) in local training: plain functions and a strategy mixin.

SAM (Foret et al., ICLR 2021, eqs. 2-3; FedSMOO paper Sec. 3.1, eqs. 2-4) replaces the gradient at ``w``
by the gradient at the approximate worst point of an ``r``-ball around it::

    eps = r * d / (||d|| + 1e-7)        d = g = grad f(w; xi)      (one L2 norm over ALL parameters)
    w  <- w - lr * grad f(w + eps; xi)                              (same mini-batch xi)

so one local step costs two forward/backward passes. The functions below are the math (a single global
norm, the offsets, perturb/restore); :class:`SharpnessAware` turns them into the local step of a
strategy through the ``Strategy.local_step`` hook. The ``1e-7`` in the denominator is the one of the
reference code (FL-Simulator's ``ESAM``/``DRegSAM``), so ``||eps|| = r * ||d|| / (||d|| + 1e-7)``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from fl_lightning.errors import ConfigError, check_number

if TYPE_CHECKING:
    from fl_lightning.strategies.base import ClientContext

#: ``ctx.scratch`` key that is True while a SAM pass runs the closure (the base's terms are off).
SAM_PASS = "sam/pass"
#: ``ctx.scratch`` key holding ``(params, names)`` of the trainable parameters of the round.
SAM_PARAMS = "sam/params"

NORM_EPS = 1e-7

Grads = list[Tensor | None]


def global_norm(tensors: Iterable[Tensor | None]) -> Tensor:
    """The L2 norm of the concatenation of ``tensors`` (None entries skipped): ``sqrt(sum_j ||t_j||^2)``.

    One norm across all tensors, never a per-tensor norm (spec P1, P20). Computed as the reference
    does, ``||(||t_1||, ..., ||t_n||)||``; returns a 0-dim float32 tensor (0 for no tensors).
    """
    norms = [t.detach().float().norm(2) for t in tensors if t is not None]
    if not norms:
        return torch.zeros(())
    return torch.linalg.vector_norm(torch.stack(norms), 2)


def global_grad_norm(params: Iterable[Tensor]) -> Tensor:
    """:func:`global_norm` of the ``.grad`` of ``params`` (parameters without a gradient are skipped)."""
    return global_norm(p.grad for p in params)


def sam_offsets(direction: Sequence[Tensor | None], rho: float, eps: float = NORM_EPS) -> Grads:
    """The SAM perturbation ``e_j = rho * d_j / (||d|| + eps)``, ``||d||`` the global norm of ``direction``.

    ``rho = 0`` gives exact zeros. None entries (parameters without a gradient) stay None.
    """
    norm = global_norm(direction)
    out: Grads = []
    for d in direction:
        out.append(None if d is None else d * (rho / (norm + eps)).to(d))
    return out


@torch.no_grad()
def perturb(params: Sequence[Tensor], offsets: Sequence[Tensor | None]) -> Grads:
    """``w_j <- w_j + e_j`` in place; returns copies of the original values for :func:`restore`."""
    saved: Grads = []
    for p, e in zip(params, offsets, strict=True):
        if e is None:
            saved.append(None)
            continue
        saved.append(p.detach().clone())
        p.add_(e)
    return saved


@torch.no_grad()
def restore(params: Sequence[Tensor], saved: Sequence[Tensor | None]) -> None:
    """Copy the values saved by :func:`perturb` back: ``w`` is restored bit for bit (no ``(w+e)-e``)."""
    for p, s in zip(params, saved, strict=True):
        if s is not None:
            p.copy_(s)


def check_sam_args(rho: float, clip_norm: float | None, rho_field: str = "rho") -> None:
    """Raise :class:`ConfigError` for a negative radius or a non-positive clipping norm."""
    check_number(rho, f"model.strategy.{rho_field}", low=0, hint="(SAM radius); the paper uses 0.01-0.1")
    if clip_norm is not None:
        check_number(
            clip_norm,
            "model.strategy.clip_norm",
            low=0,
            low_open=True,
            hint="(or null: no clipping); the reference uses 10",
        )


@contextlib.contextmanager
def _frozen_train_stats(module: nn.Module) -> Iterator[None]:
    """Keep the client's running train statistics unchanged (they report the loss at ``w``, not ``w+e``)."""
    sums = getattr(module, "_train_sums", None)
    try:
        yield
    finally:
        if hasattr(module, "_train_sums"):
            module._train_sums = sums


class SharpnessAware:
    """Mixin giving a strategy the two-pass SAM local step; list it before the base strategy.

    ``class FedGamma(SharpnessAware, Scaffold)`` is SCAFFOLD whose gradient is taken at ``w + e``.
    One local step on mini-batch ``xi`` (:meth:`local_step`):

    1. ``closure()`` at ``w``: ``g = grad f(w; xi)`` of the task loss only (the base strategy's local term
       and gradient hook are switched off during both passes, as in the reference, whose ascent uses
       the plain loss);
    2. ``d = ascent_direction(g)`` (``g``; FedSMOO: ``g - mu_i - s``);
    3. ``e = rho * d / (||d|| + 1e-7)`` with one norm over all trainable parameters;
       :meth:`on_perturbation` sees ``e``; ``w <- w + e``;
    4. ``closure()`` at ``w + e`` on the SAME batch: ``g_hat`` (task loss only); ``w`` restored exactly;
    5. :meth:`on_restored` (FedSpeed mixes ``g`` and ``g_hat`` here);
    6. the base strategy's corrections at ``w``: its ``local_loss`` (backpropagated, it must depend on
       the parameters only) and its ``on_before_optimizer_step`` (SCAFFOLD ``c - c_i``, FedCM momentum,
       FedDyn dual) — so with ``rho = 0`` the step is the base strategy's step;
    7. clip the gradient to ``clip_norm`` (one global norm; None: no clipping), then
       ``optimizer.step()``: weight decay is applied by the optimizer and is not clipped (spec §1.7).

    The train statistics of the round report the loss at ``w`` (the second pass is not counted).
    ``model.grad_clip_norm`` of the loop would clip ``g`` and ``g_hat`` inside each pass, before the
    corrections; leave it null and use the strategy's ``clip_norm``. 16-bit mixed precision with a
    gradient scaler bypasses ``local_step`` and is rejected (use ``bf16-mixed`` or ``32-true``).

    Subclasses set ``self.rho`` and ``self.clip_norm`` in ``__init__``.
    """

    rho: float
    clip_norm: float | None

    # ------------------------------------------------------------------------ hooks for subclasses
    def ascent_direction(
        self, module: nn.Module, ctx: ClientContext, names: list[str], grads: Grads
    ) -> Grads:
        """The direction ``d`` normalised into the perturbation; default: the gradient ``g`` itself."""
        return grads

    def on_perturbation(
        self, module: nn.Module, ctx: ClientContext, names: list[str], offsets: Grads
    ) -> None:
        """Sees the perturbation ``e`` of this step before the parameters move (e.g. a dual update)."""

    def on_restored(self, module: nn.Module, ctx: ClientContext, params: list[Tensor]) -> None:
        """After the second pass and the restore of ``w``, before the base strategy's corrections."""

    # ------------------------------------------------------------------------ the step
    def local_step(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        ctx: ClientContext,
        batch: Any,
        closure: Callable[[], Tensor],
    ) -> None:
        params, names = _trainable(module, optimizer, ctx)
        ctx.scratch[SAM_PASS] = True
        try:
            closure()
            grads = [p.grad for p in params]
            offsets = sam_offsets(self.ascent_direction(module, ctx, names, grads), self.rho)
            self.on_perturbation(module, ctx, names, offsets)
            saved = perturb(params, offsets)
            with _frozen_train_stats(module):
                closure()
            restore(params, saved)
        finally:
            ctx.scratch[SAM_PASS] = False
        self.on_restored(module, ctx, params)
        base: Any = super()
        extra = base.local_loss(module, ctx, batch, None)
        if extra is not None and extra.requires_grad:
            extra.backward()
        base.on_before_optimizer_step(module, optimizer, ctx)
        if self.clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, self.clip_norm)
        optimizer.step()

    def local_loss(self, module: nn.Module, ctx: ClientContext, batch: Any, outputs: Tensor) -> Tensor | None:
        if ctx.scratch.get(SAM_PASS):
            return None
        return super().local_loss(module, ctx, batch, outputs)  # type: ignore[misc]

    def on_before_optimizer_step(
        self, module: nn.Module, optimizer: torch.optim.Optimizer, ctx: ClientContext
    ) -> None:
        if ctx.scratch.get(SAM_PASS):
            return
        raise ConfigError(
            f"model.strategy={type(self).__name__} needs its two-pass local step, which 16-bit mixed "
            "precision bypasses; set trainer.precision to bf16-mixed or 32-true"
        )


def _trainable(
    module: nn.Module, optimizer: torch.optim.Optimizer, ctx: ClientContext
) -> tuple[list[Tensor], list[str]]:
    """The optimizer's trainable parameters and their names in ``module`` (computed once per round)."""
    cached = ctx.scratch.get(SAM_PARAMS)
    if cached is None:
        name_of = {id(p): n for n, p in module.named_parameters()}
        params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        cached = (params, [name_of[id(p)] for p in params])
        ctx.scratch[SAM_PARAMS] = cached
    return cached
