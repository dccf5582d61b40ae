"""Asynchronous strategies: server steps that consume client arrivals on the simulated clock.

An :class:`AsyncStrategy` (FedBuff, FedAsync) runs on the engine's event-driven schedule
(:mod:`fl_lightning.engine.asynchronous`) instead of synchronous rounds: ``M`` clients are in flight
(:meth:`AsyncStrategy.in_flight`), each training on the global model of the moment it was dispatched; their
uploads arrive in the order of the simulated clock (download + computation + upload of each client's device,
``model.system``), and a server step consumes the next ``K`` arrivals (:meth:`AsyncStrategy.buffer`). One
Lightning training step is one server step, so ``trainer.max_steps`` counts server steps.

The hooks of an asynchronous strategy, besides the client side every strategy has::

    hold(model, upload, version)       server side, when the client's upload is computed: what the server
                                       keeps of it until it arrives; ``model`` is then still the global
                                       model the client started from (version ``tau_k``)
    release(model, held, staleness)    server side, at the server step that consumes the arrival:
                                       what enters the aggregate, given the staleness ``t - tau_k``
    aggregator()                       the usual declaration (default: the uniform mean of the released)
    server_update(model, means, info)  default: ``p.grad = means["delta"]``, then the server optimizer steps

A plug-in (``StrategyWrapper``) cannot wrap an asynchronous strategy (its hooks assume rounds).
"""

from __future__ import annotations

import torch
from torch import nn

from fl_lightning.api.aggregation import Aggregator
from fl_lightning.api.strategy import Strategy
from fl_lightning.api.types import Payload, RoundInfo
from fl_lightning.errors import ConfigError
from fl_lightning.functional.tensor import load_tensors

#: The payload group an asynchronous strategy's released arrivals average into: the server's step direction.
DELTA = "delta"


class AsyncStrategy(Strategy):
    """Base of the asynchronous strategies (module docstring): the schedule's sizes and the server side.

    Args:
        concurrency: ``M``, the clients in flight at any time (None: as many as a synchronous round samples,
            ``model.clients_per_round`` or ``model.participation``).
        buffer_size: ``K``, the arrivals a server step consumes, ``1 <= K <= M`` (None: ``max(1, M // 2)``).
        server_lr: The server learning rate on the step direction ``means["delta"]``.
    """

    def __init__(
        self, concurrency: int | None = None, buffer_size: int | None = None, server_lr: float = 1.0
    ) -> None:
        super().__init__(server_lr=server_lr)
        for name, value in (("concurrency", concurrency), ("buffer_size", buffer_size)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"model.strategy.{name}={value!r} must be an integer >= 1 (or null)")
        if concurrency is not None and buffer_size is not None:
            check_buffer(buffer_size, concurrency, type(self).__name__)
        self.concurrency = concurrency
        self.buffer_size = buffer_size

    def in_flight(self, cohort: int) -> int:
        """``M``: :attr:`concurrency`, or ``cohort`` (the clients a synchronous round would sample)."""
        return self.concurrency if self.concurrency is not None else cohort

    def buffer(self, in_flight: int) -> int:
        """``K``: :attr:`buffer_size`, or half the clients in flight (at least 1)."""
        return self.buffer_size if self.buffer_size is not None else max(1, in_flight // 2)

    # ------------------------------------------------------------------------------ server side
    def hold(self, model: nn.Module, upload: Payload, version: int) -> Payload:
        """What the server keeps of a client's ``upload`` until it arrives (default: the upload as sent).

        Called when the upload is computed, while ``model`` is still the global model of ``version``, the one
        the client started from; the held payload is part of the checkpoint until its arrival is consumed.
        """
        return upload

    def release(self, model: nn.Module, held: Payload, staleness: int) -> Payload:
        """What an arrival adds to the aggregate at the server step that consumes it, ``staleness`` server
        steps after the version its client started from; must return a ``"delta"`` group (the direction
        :meth:`server_update` steps along)."""
        raise NotImplementedError

    def aggregator(self) -> Aggregator:
        """The uniform mean of the released arrivals (each counts once, as in FedBuff's Alg. 1)."""
        return Aggregator(weighting="uniform")

    @torch.no_grad()
    def server_update(self, model: nn.Module, means: Payload, info: RoundInfo) -> None:
        """``p.grad = means["delta"]`` for parameters (the server optimizer, ``SGD(server_lr)``, then steps
        ``x <- x - server_lr * delta``); float buffers are assigned ``b - server_lr * delta`` directly."""
        delta = means.get(DELTA, {})
        params = dict(model.named_parameters())
        for name, d in delta.items():
            if name in params:
                params[name].grad = d.to(params[name].dtype)
        state = model.state_dict()
        buffers = {
            n: state[n] - self.server_lr * d for n, d in delta.items() if n not in params and n in state
        }
        load_tensors(model, buffers)


def check_buffer(buffer_size: int, concurrency: int, name: str) -> None:
    """Refuse ``K > M`` in one line: a server step would wait for more arrivals than clients in flight."""
    if buffer_size > concurrency:
        raise ConfigError(
            f"model.strategy.buffer_size={buffer_size} is larger than the {concurrency} clients in flight "
            f"(model.strategy.concurrency) of {name}: a server step consumes K arrivals of the M clients in "
            f"flight; set buffer_size <= {concurrency} or raise concurrency"
        )


__all__ = ["DELTA", "AsyncStrategy", "check_buffer"]
