"""The SAM local step as a strategy mixin (FedSAM, MoFedSAM, FedGamma, FedSpeed, FedSMOO).

The math (one global norm, the offsets, perturb/restore) is in :mod:`fl_lightning.functional.sharpness`;
:class:`SharpnessAware` turns it into the local step of a strategy through the ``Strategy.local_step`` hook.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from fl_lightning.api import ClientContext
from fl_lightning.errors import check_number
from fl_lightning.functional.sharpness import Grads, clip_grads_, missing, perturb, restore, sam_offsets

#: ``ctx.scratch`` key that is True while a SAM pass runs the closure (the base's terms are off).
SAM_PASS = "sam/pass"


#: ``ctx.scratch`` key holding ``(params, names)`` of the trainable parameters of the round.
SAM_PARAMS = "sam/params"


#: ``ctx.scratch`` key of the buffers :func:`perturb` saves ``w`` into (allocated once per client and round).
SAM_SAVED = "sam/saved"


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
    """Keep the client's running train statistics and logged values unchanged (they report ``w``, not
    ``w+e``)."""
    paused = getattr(module, "_train_paused", None)
    if paused is not None:
        module._train_paused = True
    logs = getattr(module, "_local_logs", None)
    logs = dict(logs) if logs is not None else None
    try:
        yield
    finally:
        if paused is not None:
            module._train_paused = paused
        if logs is not None:
            module._local_logs = logs


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
    #: Declared capabilities (:data:`fl_lightning.api.strategy.CAPABILITIES`), read through the strategy.
    steps_itself = True
    changes_gradients = True

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
            offsets = sam_offsets(
                self.ascent_direction(module, ctx, names, grads), self.rho, stacked=ctx.stacked > 0
            )
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
            clip_grads_(_trainable(module, optimizer, ctx)[0], self.clip_norm, stacked=ctx.stacked > 0)
        optimizer.step()

    def local_loss(self, module: nn.Module, ctx: ClientContext, batch: Any, outputs: Tensor) -> Tensor | None:
        if ctx.scratch.get(SAM_PASS):
            return None
        return super().local_loss(module, ctx, batch, outputs)  # type: ignore[misc]

    def on_before_optimizer_step(
        self, module: nn.Module, optimizer: torch.optim.Optimizer, ctx: ClientContext
    ) -> None:
        """Nothing in the closure's two passes: :meth:`local_step` applies the base strategy's gradient
        corrections once, after the restore (16-bit mixed precision, which would call this outside the
        passes, is refused by :meth:`~fl_lightning.api.strategy.Strategy.check`)."""


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
