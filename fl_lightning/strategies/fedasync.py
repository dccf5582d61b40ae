"""FedAsync (Xie, Koyejo & Gupta, 2019): asynchronous optimization with staleness-weighted mixing."""

from __future__ import annotations

from typing import Literal

from torch import nn

from fl_lightning.api import DELTA, AsyncStrategy, Payload, register_strategy
from fl_lightning.errors import ConfigError, check_number
from fl_lightning.functional.staleness import STALENESS, scaled_difference, staleness_weight
from fl_lightning.functional.tensor import shared_state
from fl_lightning.strategies.fedprox import Proximal


@register_strategy
class FedAsync(Proximal, AsyncStrategy):
    """FedAsync, Xie, Koyejo & Gupta, "Asynchronous Federated Optimization" (arXiv:1903.03934, 2019), Alg. 1,
    Sec. 3 and Sec. 5.2.

    ``M`` clients (``concurrency``) train at all times; a worker starting from the global model ``x_tau``
    minimises ``f_k(z) + rho/2 ||z - x_tau||^2`` by local SGD and sends ``x_new``; the server mixes every
    arrival into the global model as it comes (a server step per arrival):

    .. math:: x_t = (1 - \\alpha_t) x_{t-1} + \\alpha_t x_{new}, \\qquad \\alpha_t = \\alpha \\, s(t - \\tau)

    with the staleness function ``s`` constant (1), polynomial ``(t - tau + 1)^{-a}`` or hinge (1 for
    ``t - tau <= b``, else ``1 / (a (t - tau - b) + 1)``). The step is taken through the server optimizer as
    ``x - alpha_t (x - x_new)`` (``SGD(lr=1)``). One Lightning training step is one arrival's server step.

    Args:
        alpha: The mixing weight ``alpha`` in (0, 1].
        staleness: ``constant``, ``polynomial`` or ``hinge``.
        a: The staleness functions' ``a >= 0``.
        b: The hinge's ``b >= 0``.
        rho: The local proximal coefficient ``rho >= 0`` (0: plain local SGD).
        concurrency: ``M``, the clients in flight (None: as many as a synchronous round samples).
    """

    name = "fedasync"
    vectorizable = True  # the proximal term sums over stacked clients, as FedProx's

    def __init__(
        self,
        alpha: float = 0.6,
        staleness: Literal["constant", "polynomial", "hinge"] = "polynomial",
        a: float = 0.5,
        b: float = 4.0,
        rho: float = 0.0,
        concurrency: int | None = None,
    ) -> None:
        super().__init__(concurrency=concurrency, buffer_size=1, server_lr=1.0)
        check_number(alpha, "model.strategy.alpha", low=0, high=1, low_open=True, hint="(the mixing weight)")
        if staleness not in STALENESS:
            raise ConfigError(f"model.strategy.staleness={staleness!r} must be one of {', '.join(STALENESS)}")
        check_number(a, "model.strategy.a", low=0, hint="e.g. 0.5")
        check_number(b, "model.strategy.b", low=0, hint="e.g. 4")
        check_number(rho, "model.strategy.rho", low=0, hint="(local proximal coefficient; 0: none)")
        self.alpha = alpha
        self.staleness = staleness
        self.a = a
        self.b = b
        self.rho = rho

    # ------------------------------------------------------------------------------ client side
    @property
    def proximal_coefficient(self) -> float:
        """``rho``, the coefficient of the local term ``rho/2 ||z - x_tau||^2`` (:class:`Proximal`)."""
        return self.rho

    # ------------------------------------------------------------------------------ server side
    def mixing_weight(self, staleness: int) -> float:
        """``alpha_t = alpha * s(t - tau)``."""
        return self.alpha * staleness_weight(self.staleness, staleness, self.a, self.b)

    def release(self, model: nn.Module, held: Payload, staleness: int) -> Payload:
        """``alpha_t (x - x_new)`` against the current global model ``x``."""
        x = shared_state(model, exclude=self.personal_names(model))
        return {DELTA: scaled_difference(x, held["weights"], self.mixing_weight(staleness))}

    def extra_repr(self) -> str:
        return (
            f"alpha={self.alpha}, staleness={self.staleness!r}, a={self.a}, b={self.b}, rho={self.rho}, "
            f"concurrency={self.concurrency}"
        )
