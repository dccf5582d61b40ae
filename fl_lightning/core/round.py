"""The federated round, written once: sample → dispatch → local training → collect → aggregate.

Evaluation, logging and checkpointing of a round are done by the outer Lightning Trainer around
:meth:`FederatedLoop.run_round` (see :class:`fl_lightning.core.module.FederatedModule`). A client's
local work is :func:`fl_lightning.core.local.train_client`; the streaming weighted sums are
:class:`fl_lightning.core.aggregation.Aggregator`; in a process group the sums are all-reduced and
what each process learnt is exchanged here.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import nn

from fl_lightning.core.attack import SimulatedAttack
from fl_lightning.core.client import ClientModule, merge_train_states
from fl_lightning.core.distributed import all_gather_objects, is_distributed
from fl_lightning.core.local import LocalConfig, train_client
from fl_lightning.core.metrics import TaskMetrics
from fl_lightning.core.types import ClientResult, RoundInfo, RoundResult
from fl_lightning.data.federated import ClientData
from fl_lightning.errors import ConfigError
from fl_lightning.functional.sampling import sample_clients
from fl_lightning.functional.tensor import all_finite, load_tensors, payload_bytes

if TYPE_CHECKING:
    from fl_lightning.strategies.base import Strategy

log = logging.getLogger(__name__)


def checked_selection(ids: list[int], num_clients: int) -> list[int]:
    """``ids`` sorted, after checking they are distinct client ids in ``0..num_clients-1`` (at least one)."""
    out = sorted(int(c) for c in ids)
    if not out or len(set(out)) != len(out) or out[0] < 0 or out[-1] >= num_clients:
        raise ValueError(f"select_clients must return distinct client ids in [0, {num_clients}), got {ids}")
    return out


def num_sampled(num_clients: int, participation: float, clients_per_round: int | None) -> int:
    """Clients per round: ``clients_per_round`` if given, else ``max(1, floor(participation * m))``."""
    if clients_per_round is not None:
        if not 1 <= clients_per_round <= num_clients:
            raise ConfigError(
                f"model.clients_per_round={clients_per_round} must be between 1 and "
                f"data.num_clients={num_clients}"
            )
        return clients_per_round
    return max(1, math.floor(participation * num_clients + 1e-9))


ClientHook = Callable[[int, int, ClientResult | None], None]


@dataclass
class FederatedLoop:
    """Runs rounds: which clients, what they receive, their local work, the aggregate.

    Attributes:
        config: Local training settings shared by all clients.
        participation: Fraction of clients per round in (0, 1].
        clients_per_round: A fixed count per round (overrides ``participation``).
        tolerate_client_failures: Exclude a client whose training raises or returns non-finite
            tensors from the round (warning logged, counted) instead of stopping the run.
        attack: Simulated malicious clients, whose uploads the loop replaces after the strategy's
            ``process_upload`` (None: every client is honest).
    """

    config: LocalConfig
    participation: float = 1.0
    clients_per_round: int | None = None
    tolerate_client_failures: bool = True
    attack: SimulatedAttack | None = None

    def malicious(self, num_clients: int) -> frozenset[int]:
        """The clients :attr:`attack` makes malicious (drawn from the run seed ``config.seed``)."""
        return frozenset() if self.attack is None else self.attack.malicious(num_clients, self.config.seed)

    def sample(self, num_clients: int, round: int, strategy: Strategy | None = None) -> list[int]:
        """The clients of ``round``, sorted: ``strategy.select_clients`` (default: :func:`sample_clients`)."""
        count = num_sampled(num_clients, self.participation, self.clients_per_round)
        if strategy is None:
            return sample_clients(num_clients, count, self.config.seed, round)
        chosen = strategy.select_clients(num_clients, count, round, self.config.seed)
        return checked_selection(chosen, num_clients)

    def run_round(
        self,
        round: int,
        model: nn.Module,
        worker: ClientModule,
        strategy: Strategy,
        clients: list[ClientData],
        store: Any,
        precision: Any = None,
        eval_metrics: TaskMetrics | None = None,
        on_client_end: ClientHook | None = None,
        sampled: list[int] | None = None,
        assigned: list[int] | None = None,
    ) -> RoundResult:
        """One round over ``sampled`` (default: :meth:`sample`) clients; returns the averaged uploads.

        If every sampled client failed (and failures are tolerated), the result has no aggregated
        clients and empty ``means``; ``error`` describes the first failure.

        ``assigned`` is the share of ``sampled`` this process trains (default: all of them). In a
        process group the weighted sums are all-reduced, and the clients' metrics, byte counts and
        new states are exchanged, so every process returns the same result and holds every state.
        """
        sampled = self.sample(len(clients), round, strategy) if sampled is None else sampled
        mine = sampled if assigned is None else assigned
        agg = strategy.aggregator()
        result = RoundResult(means={}, info=RoundInfo(round, sampled, [], len(clients)))
        personal = strategy.personal_names(model)
        initial = {n: t for n, t in model.state_dict().items() if n in personal}
        malicious = self.malicious(len(clients))
        for i, cid in enumerate(mine):
            message = strategy.message(model, cid, round)
            load_tensors(worker, initial)  # a client's first round starts its personal layers from init
            try:
                res = train_client(
                    worker,
                    strategy,
                    message,
                    store.get(cid),
                    clients[cid],
                    round,
                    self.config,
                    precision,
                    eval_metrics,
                )
                if cid in malicious:  # what a malicious client sends instead (same size: bytes_up holds)
                    res.upload = self.attack.apply(res.upload, message)
                if not all_finite(res.upload):
                    raise FloatingPointError(f"client {cid} uploaded non-finite values in round {round}")
            except Exception as err:
                if not self.tolerate_client_failures:
                    raise
                result.error = result.error or f"client {cid}: {one_line(err)}"
                result.failed.append(cid)
                result.bytes_down += payload_bytes(message)
                log.warning("round %d: client %d excluded from the aggregate: %s", round, cid, err)
                if on_client_end is not None:
                    on_client_end(i, len(mine), None)
                continue
            agg.add(res.upload, res.num_samples, cid)
            store.put(cid, res.state)
            result.info.aggregated.append(cid)
            result.client_metrics[cid] = dict(res.metrics, num_samples=res.num_samples)
            result.train_states[cid] = res.train_state
            result.bytes_down += res.bytes_down
            result.bytes_up += res.bytes_up
            if on_client_end is not None:
                on_client_end(i, len(mine), res)
        if is_distributed():
            agg.combine(next(worker.parameters()).device)
            _exchange(result, store)
        if not result.info.aggregated:  # every client failed: nothing to aggregate (the caller skips it)
            return result
        result.info.weight_totals = agg.weight_totals
        result.means = strategy.process_aggregate(agg.means(), result.info)
        result.train_metrics = merge_train_states(result.train_states[c] for c in sorted(result.train_states))
        return result


def _exchange(result: RoundResult, store: Any) -> None:
    """Share what each process learnt in the round; afterwards every process has the same view."""
    mine = {
        "aggregated": result.info.aggregated,
        "failed": result.failed,
        "metrics": result.client_metrics,
        "train_states": result.train_states,
        "bytes": (result.bytes_down, result.bytes_up),
        "error": result.error,
        "states": {cid: store.get(cid) for cid in result.info.aggregated},
    }
    result.info.aggregated, result.failed, result.client_metrics, result.train_states = [], [], {}, {}
    result.bytes_down = result.bytes_up = 0
    result.error = ""
    for part in all_gather_objects(mine):
        result.info.aggregated += part["aggregated"]
        result.failed += part["failed"]
        result.client_metrics.update(part["metrics"])
        result.train_states.update(part["train_states"])
        result.bytes_down += part["bytes"][0]
        result.bytes_up += part["bytes"][1]
        result.error = result.error or part["error"]
        for cid, state in part["states"].items():
            if cid not in mine["states"]:
                store.put(cid, state)
    result.info.aggregated.sort()
    result.failed.sort()
    result.client_metrics = dict(sorted(result.client_metrics.items()))


def one_line(err: BaseException) -> str:
    """``"<Type>: <first line of the message>"`` (just the type for an empty message)."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__


def timed() -> Callable[[], float]:
    """A stopwatch: call the returned function for the seconds since creation."""
    start = time.perf_counter()
    return lambda: time.perf_counter() - start
