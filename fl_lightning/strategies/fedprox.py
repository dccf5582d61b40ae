"""FedProx (Li et al., 2020)."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from fl_lightning.api import ClientContext, Strategy, register_strategy
from fl_lightning.errors import check_number
from fl_lightning.functional.corrections import trainable_parameters
from fl_lightning.functional.tensor import proximal_terms

_TERMS = "proximal/terms"


def _anchor_terms(module: nn.Module, ctx: ClientContext) -> tuple[list[Tensor], list[Tensor]]:
    anchor = ctx.message["weights"]
    named = trainable_parameters(module, anchor)
    return list(named.values()), [anchor[n] for n in named]


class Proximal:
    """Mixin adding the proximal term ``c/2 ||w - w_received||^2`` to the local objective (FedProx Sec. 3,
    Eq. 2); list it before the base strategy.

    The coefficient ``c`` is the subclass's :attr:`proximal_coefficient` (FedProx's ``mu``, FedAsync's
    ``rho``); with ``c = 0`` the term is skipped, so the weights are the base strategy's bit for bit. The
    term sums over stacked clients, so a vectorizable base stays vectorizable.
    """

    #: The coefficient ``c >= 0`` of the term, which the subclass names (a property returning it).
    proximal_coefficient: float
    changes_gradients = True  # the term's gradient joins the loss's (declared capabilities: api.strategy)
    prepares_clients = True  # the received weights kept at the client's start

    def on_client_start(self, module: nn.Module, ctx: ClientContext) -> None:
        """Keep the trainable parameters and the received weights they are pulled towards (once per client;
        :meth:`local_loss` reads them every step)."""
        super().on_client_start(module, ctx)  # type: ignore[misc]
        ctx.scratch[_TERMS] = _anchor_terms(module, ctx)

    def local_loss(self, module: nn.Module, ctx: ClientContext, batch: Any, outputs: Tensor) -> Tensor | None:
        """``c/2 ||w - w_received||^2`` over the trainable parameters (none with ``c = 0``)."""
        c = self.proximal_coefficient
        if c == 0:
            return None
        terms = ctx.scratch.get(_TERMS)  # built here for a context made outside the round loop
        return c * proximal_terms(*(terms if terms is not None else _anchor_terms(module, ctx)))


@register_strategy
class FedProx(Proximal, Strategy):
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

    @property
    def proximal_coefficient(self) -> float:
        """``mu``, the coefficient of :class:`Proximal`'s term."""
        return self.mu

    def extra_repr(self) -> str:
        return f"mu={self.mu}, server_lr={self.server_lr}"
