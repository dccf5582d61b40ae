"""MoFedSAM (Qu et al., 2022): local SAM steps with FedCM's client-level momentum."""

from __future__ import annotations

from fl_lightning.api import register_strategy
from fl_lightning.strategies.fedcm import FedCM
from fl_lightning.strategies.mixins.sharpness import SharpnessAware, check_sam_args


@register_strategy
class MoFedSAM(SharpnessAware, FedCM):
    """MoFedSAM: FedCM whose local gradient is the SAM gradient.

    Qu et al., "Generalized Federated Learning via Sharpness Aware Minimization", ICML 2022 (MoFedSAM,
    the momentum variant of FedSAM); as described in the FedSMOO paper (Sec. 5.1: "a global momentum
    on each local client weighted by a coefficient alpha", 90% shared direction for alpha = 0.1) and
    implemented by the reference code (spec §2). The server broadcasts, with ``w^t``, FedCM's global
    direction ``Delta^t`` (the previous round's averaged update per local step, see :class:`FedCM`); at
    each local step on mini-batch ``xi``

    .. math::

        e = \\rho \\, g / (\\lVert g \\rVert + 10^{-7}), \\quad g = \\nabla f_i(w; \\xi), \\qquad
        w \\leftarrow w - \\eta \\big[\\mathrm{clip}(\\alpha \\nabla f_i(w + e; \\xi)
        + (1 - \\alpha) \\Delta^t) + \\mathrm{wd} \\, w\\big]

    (:class:`~fl_lightning.strategies.mixins.sharpness.SharpnessAware`: one gradient norm, same batch, the
    ascent on the task gradient only, FedCM's correction applied at ``w``). The server aggregates as
    FedCM. Two model-size vectors down (``w``, ``Delta``), as FedCM (Table 3 accounting: 2x FedAvg,
    spec P10). With ``rho = 0`` and no clipping it is FedCM.

    Args:
        rho: SAM radius (0.01 in the FedSMOO paper's experiments, Sec. 5.1).
        alpha: Weight of the local gradient; ``1 - alpha`` goes to the global direction (0.1, App. B.4).
        clip_norm: Clip each step's gradient (after the momentum mix) to this global norm (the
            reference: 10); None: no clipping.
        server_lr: Server learning rate on the pseudo-gradient.
    """

    name = "mofedsam"
    vectorizable = True  # per-client norms through ctx.stacked; FedCM's mix is elementwise

    def __init__(
        self, rho: float = 0.01, alpha: float = 0.1, clip_norm: float | None = 10.0, server_lr: float = 1.0
    ) -> None:
        super().__init__(alpha=alpha, server_lr=server_lr)
        check_sam_args(rho, clip_norm)
        self.rho = rho
        self.clip_norm = clip_norm

    def extra_repr(self) -> str:
        return f"rho={self.rho}, {super().extra_repr()}, clip_norm={self.clip_norm}"
