"""FedAdam (Reddi et al., 2021): Adam on the server over the averaged client update."""

from __future__ import annotations

import torch
from torch import nn

from fl_lightning.buffers import TensorBuffers
from fl_lightning.corrections import adam_direction, adam_moments, trainable_parameters
from fl_lightning.errors import ConfigError, check_number
from fl_lightning.functional import Payload
from fl_lightning.strategies import register_strategy
from fl_lightning.strategies.base import RoundInfo, Strategy


@register_strategy
class FedAdam(Strategy):
    """FedAdam, Reddi et al., "Adaptive Federated Optimization" (ICLR 2021), Alg. 2.

    The clients train as in FedAvg. With ``Delta_t = sum_k p_k w_k - x_t`` the averaged client update
    (the negative FedOpt pseudo-gradient), the server keeps two model-size moments and steps::

        m_t     = b1 m_{t-1} + (1 - b1) Delta_t                  m_{-1} = 0
        v_t     = b2 v_{t-1} + (1 - b2) Delta_t^2                v_{-1} = tau^2
        x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)

    exactly as Alg. 2 writes it: no bias correction (``torch.optim.Adam`` would add one), and
    ``v_{-1} = tau^2``, the smallest value the algorithm's input ``v_{-1} >= tau^2`` allows. The step is
    taken by the server optimizer, SGD with ``lr = eta``, on the gradient ``-m_t / (sqrt(v_t) + tau)``,
    so LearningRateMonitor sees ``eta``. ``m`` and ``v`` are buffers of the strategy (checkpointed).
    The FedSMOO paper (Sec. 5.1) uses ``eta = 0.1``; its reference code ``tau = 0.01``.

    Args:
        server_lr: Server learning rate ``eta``.
        betas: Moment decay rates ``(b1, b2)``, each in [0, 1).
        eps: Adaptivity ``tau > 0`` (added to ``sqrt(v)``).
    """

    name = "fedadam"

    def __init__(
        self, server_lr: float = 0.1, betas: tuple[float, float] = (0.9, 0.99), eps: float = 1e-3
    ) -> None:
        super().__init__(server_lr=server_lr)
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):  # NaN fails the chained test
            raise ConfigError(
                f"model.strategy.betas={list(betas)} must be two values in [0, 1), e.g. [0.9, 0.99]"
            )
        check_number(
            eps, "model.strategy.eps", low=0, low_open=True, hint="(tau of Reddi et al.); e.g. 0.001"
        )
        self.betas = (float(betas[0]), float(betas[1]))
        self.eps = eps

    def setup(self, model: nn.Module, num_clients: int) -> None:
        super().setup(model, num_clients)
        params = {n: p.detach() for n, p in trainable_parameters(model).items()}
        self.exp_avg = TensorBuffers.zeros_like(params)
        self.exp_avg_sq = TensorBuffers({n: torch.full_like(p, self.eps**2) for n, p in params.items()})

    @torch.no_grad()
    def server_update(self, model: nn.Module, means: Payload, info: RoundInfo) -> None:
        super().server_update(model, means, info)  # p.grad = x_t - mean_k w_k; buffers averaged
        for name, p in trainable_parameters(model).items():
            if p.grad is None or name not in self.exp_avg:
                continue
            m, v = adam_moments(p.grad.neg(), self.exp_avg[name], self.exp_avg_sq[name], self.betas)
            p.grad = adam_direction(m, v, self.eps).neg_()

    def extra_repr(self) -> str:
        return f"server_lr={self.server_lr}, betas={self.betas}, eps={self.eps}"
