"""What an executor receives (:class:`Work`) and what it does with it (:class:`Executor`).

The round (:mod:`fl_lightning.engine.round`) and the executors that run its clients
(:mod:`fl_lightning.engine.executors`, :mod:`fl_lightning.flower.executor`) meet here and nowhere else:
neither imports the other. The round hands an executor a :class:`Work`, a frozen record of what its
clients need (the round, the clients, how to build each one's message and read its state, their data, the
local configuration, the precision plugin, the strategy, the model and its working copy); the executor
hands back each client's outcome and never sees the engine, its store or its policies.
"""

from __future__ import annotations

import dataclasses
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import Tensor, nn

from fl_lightning.api.aggregation import Aggregator
from fl_lightning.api.client import ClientModule
from fl_lightning.api.metrics import TaskMetrics
from fl_lightning.api.types import ClientResult, Payload, RoundResult
from fl_lightning.data.federated import ClientData
from fl_lightning.engine.local import LocalConfig, evaluate_deployed

if TYPE_CHECKING:
    from fl_lightning.api.strategy import Strategy

log = logging.getLogger("fl_lightning")

#: One client's outcome: ``(client id, the message it got, its result or the exception its work raised)``.
Outcome = tuple[int, Payload, ClientResult | Exception]
#: Per-client metrics of an evaluation and their merge by metric state.
Evaluation = tuple[dict[int, dict[str, float]], TaskMetrics]
#: A client's persistent state (``ctx.state``).
State = dict[str, Tensor]


@dataclass(frozen=True)
class Work:
    """The clients' work of one round (or of one evaluation), as an executor receives it.

    Attributes:
        round: The 0-based round (-1 for an evaluation of the deployed models).
        clients: The client ids to train or evaluate (sorted).
        strategy: The federated algorithm (its client hooks run in the local work).
        model: The global model (what a deployed model starts from; its device is the round's device).
        data: Every client's data, indexed by client id.
        message: ``message(client_id)`` builds what the server sends that client this round (called when
            its work starts).
        state: ``state(client_id)`` is a copy of that client's persistent state (empty: never trained).
        local: How much local work a client does and how.
        precision: A Lightning precision plugin for the clients' steps and evaluation (None: fp32).
        worker: ``worker()`` is the working copy of the model that this process's clients train in turn.
        metrics: ``metrics()`` is a fresh set of the run's evaluation metrics on the model's device.
        local_metrics: ``local_metrics()`` are the metrics of a freshly trained client on its local test split
            (one set, reset per client; made on first use, so a run whose clients have no local test split
            never makes it). None: not evaluated.
        steps: The local steps the engine decided for each client (``model.system``: a straggler's partial
            work, FedProx's stragglers), which the executor runs exactly (:meth:`local_for`); None: every
            client runs ``local.num_steps`` of its data.
    """

    round: int
    clients: tuple[int, ...]
    strategy: Strategy
    model: nn.Module
    data: Sequence[ClientData]
    message: Callable[[int], Payload]
    state: Callable[[int], State]
    local: LocalConfig
    precision: Any
    worker: Callable[[], ClientModule]
    metrics: Callable[[], TaskMetrics]
    local_metrics: Callable[[], TaskMetrics] | None = None
    steps: Mapping[int, int] | None = None

    def local_for(self, client_id: int) -> LocalConfig:
        """How client ``client_id`` trains: :attr:`local`, with its local steps set to the engine's decision
        for it when :attr:`steps` has one."""
        if self.steps is None or client_id not in self.steps:
            return self.local
        return dataclasses.replace(self.local, local_steps=int(self.steps[client_id]))

    def group_steps(self, clients: Sequence[int]) -> list[int] | None:
        """The local steps of ``clients`` (a vectorised group) as :meth:`local_for` sets them; None when the
        engine decided none (each runs ``local.num_steps``)."""
        if self.steps is None:
            return None
        return [self.local_for(c).num_steps(self.data[c]) for c in clients]

    def evaluate_client(
        self, worker: ClientModule, weights: dict[str, Tensor], client_id: int, metrics: TaskMetrics
    ) -> None:
        """Client ``client_id``'s deployed model (the global ``weights`` as the strategy deploys them) on its
        local test split, into ``metrics`` (a client of ``Sequential.evaluate``; a node's evaluation)."""
        evaluate_deployed(
            worker,
            weights,
            self.strategy,
            self.data[client_id],
            self.state(client_id),
            self.local,
            metrics,
            self.precision,
        )

    def eval_metrics(self, client_id: int) -> TaskMetrics | None:
        """The metrics of a client's freshly trained model on its local test split (None: it has none)."""
        if self.local_metrics is None or not self.data[client_id].test_idx.numel():
            return None
        return self.local_metrics()

    def personal_initial(self) -> dict[str, Tensor]:
        """The global model's personal entries, where a client's first round starts its personal layers."""
        personal = self.strategy.personal_names(self.model)
        if not personal:
            return {}
        return {n: t for n, t in self.model.state_dict().items() if n in personal}


class Executor(ABC):
    """Runs the clients' local work of a :class:`Work` (base: every client here, nothing to exchange).

    Attributes:
        counts: How many clients were trained on each path (``{"sequential": n, "vectorised": n}``), so a
            run and its tests can tell which path ran.
        state_held: Some client kept its persistent state itself (a Flower SuperNode, in its run's context)
            instead of the engine's store, so a checkpoint does not hold it.
        notices: The keys of the notices this executor logged (each once per run).
    """

    def __init__(self) -> None:
        self.counts: dict[str, int] = {"sequential": 0, "vectorised": 0}
        self.state_held = False
        self.notices: set[str] = set()

    def share(self, work: Work) -> list[int]:
        """The clients of ``work`` that this process trains (default: all)."""
        return list(work.clients)

    @abstractmethod
    def train(self, work: Work) -> Iterator[Outcome]:
        """Each client's outcome, in order; a result is consumed before the next is computed (an upload
        may alias the worker)."""

    def gather(self, work: Work, agg: Aggregator, result: RoundResult) -> dict[int, State]:
        """Make this process hold the whole round's aggregate and facts; returns the new states of the
        accepted clients that other processes trained (default: none, every client ran here)."""
        return {}

    @abstractmethod
    def evaluate(self, work: Work) -> Evaluation:
        """The deployed model of each client of ``work`` on its local test split, and their merge."""

    def facts(self) -> dict[str, float]:
        """Scalars on how the round's local work ran, for the round's record (default: none); e.g. the
        vectorised executor's ``vectorize/*``."""
        return {}

    def notice(self, text: str, key: str | None = None) -> None:
        """Log ``text`` once per run (or only the first text of ``key``): a run slower than asked."""
        key = text if key is None else key
        if key not in self.notices:
            self.notices.add(key)
            log.warning(text)


__all__ = ["Evaluation", "Executor", "Outcome", "State", "Work"]
