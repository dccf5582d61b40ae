"""FedProx (Li et al., 2020)."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from fl_lightning.api import ClientContext, Strategy, register_strategy
from fl_lightning.errors import check_number
from fl_lightning.functional.corrections import trainable_parameters
from fl_lightning.functional.tensor import proximal_terms

_TERMS = "fedprox/terms"


def _anchor_terms(module: nn.Module, ctx: ClientContext) -> tuple[list[Tensor], list[Tensor]]:
    anchor = ctx.message["weights"]
    named = trainable_parameters(module, anchor)
    return list(named.values()), [anchor[n] for n in named]


def keep_proximal_anchor(module: nn.Module, ctx: ClientContext, key: str) -> None:
    """Keep the trainable parameters and the received weights they are pulled towards in ``ctx.scratch[key]``
    (once per client; :func:`proximal_loss` reads them every step)."""
    ctx.scratch[key] = _anchor_terms(module, ctx)


def proximal_loss(module: nn.Module, ctx: ClientContext, key: str) -> Tensor:
    """``1/2 ||w - w_received||^2`` over the trainable parameters (FedProx Sec. 3, Eq. 2, without mu), from
    the terms :func:`keep_proximal_anchor` kept (built here for a context made outside the round loop)."""
    terms = ctx.scratch.get(key)
    return proximal_terms(*(terms if terms is not None else _anchor_terms(module, ctx)))


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
    changes_gradients = True
    prepares_clients = True
    vectorizable = True  # the proximal term sums over stacked clients

    def __init__(self, mu: float = 0.01, server_lr: float = 1.0) -> None:
        super().__init__(server_lr=server_lr)
        check_number(mu, "model.strategy.mu", low=0, hint="(proximal coefficient); the paper uses 0.001-1")
        self.mu = mu

    def on_client_start(self, module: nn.Module, ctx: ClientContext) -> None:
        super().on_client_start(module, ctx)
        keep_proximal_anchor(module, ctx, _TERMS)

    def local_loss(self, module: nn.Module, ctx: ClientContext, batch: Any, outputs: Tensor) -> Tensor | None:
        if self.mu == 0:
            return None
        return self.mu * proximal_loss(module, ctx, _TERMS)

    def extra_repr(self) -> str:
        return f"mu={self.mu}, server_lr={self.server_lr}"
