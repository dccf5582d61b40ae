"""FedGamma (Dai et al., 2023): local SAM steps with SCAFFOLD's control variates."""

from __future__ import annotations

from fl_lightning.api import register_strategy
from fl_lightning.strategies.mixins.sharpness import SharpnessAware, check_sam_args
from fl_lightning.strategies.scaffold import Scaffold


@register_strategy
class FedGamma(SharpnessAware, Scaffold):
    """FedGAMMA: SCAFFOLD whose local gradient is the SAM gradient.

    Dai et al., "FedGAMMA: Federated Learning With Global Sharpness-Aware Minimization", IEEE TNNLS
    2023; not compared in the FedSMOO paper, implemented as the reference simulator does (spec §2:
    SCAFFOLD + local SAM). The server broadcasts ``w^t`` and ``c``; client ``i`` holds ``c_i``; at each
    local step on mini-batch ``xi``

    .. math::

        e = \\rho \\, g / (\\lVert g \\rVert + 10^{-7}), \\quad g = \\nabla f_i(w; \\xi), \\qquad
        w \\leftarrow w - \\eta \\big[\\mathrm{clip}(\\nabla f_i(w + e; \\xi) - c_i + c)
        + \\mathrm{wd} \\, w\\big]

    (:class:`~fl_lightning.strategies.mixins.sharpness.SharpnessAware`: one gradient norm, same batch, the
    ascent on the task gradient only, the variance-reduction correction applied at ``w``). The control
    variates and the server update are SCAFFOLD's option II (:class:`Scaffold`): 2x FedAvg each way
    (``w``, ``c`` down; ``w_i``, ``c_i`` update up; spec P10). With ``rho = 0`` and no clipping it is
    SCAFFOLD.

    Args:
        rho: SAM radius (0.01 in the reference simulator's README).
        clip_norm: Clip each step's corrected gradient to this global norm (the reference: 10); None:
            no clipping.
        server_lr: Server learning rate on the model update.
    """

    name = "fedgamma"
    vectorizable = True  # per-client norms through ctx.stacked; c - c_i is elementwise

    def __init__(self, rho: float = 0.01, clip_norm: float | None = 10.0, server_lr: float = 1.0) -> None:
        super().__init__(server_lr=server_lr)
        check_sam_args(rho, clip_norm)
        self.rho = rho
        self.clip_norm = clip_norm

    def extra_repr(self) -> str:
        return f"rho={self.rho}, clip_norm={self.clip_norm}, server_lr={self.server_lr}"
