"""FedDecorr (Shi et al., ICLR 2023): decorrelating local representations against dimensional collapse."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from fl_lightning.api import ClientContext, Strategy, register_strategy
from fl_lightning.errors import check_number
from fl_lightning.functional.representation import FeatureTap, decorrelation_loss, features_of
from fl_lightning.functional.tensor import Payload

_TAP = "feddecorr/tap"


@register_strategy
class FedDecorr(Strategy):
    """FedDecorr, Shi et al. (2023), Sec. 4: a local regulariser on the representations of each batch.

    Client ``k`` minimises, over each local batch of ``N`` samples with representations ``z`` (``[N, d]``),

    .. math:: \\ell = \\ell_{CE}(w; x, y) + \\beta \\, \\frac{1}{d^2} \\lVert K \\rVert_F^2

    where ``K`` is the correlation matrix of ``z`` (each dimension standardised over the batch). It
    pushes the singular values of the representation apart from collapsing to a few directions under
    heterogeneous data. The server aggregates as FedAvg. The representation is the input of the
    network's last linear layer (see :mod:`fl_lightning.functional.representation`), read from the training
    forward pass. With ``beta = 0`` it is FedAvg exactly.

    The official code's loss is about ``N`` times this one (see
    :func:`~fl_lightning.functional.representation.decorrelation_loss`), so its ``beta`` (0.1; 0.01 in the
    FedCOG paper) corresponds to a ``beta`` about ``N`` times larger here.

    Args:
        beta: Weight of the decorrelation term.
        server_lr: Server learning rate on the pseudo-gradient.
    """

    name = "feddecorr"
    changes_gradients = True
    prepares_clients = True

    def __init__(self, beta: float = 0.1, server_lr: float = 1.0) -> None:
        super().__init__(server_lr=server_lr)
        check_number(beta, "model.strategy.beta", low=0, hint="(decorrelation weight; the paper uses 0.1)")
        self.beta = beta

    def on_client_start(self, module: nn.Module, ctx: ClientContext) -> None:
        super().on_client_start(module, ctx)
        if self.beta != 0:
            FeatureTap(module, ctx.scratch, _TAP)

    def local_loss(self, module: nn.Module, ctx: ClientContext, batch: Any, outputs: Tensor) -> Tensor | None:
        tap: FeatureTap | None = ctx.scratch.get(_TAP)
        if tap is None:
            return None
        z = tap.features_for(outputs)
        if z is None:
            z, _ = features_of(module, batch[0])
        return self.beta * decorrelation_loss(z.float().flatten(1))

    def upload(self, module: nn.Module, ctx: ClientContext) -> Payload:
        FeatureTap.release(ctx.scratch, _TAP)
        return super().upload(module, ctx)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, server_lr={self.server_lr}"
