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
#: ``ctx.scratch`` key of the buffers :func:`perturb` saves ``w`` into (allocated once per client and round).
SAM_SAVED = "sam/saved"

NORM_EPS = 1e-7

Grads = list[Tensor | None]


@torch.no_grad()
def global_norm(tensors: Iterable[Tensor | None]) -> Tensor:
    """The L2 norm of the concatenation of ``tensors`` (None entries skipped): ``sqrt(sum_j ||t_j||^2)``.

    One norm across all tensors, never a per-tensor norm (spec P1, P20). Computed as the reference
    does, ``||(||t_1||, ..., ||t_n||)||``, with one multi-tensor ``torch._foreach_norm`` per dtype and
    device (no per-tensor dispatch, no host sync). Returns a 0-dim tensor on the device of the first
    tensor: float32 for 16-bit inputs (their norms are accumulated in float32), else the inputs' dtype
    (0 for no tensors).
    """
    present = [t for t in tensors if t is not None]
    if not present:
        return torch.zeros(())
    groups = _by_device_and_dtype(present)
    norms: list[Tensor] = []
    for (_, dtype), group in groups.items():
        norms.extend(torch._foreach_norm(group, 2, dtype=_accumulation_dtype(dtype)))
    if len(groups) > 1:
        first = present[0].device
        norms = [n.to(first, torch.promote_types(n.dtype, torch.float32)) for n in norms]
    return torch.linalg.vector_norm(torch.stack(norms), 2)


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
def clip_grads_(params: Sequence[Tensor], max_norm: float) -> Tensor:
    """Scale the gradients of ``params`` to global norm at most ``max_norm``; returns the norm before.

    The rule of ``torch.nn.utils.clip_grad_norm_``, ``g <- g * min(1, max_norm / (||g|| + 1e-6))``
    with one global norm, without its per-tensor device copies of the partial norms: one
    :func:`global_norm` and one multi-tensor multiply, no host sync.
    """
    grads = [p.grad for p in params if p.grad is not None]
    total = global_norm(grads)
    if grads:
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0).to(grads[0].dtype)
        torch._foreach_mul_(grads, coef)
    return total


def missing(tensors: Sequence[Tensor | None]) -> bool:
    """True when some entry of ``tensors`` is None (a parameter without a gradient)."""
    return any(t is None for t in tensors)


@torch.no_grad()
def sam_offsets(direction: Sequence[Tensor | None], rho: float, eps: float = NORM_EPS) -> Grads:
    """The SAM perturbation ``e_j = rho * d_j / (||d|| + eps)``, ``||d||`` the global norm of ``direction``.

    ``rho = 0`` gives exact zeros. None entries (parameters without a gradient) stay None. One
    global norm and one multi-tensor multiply by the 0-dim scale (no host sync).
    """
    present = [d for d in direction if d is not None]
    if not present:
        return [None] * len(direction)
    scale = (rho / (global_norm(present) + eps)).to(present[0].dtype)
    scaled = iter(torch._foreach_mul(present, scale))
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
    paused = getattr(module, "_train_paused", None)
    if paused is not None:
        module._train_paused = True
    try:
        yield
    finally:
        if paused is not None:
            module._train_paused = paused


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

    The hooks get whole lists (``names``, ``grads``, ``offsets`` aligned with each other, parameters
    without a gradient in the first pass left out; the list is the same object at every step when
    none is missing, so per-client lists aligned with it can be built once) and should use
    multi-tensor ops (``torch._foreach_*``): the step then costs a handful of kernel launches
    besides the two passes, however many parameter tensors the model has, and no host sync.

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
        """After the second pass and the restore of ``w``, before the base strategy's corrections.

        ``params``: the parameters of this step's ``names`` (those with a gradient in the first pass).
        """

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
        saved = ctx.scratch.get(SAM_SAVED)
        if saved is None:
            saved = ctx.scratch[SAM_SAVED] = [torch.empty_like(p) for p in params]
        ctx.scratch[SAM_PASS] = True
        try:
            closure()
            grads = [p.grad for p in params]
            if missing(grads):  # parameters outside this loss: no perturbation, hooks see the others
                keep = [i for i, g in enumerate(grads) if g is not None]
                params, names = [params[i] for i in keep], [names[i] for i in keep]
                grads, saved = [grads[i] for i in keep], [saved[i] for i in keep]
            offsets = sam_offsets(self.ascent_direction(module, ctx, names, grads), self.rho)
            self.on_perturbation(module, ctx, names, offsets)
            perturb(params, offsets, saved)
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
            clip_grads_(_trainable(module, optimizer, ctx)[0], self.clip_norm)
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
