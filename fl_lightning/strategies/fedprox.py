"""FedProx (Li et al., 2020)."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from fl_lightning.api import ClientContext, Strategy, register_strategy
from fl_lightning.errors import check_number
from fl_lightning.functional.corrections import trainable_parameters
from fl_lightning.functional.tensor import proximal_terms

_TERMS = "fedprox/terms"


@register_strategy
class FedProx(Strategy):
    """FedProx, Li et al. (2020), Sec. 3, eq. (2): local objective with a proximal term.

    Client ``k`` minimises

    .. math:: h_k(w; w^t) = F_k(w) + \\frac{\\mu}{2} \\lVert w - w^t \\rVert^2

    by local SGD from ``w^t``; the server aggregates as FedAvg. With ``mu = 0`` it is FedAvg
    exactly (the term is skipped, so the weights are bit-identical).

    Args:
        mu: Proximal coefficient ``mu >= 0``.
        server_lr: Server learning rate on the pseudo-gradient.
    """

    name = "fedprox"
    vectorizable = True  # the proximal term sums over stacked clients

    def __init__(self, mu: float = 0.01, server_lr: float = 1.0) -> None:
        super().__init__(server_lr=server_lr)
        check_number(mu, "model.strategy.mu", low=0, hint="(proximal coefficient); the paper uses 0.001-1")
        self.mu = mu

    def on_client_start(self, module: nn.Module, ctx: ClientContext) -> None:
        super().on_client_start(module, ctx)
        anchor = ctx.message["weights"]
        named = trainable_parameters(module, anchor)
        ctx.scratch[_TERMS] = (list(named.values()), [anchor[n] for n in named])

    def local_loss(self, module: nn.Module, ctx: ClientContext, batch: Any, outputs: Tensor) -> Tensor | None:
        if self.mu == 0:
            return None
        terms = ctx.scratch.get(_TERMS)
        if terms is None:  # a context built outside the round loop
            named = trainable_parameters(module, ctx.message["weights"])
            terms = (list(named.values()), [ctx.message["weights"][n] for n in named])
        return self.mu * proximal_terms(*terms)

    def extra_repr(self) -> str:
        return f"mu={self.mu}, server_lr={self.server_lr}"
