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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from fl_lightning.core.attack import SimulatedAttack
from fl_lightning.core.client import ClientModule, merge_train_states
from fl_lightning.core.distributed import all_gather_objects, is_distributed
from fl_lightning.core.local import LocalConfig, train_client
from fl_lightning.core.metrics import TaskMetrics
from fl_lightning.core.types import ClientResult, Payload, RoundInfo, RoundResult
from fl_lightning.core.vectorized import (
    StackedWorker,
    cannot_vectorize,
    finish_client,
    group_size,
    train_stacked,
)
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
    _fits: int | None = field(default=None, init=False, repr=False)
    _stacks: dict[tuple[Any, ...], StackedWorker] = field(default_factory=dict, init=False, repr=False)
    _notices: set[str] = field(default_factory=set, init=False, repr=False)

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
        device = next(worker.parameters()).device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        malicious = self.malicious(len(clients))
        outcomes = self._train(round, model, worker, strategy, clients, store, precision, eval_metrics, mine)
        for i, (cid, message, res) in enumerate(outcomes):
            try:
                if isinstance(res, BaseException):
                    raise res
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
        if device.type == "cuda":
            result.peak_memory_gb = torch.cuda.max_memory_allocated(device) / 2**30
        if is_distributed():
            agg.combine(next(worker.parameters()).device)
            _exchange(result, store)
        if not result.info.aggregated:  # every client failed: nothing to aggregate (the caller skips it)
            return result
        result.info.weight_totals = agg.weight_totals
        result.means = strategy.process_aggregate(agg.means(), result.info)
        result.train_metrics = merge_train_states(result.train_states[c] for c in sorted(result.train_states))
        return result

    def _train(
        self,
        round: int,
        model: nn.Module,
        worker: ClientModule,
        strategy: Strategy,
        clients: list[ClientData],
        store: Any,
        precision: Any,
        eval_metrics: TaskMetrics | None,
        mine: list[int],
    ) -> Iterator[tuple[int, Payload, ClientResult | Exception]]:
        """``(client, message, result or the exception it raised)`` for each client of ``mine``, in order.

        One client at a time, or (``config.vectorize > 1``) groups of consecutive clients trained as one
        batched computation (:mod:`fl_lightning.core.vectorized`); a group that cannot be stacked is
        trained one client at a time. Each result is consumed before the next is computed (an upload may
        alias the worker).
        """
        size = self._group_size(worker, strategy, clients, mine, precision)
        personal = strategy.personal_names(model)
        initial = {n: t for n, t in model.state_dict().items() if n in personal}
        for start in range(0, len(mine), size):
            group = mine[start : start + size]
            trained = None
            if len(group) > 1:
                messages = [strategy.message(model, cid, round) for cid in group]
                states = [store.get(cid) for cid in group]
                try:
                    stack = self._stack(worker, len(group))
                    datas = [clients[cid] for cid in group]
                    trained = train_stacked(
                        stack, strategy, messages, states, datas, round, self.config, precision
                    )
                except Exception as err:  # e.g. a hook that does not broadcast: train them one at a time
                    self._notice(
                        f"model.vectorize: a group of {len(group)} clients was trained one at a time "
                        f"({one_line(err)}); further such groups are not reported",
                        key="runtime",
                    )
            if trained is not None:
                for cid, message, state, done in zip(group, messages, states, trained, strict=True):
                    try:
                        res: ClientResult | Exception = finish_client(
                            worker,
                            strategy,
                            message,
                            state,
                            clients[cid],
                            done,
                            round,
                            self.config,
                            precision,
                            eval_metrics,
                        )
                    except Exception as err:
                        res = err
                    yield cid, message, res
                continue
            for cid in group:
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
                except Exception as err:
                    res = err
                yield cid, message, res

    def _group_size(
        self,
        worker: ClientModule,
        strategy: Strategy,
        clients: list[ClientData],
        mine: list[int],
        precision: Any,
    ) -> int:
        """Clients per vectorised group this round (1: sequential), with the run's one notice on why."""
        requested = self.config.vectorize
        if requested <= 1 or len(mine) <= 1:
            return 1
        reason = cannot_vectorize(worker, strategy, self.config, precision)
        if reason is not None:
            self._notice(f"model.vectorize={requested}: clients train one at a time: {reason}")
            return 1
        if self._fits is None:
            largest = max(clients, key=lambda d: d.num_samples)
            fits, note = group_size(
                requested, worker, largest, self.config.batch_size, self.config.vectorize_memory_gb
            )
            self._fits = fits
            log.info("model.vectorize=%d: groups of up to %d clients (%s)", requested, fits, note)
        return min(self._fits, len(mine))

    def _stack(self, worker: ClientModule, size: int) -> StackedWorker:
        """The stacked worker for ``size`` clients (kept for the next rounds; at most two sizes)."""
        key = (id(worker), next(worker.parameters()).device, size)
        stack = self._stacks.get(key)
        if stack is None:
            if len(self._stacks) >= 2:
                self._stacks.pop(min(self._stacks, key=lambda k: k[2]))
            stack = self._stacks[key] = StackedWorker(worker, size)
        return stack

    def _notice(self, text: str, key: str | None = None) -> None:
        """Log ``text`` once per run, or only the first text of ``key`` (a warning: slower than asked)."""
        key = text if key is None else key
        if key not in self._notices:
            self._notices.add(key)
            log.warning(text)


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
