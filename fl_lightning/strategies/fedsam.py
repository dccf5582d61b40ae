"""FedSAM (Qu et al., 2022; Caldarola et al., 2022): local SAM steps, FedAvg aggregation."""

from __future__ import annotations

from fl_lightning.api import register_strategy
from fl_lightning.strategies.fedavg import FedAvg
from fl_lightning.strategies.mixins.sharpness import SharpnessAware, check_sam_args


@register_strategy
class FedSAM(SharpnessAware, FedAvg):
    """FedSAM: every client minimises its SAM objective with local SAM steps; the server averages.

    Qu et al., "Generalized Federated Learning via Sharpness Aware Minimization", ICML 2022 (FedSAM);
    Caldarola et al., "Improving Generalization in Federated Learning by Seeking Flat Minima", ECCV 2022
    (the same local SAM step). As written in the FedSMOO paper, Sec. 3.2, eqs. (5)-(6): client ``i``
    minimises ``f_i^s(w) = max_{||s_i|| <= rho} f_i(w + s_i)``; at each local step on mini-batch ``xi``

    .. math::

        e = \\rho \\, g / (\\lVert g \\rVert + 10^{-7}), \\quad g = \\nabla f_i(w; \\xi), \\qquad
        w \\leftarrow w - \\eta \\big[\\mathrm{clip}(\\nabla f_i(w + e; \\xi)) + \\mathrm{wd} \\, w\\big]

    with one gradient norm over all parameters, the same mini-batch for both passes and weight decay
    applied by the optimizer (:class:`~fl_lightning.strategies.mixins.sharpness.SharpnessAware`). The server
    is FedAvg:
    ``w^{t+1} = w^t - eta_s (w^t - mean_k w_k)``. One model each way per round (spec P10).
    With ``rho = 0`` and no clipping it is FedAvg bit for bit.

    Args:
        rho: SAM radius ``rho`` (the FedSMOO paper uses 0.01 for FedSAM, Sec. 5.1).
        clip_norm: Clip each step's gradient ``grad f_i(w + e)`` to this global norm before the step
            (the reference code clips at 10, spec §2); None: no clipping.
        server_lr: Server learning rate on the pseudo-gradient.
    """

    name = "fedsam"
    vectorizable = True  # per-client norms through ctx.stacked

    def __init__(self, rho: float = 0.01, clip_norm: float | None = 10.0, server_lr: float = 1.0) -> None:
        super().__init__(server_lr=server_lr)
        check_sam_args(rho, clip_norm)
        self.rho = rho
        self.clip_norm = clip_norm

    def extra_repr(self) -> str:
        return f"rho={self.rho}, clip_norm={self.clip_norm}, server_lr={self.server_lr}"
