"""FedSpeed (Sun et al., ICLR 2023): FedDyn's dual correction with SAM-type local gradients."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from fl_lightning.api import ClientContext, register_strategy
from fl_lightning.errors import check_number
from fl_lightning.functional.sharpness import Grads
from fl_lightning.strategies.feddyn import FedDyn
from fl_lightning.strategies.mixins.sharpness import SharpnessAware, check_sam_args

FIRST = "fedspeed/first_grads"  # buffers holding g_1 of the current step


@register_strategy
class FedSpeed(SharpnessAware, FedDyn):
    """FedSpeed: the FedDyn local objective minimised with a quasi-gradient that merges SAM's.

    Sun et al., "FedSpeed: Larger Local Interval, Less Communication Round, and Higher Generalization
    Accuracy", ICLR 2023, Alg. 1 (lines 7-11): at each local step on mini-batch ``xi``

    .. math::

        g_1 = \\nabla f_i(w; \\xi), \\quad g_2 = \\nabla f_i(w + \\rho g_1 / \\lVert g_1 \\rVert; \\xi),
        \\quad
        \\tilde g = (1 - a) g_1 + a g_2,

        w \\leftarrow w - \\eta \\big[\\mathrm{clip}(\\tilde g - \\lambda_i + (w - w^t)/\\beta)
        + \\mathrm{wd} \\, w\\big]

    with the prox-correction (dual) ``lambda_i <- lambda_i - (w_K - w^t)/beta`` and the server of
    :class:`FedDyn` (``alpha = 1/beta``). ``sam_weight = a = 1`` (default) is the reference simulator's
    FedSpeed, i.e. FedDyn + local SAM, which is the FedSMOO paper's ablation row "dynamic
    regularization + SAM" (Table 8, spec §2): FedSMOO without the perturbation correction.
    Deviation from the ICLR paper: its server averages the prox-corrected local models
    ``w_K - beta lambda_i`` of the round's clients, whereas this class (like the simulator) keeps
    FedDyn's server dual over all ``m`` clients. One model each way per round (spec P10).
    With ``rho = 0`` or ``sam_weight = 0`` it is FedDyn.

    Args:
        beta: Penalty coefficient; the prox coefficient is ``1/beta`` (reference: 0.1, i.e. beta = 10).
        rho: SAM radius (0.1 in the reference simulator's README).
        sam_weight: Weight ``a`` of the gradient at the perturbed point in the quasi-gradient, in [0, 1].
        clip_norm: Clip each step's gradient (with the dual correction) to this global norm (the
            reference: 10); None: no clipping.
        server_lr: Server learning rate (used as in :class:`FedDyn`).
    """

    name = "fedspeed"
    vectorizable = True  # per-client norms through ctx.stacked; the g_1/g_2 mix is elementwise

    def __init__(
        self,
        beta: float = 10.0,
        rho: float = 0.1,
        sam_weight: float = 1.0,
        clip_norm: float | None = 10.0,
        server_lr: float = 1.0,
    ) -> None:
        check_number(
            beta, "model.strategy.beta", low=0, low_open=True, hint="(prox coefficient 1/beta); e.g. 10"
        )
        check_number(sam_weight, "model.strategy.sam_weight", low=0, high=1, hint="1 is plain SAM")
        super().__init__(alpha=1.0 / beta, server_lr=server_lr)
        check_sam_args(rho, clip_norm)
        self.beta = beta
        self.rho = rho
        self.sam_weight = sam_weight
        self.clip_norm = clip_norm

    @torch.no_grad()
    def ascent_direction(
        self, module: nn.Module, ctx: ClientContext, names: list[str], grads: Grads
    ) -> Grads:
        if self.sam_weight != 1.0:  # keep g_1 for the mix: copied into buffers reused at every step
            cached = ctx.scratch.get(FIRST)
            if cached is None or cached[0] is not names:
                cached = ctx.scratch[FIRST] = (names, [torch.empty_like(g) for g in grads])
            torch._foreach_copy_(cached[1], grads)
        return grads

    @torch.no_grad()
    def on_restored(self, module: nn.Module, ctx: ClientContext, params: list[Tensor]) -> None:
        if self.sam_weight == 1.0:
            return
        pairs = [(p.grad, g1) for p, g1 in zip(params, ctx.scratch[FIRST][1]) if p.grad is not None]
        grads, first = [g for g, _ in pairs], [g1 for _, g1 in pairs]
        torch._foreach_mul_(grads, self.sam_weight)  # g~ = a g_2 + (1 - a) g_1
        torch._foreach_add_(grads, first, alpha=1.0 - self.sam_weight)

    def extra_repr(self) -> str:
        return (
            f"beta={self.beta}, rho={self.rho}, sam_weight={self.sam_weight}, clip_norm={self.clip_norm}, "
            f"server_lr={self.server_lr}"
        )
