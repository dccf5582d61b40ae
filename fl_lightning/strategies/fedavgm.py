"""FedAvgM (Hsu et al., 2019): FedAvg with momentum on the server."""

from __future__ import annotations

import torch
from torch import nn

from fl_lightning.api import Strategy, register_strategy
from fl_lightning.errors import check_number


@register_strategy
class FedAvgM(Strategy):
    """FedAvg with server momentum (FedAvgM), Hsu et al. (2019); FedOpt Alg. 1 with SGDM (Reddi et al., 2021).

    Hsu, Qi and Brown, "Measuring the Effects of Non-Identical Data Distribution for Federated Visual
    Classification" (2019). The clients train as in FedAvg; the server treats the averaged update as
    a gradient and takes a heavy-ball step (``torch.optim.SGD`` with momentum, no dampening)::

        Delta^t = w^t - sum_k (n_k / n_S) w_k^t           (pseudo-gradient)
        v^{t+1} = beta v^t + Delta^t                       (v^0 = 0)
        w^{t+1} = w^t - eta_s v^{t+1}

    With ``momentum = 0`` it is FedAvg bit for bit (torch's SGD skips its buffer). The momentum
    buffer is optimizer state, checkpointed by Lightning. Hsu et al. note the effective step
    ``eta_s / (1 - beta)``; lower ``server_lr`` when raising ``momentum``.

    Args:
        server_lr: Server learning rate ``eta_s``.
        momentum: Server momentum ``beta`` in [0, 1).
    """

    name = "fedavgm"
    vectorizable = True  # FedAvg's clients; momentum on the server

    def __init__(self, server_lr: float = 1.0, momentum: float = 0.9) -> None:
        super().__init__(server_lr=server_lr)
        check_number(
            momentum, "model.strategy.momentum", low=0, high=1, high_open=True, hint="Hsu et al. use 0.9"
        )
        self.momentum = momentum

    def configure_server_optimizer(self, params: list[nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=self.server_lr, momentum=self.momentum)

    def extra_repr(self) -> str:
        return f"server_lr={self.server_lr}, momentum={self.momentum}"
