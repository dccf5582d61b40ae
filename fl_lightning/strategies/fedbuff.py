"""FedBuff (Nguyen et al., AISTATS 2022): buffered asynchronous aggregation."""

from __future__ import annotations

import torch
from torch import nn

from fl_lightning.api import DELTA, AsyncStrategy, Payload, register_strategy
from fl_lightning.functional.staleness import fedbuff_weight, scaled_difference
from fl_lightning.functional.tensor import shared_state


@register_strategy
class FedBuff(AsyncStrategy):
    """FedBuff, Nguyen, Malik, Zhan, Yousefpour, Rabbat, Malek & Huba, "Federated Learning with Buffered
    Asynchronous Aggregation" (AISTATS 2022), Alg. 1 and Sec. 3.

    ``M`` clients (``concurrency``) train at all times, each from the global model ``x^{tau_k}`` of the moment
    it started, by local SGD (``model.local_epochs``/``model.local_steps``), and send
    ``Delta_k = x^{tau_k} - y_k`` (the server computes it from the model the client uploads and the version it
    sent). The server adds each
    arrival to a buffer scaled by its staleness, ``s(t - tau_k) = 1 / sqrt(1 + t - tau_k)``, and every ``K``
    arrivals (``buffer_size``) takes a step

    .. math:: x^{t+1} = x^t - \\eta_g \\frac{1}{K} \\sum_{k=1}^{K} s(t - \\tau_k) \\Delta_k

    through the server optimizer (``SGD(server_lr)``, ``eta_g``). One Lightning training step is one server
    step: ``trainer.max_steps`` counts server steps, each consuming ``K`` client updates.

    Args:
        concurrency: ``M``, the clients in flight (None: as many as a synchronous round samples).
        buffer_size: ``K <= M``, the arrivals per server step (None: ``max(1, M // 2)``).
        server_lr: ``eta_g``, the server learning rate.
        staleness_scaling: Scale each update by ``s(t - tau_k)`` (False: every update counts fully).
    """

    name = "fedbuff"
    vectorizable = True  # FedAvg's client side

    def __init__(
        self,
        concurrency: int | None = None,
        buffer_size: int | None = None,
        server_lr: float = 1.0,
        staleness_scaling: bool = True,
    ) -> None:
        super().__init__(concurrency=concurrency, buffer_size=buffer_size, server_lr=server_lr)
        self.staleness_scaling = staleness_scaling

    def hold(self, model: nn.Module, upload: Payload, version: int) -> Payload:
        """``Delta_k = x^{tau_k} - y_k``: ``model`` is still the global model the client started from."""
        x = shared_state(model, exclude=self.personal_names(model))
        return {DELTA: scaled_difference(x, upload["weights"], 1.0)}

    @torch.no_grad()
    def release(self, model: nn.Module, held: Payload, staleness: int) -> Payload:
        """``s(t - tau_k) Delta_k`` (a new payload; the held one is left as it is)."""
        s = fedbuff_weight(staleness) if self.staleness_scaling else 1.0
        names = list(held[DELTA])
        scaled = torch._foreach_mul([held[DELTA][n] for n in names], s)
        return {DELTA: dict(zip(names, scaled, strict=True))}

    def extra_repr(self) -> str:
        return (
            f"concurrency={self.concurrency}, buffer_size={self.buffer_size}, server_lr={self.server_lr}, "
            f"staleness_scaling={self.staleness_scaling}"
        )
