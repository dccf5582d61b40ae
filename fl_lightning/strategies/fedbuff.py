"""FedBuff (Nguyen et al., AISTATS 2022): buffered asynchronous aggregation."""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from fl_lightning.api import DELTA, AsyncStrategy, Payload, RoundInfo, register_strategy
from fl_lightning.errors import ConfigError, check_number
from fl_lightning.functional.staleness import fedbuff_weight, scaled_difference
from fl_lightning.functional.tensor import shared_state

#: ``buffer_reduction``: how the ``K`` buffered updates combine into the server step's direction.
REDUCTIONS = ("mean", "sum")


@register_strategy
class FedBuff(AsyncStrategy):
    """FedBuff, Nguyen, Malik, Zhan, Yousefpour, Rabbat, Malek & Huba, "Federated Learning with Buffered
    Asynchronous Aggregation" (AISTATS 2022), Alg. 1 and Sec. 3.

    ``M`` clients (``concurrency``) train at all times, each from the global model ``x^{tau_k}`` of the moment
    it started, by local SGD (``model.local_epochs``/``model.local_steps``), and send
    ``Delta_k = x^{tau_k} - y_k`` (the server computes it from the model the client uploads and the version it
    sent). The server adds each arrival to a buffer scaled by its staleness,
    ``s(t - tau_k) = 1 / sqrt(1 + t - tau_k)``, and every ``K`` arrivals (``buffer_size``) takes a step

    .. math:: x^{t+1} = x^t - \\eta_g \\frac{1}{K} \\sum_{k=1}^{K} s(t - \\tau_k) \\Delta_k

    through the server optimizer, ``SGD(server_lr, momentum=server_momentum)``: with momentum ``beta`` the
    direction ``d^t`` (the mean above) goes through a heavy-ball buffer, ``v^{t+1} = beta v^t + d^t``,
    ``x^{t+1} = x^t - eta_g v^{t+1}`` (``v^0 = 0``; optimizer state, checkpointed by Lightning; float buffers
    such as batch-norm statistics step by ``eta_g d^t`` without momentum). One Lightning training step is one
    server step: ``trainer.max_steps`` counts server steps, each consuming ``K`` client updates.

    **Against FLSim** (the authors' framework: ``flsim/optimizers/async_aggregators.py``,
    ``FedBuffAggregator``; ``flsim/utils/async_trainer/async_staleness_weights.py``). FLSim takes the same
    ``Delta_k = x^{tau_k} - y_k`` and the same staleness ``t - tau_k`` (server steps since the client's
    model), but

    - **sums** the buffer, ``sum_k w_k Delta_k`` (its reducer's ``WEIGHTED_SUM``), where Alg. 1 and the
      default here take the mean: ``buffer_reduction="sum"`` sums, so its ``server_lr`` is FLSim's ``lr``
      (with the mean, FLSim's ``lr`` times ``K`` is the same step);
    - scales the staleness weight to 1 at its ``avg_staleness`` (default 1):
      ``w = (1 + avg_staleness)^a / (1 + t - tau_k)^a`` (``PolynomialStalenessWeight``, ``a = 0.5`` in the
      paper), where ``s`` here is 1 at staleness 0: ``staleness_reference`` is FLSim's ``avg_staleness``;
    - takes no staleness weight at all unless configured (``ConstantStalenessWeight``), and weighs clients
      equally (``EqualExampleWeight``), as the uniform mean here does: ``staleness_scaling=False``.

    FLSim's Sent140 FedBuff example (``examples/configs/sent140_fedbuff_config.json``: ``buffer_size`` 10,
    ``lr`` 0.7, ``momentum`` 0.9, no staleness weight) is ``buffer_size=10, server_lr=0.7,
    server_momentum=0.9, buffer_reduction="sum", staleness_scaling=False`` here (or the mean with
    ``server_lr=7.0``). Momentum is linear in the direction, so every scale above is a factor on the lr.

    Args:
        concurrency: ``M``, the clients in flight (None: as many as a synchronous round samples).
        buffer_size: ``K <= M``, the arrivals per server step (None: ``max(1, M // 2)``).
        server_lr: ``eta_g``, the server learning rate.
        staleness_scaling: Scale each update by ``s(t - tau_k)`` (False: every update counts fully).
        server_momentum: ``beta`` in [0, 1), the server optimizer's heavy-ball momentum (0: plain SGD).
        buffer_reduction: ``"mean"`` (Alg. 1) or ``"sum"`` (FLSim) of the ``K`` scaled updates.
        staleness_reference: The staleness at which ``s`` is 1, ``s(tau) = sqrt((1 + ref) / (1 + tau))``
            (0: the paper's ``1 / sqrt(1 + tau)``; FLSim's default ``avg_staleness`` is 1).
    """

    name = "fedbuff"
    vectorizable = True  # FedAvg's client side

    def __init__(
        self,
        concurrency: int | None = None,
        buffer_size: int | None = None,
        server_lr: float = 1.0,
        staleness_scaling: bool = True,
        server_momentum: float = 0.0,
        buffer_reduction: Literal["mean", "sum"] = "mean",
        staleness_reference: int = 0,
    ) -> None:
        super().__init__(concurrency=concurrency, buffer_size=buffer_size, server_lr=server_lr)
        check_number(
            server_momentum,
            "model.strategy.server_momentum",
            low=0,
            high=1,
            high_open=True,
            hint="FLSim's Sent140 FedBuff example uses 0.9",
        )
        if buffer_reduction not in REDUCTIONS:
            raise ConfigError(
                f"model.strategy.buffer_reduction={buffer_reduction!r} must be one of "
                f"{', '.join(REDUCTIONS)} (mean: Alg. 1; sum: FLSim)"
            )
        if isinstance(staleness_reference, bool) or not isinstance(staleness_reference, int):
            raise ConfigError(
                f"model.strategy.staleness_reference={staleness_reference!r} must be an integer >= 0 "
                "(0: the paper's weights; FLSim's avg_staleness is 1)"
            )
        check_number(staleness_reference, "model.strategy.staleness_reference", low=0, hint="e.g. 0 or 1")
        self.staleness_scaling = staleness_scaling
        self.server_momentum = server_momentum
        self.buffer_reduction = buffer_reduction
        self.staleness_reference = staleness_reference

    def configure_server_optimizer(self, params: list[nn.Parameter]) -> torch.optim.Optimizer:
        """``SGD(server_lr, momentum=server_momentum)`` (no dampening, as FLSim's and FedAvgM's)."""
        return torch.optim.SGD(params, lr=self.server_lr, momentum=self.server_momentum)

    def hold(self, model: nn.Module, upload: Payload, version: int) -> Payload:
        """``Delta_k = x^{tau_k} - y_k``: ``model`` is still the global model the client started from."""
        x = shared_state(model, exclude=self.personal_names(model))
        return {DELTA: scaled_difference(x, upload["weights"], 1.0)}

    def staleness_weight(self, staleness: int) -> float:
        """``s(t - tau_k) = sqrt((1 + ref) / (1 + t - tau_k))`` (1 without ``staleness_scaling``)."""
        if not self.staleness_scaling:
            return 1.0
        return fedbuff_weight(staleness) / fedbuff_weight(self.staleness_reference)

    @torch.no_grad()
    def release(self, model: nn.Module, held: Payload, staleness: int) -> Payload:
        """``s(t - tau_k) Delta_k`` (a new payload; the held one is left as it is)."""
        names = list(held[DELTA])
        scaled = torch._foreach_mul([held[DELTA][n] for n in names], self.staleness_weight(staleness))
        return {DELTA: dict(zip(names, scaled, strict=True))}

    @torch.no_grad()
    def server_update(self, model: nn.Module, means: Payload, info: RoundInfo) -> None:
        """The base class's step on the buffer's mean, or on its sum (``K`` times the mean of the ``K``
        arrivals consumed) with ``buffer_reduction="sum"``."""
        if self.buffer_reduction == "sum" and DELTA in means:
            count = float(len(info.aggregated))
            means = {**means, DELTA: {n: d * count for n, d in means[DELTA].items()}}
        super().server_update(model, means, info)

    def extra_repr(self) -> str:
        return (
            f"concurrency={self.concurrency}, buffer_size={self.buffer_size}, server_lr={self.server_lr}, "
            f"staleness_scaling={self.staleness_scaling}, server_momentum={self.server_momentum}, "
            f"buffer_reduction={self.buffer_reduction!r}, staleness_reference={self.staleness_reference}"
        )
