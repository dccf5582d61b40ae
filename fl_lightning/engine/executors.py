"""Executors: where the clients' local work of a round runs. They hold no round semantics.

The :class:`~fl_lightning.engine.round.Engine` asks its executor for three things: which of the round's
clients this process trains (:meth:`Executor.share`), their outcomes (:meth:`Executor.train`: the client,
the message it got, its :class:`~fl_lightning.api.types.ClientResult` or the exception its work raised),
and, once every outcome went through the engine's policies, to make every process hold the round's
aggregate and facts (:meth:`Executor.gather`). Evaluation of the clients' deployed models goes the same way
(:meth:`Executor.evaluate`).

- :class:`Sequential`: one client at a time on the engine's worker
  (:func:`~fl_lightning.engine.local.train_client`).
- :class:`Vectorized`: groups of up to ``model.vectorize`` clients as one batched computation
  (:mod:`fl_lightning.engine.vectorized`); a group trains one client at a time only for a declared reason
  (the strategy or model cannot be stacked, :func:`~fl_lightning.engine.vectorized.cannot_vectorize`, or a
  :class:`~fl_lightning.engine.vectorized.UnvectorizableError`), named in a notice; any other error
  propagates.
- :class:`ProcessGroup`: each process of a ``torch.distributed`` group trains its share (balanced by sample
  counts) with an inner executor; one object exchange and one flat all-reduce per round.
- The Flower adapter's executor sends the work to SuperNodes through Flower's grid
  (:class:`fl_lightning.flower.executor.FlowerExecutor`).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from fl_lightning.api.aggregation import Aggregator
from fl_lightning.api.collectives import all_gather_objects, is_distributed, world
from fl_lightning.api.metrics import TaskMetrics
from fl_lightning.api.types import ClientResult, Payload, RoundResult
from fl_lightning.engine.distributed import assign_clients
from fl_lightning.engine.local import evaluate_deployed, train_client
from fl_lightning.engine.vectorized import (
    StackedWorker,
    UnvectorizableError,
    cannot_vectorize,
    finish_client,
    group_size,
    train_stacked,
)
from fl_lightning.functional.tensor import load_tensors, module_device

if TYPE_CHECKING:
    from fl_lightning.api.client import ClientModule
    from fl_lightning.engine.round import Engine

log = logging.getLogger("fl_lightning")

#: One client's outcome: ``(client id, the message it got, its result or the exception its work raised)``.
Outcome = tuple[int, Payload, ClientResult | Exception]
#: Per-client metrics of an evaluation and their merge by metric state.
Evaluation = tuple[dict[int, dict[str, float]], TaskMetrics]


class Executor(ABC):
    """Runs the clients' local work for an engine (base: every client here, nothing to exchange).

    Attributes:
        counts: How many clients were trained on each path (``{"sequential": n, "vectorised": n}``), so a
            run and its tests can tell which path ran.
        state_held: Some client kept its persistent state itself (a Flower SuperNode, in its run's context)
            instead of the engine's store, so a checkpoint does not hold it.
    """

    def __init__(self) -> None:
        self.counts: dict[str, int] = {"sequential": 0, "vectorised": 0}
        self.state_held = False

    def share(self, engine: Engine, sampled: list[int]) -> list[int]:
        """The clients of ``sampled`` this process trains (default: all)."""
        return sampled

    @abstractmethod
    def train(self, engine: Engine, round: int, clients: list[int]) -> Iterator[Outcome]:
        """Each client's outcome, in order; a result is consumed before the next is computed (an upload
        may alias the worker)."""

    def gather(self, engine: Engine, agg: Aggregator, result: RoundResult) -> None:  # noqa: B027
        """Make this process hold the whole round's aggregate and facts (default: it does already)."""

    @abstractmethod
    def evaluate(self, engine: Engine, clients: list[int]) -> Evaluation:
        """The deployed model of each of ``clients`` on its local test split, and their merge."""


class Sequential(Executor):
    """One client at a time on the engine's worker, in this process."""

    def train(self, engine: Engine, round: int, clients: list[int]) -> Iterator[Outcome]:
        worker = engine.worker
        initial = _personal_initial(engine)
        for cid in clients:
            yield self._one(engine, worker, initial, cid, round)

    def _one(
        self, engine: Engine, worker: ClientModule, initial: dict[str, torch.Tensor], cid: int, round: int
    ) -> Outcome:
        message = engine.message(cid, round)
        load_tensors(worker, initial)  # a client's first round starts its personal layers from init
        try:
            res: ClientResult | Exception = train_client(
                worker,
                engine.strategy,
                message,
                engine.store.get(cid),
                engine.clients[cid],
                round,
                engine.config.local,
                engine.precision,
                _local_metrics(engine, cid),
            )
        except Exception as err:  # the engine's failure policy decides (a ConfigError is re-raised there)
            res = err
        self.counts["sequential"] += 1
        return cid, message, res

    def evaluate(self, engine: Engine, clients: list[int]) -> Evaluation:
        worker = engine.worker
        weights = {k: v for k, v in engine.model.state_dict().items() if v.is_floating_point()}
        merged = engine.metrics()
        per: dict[int, dict[str, float]] = {}
        config = engine.config.local
        for cid in clients:
            metrics = engine.metrics()
            evaluate_deployed(
                worker,
                weights,
                engine.strategy,
                engine.clients[cid],
                engine.store.get(cid),
                config.batch_size,
                config.eval_batch_size,
                metrics,
                engine.precision,
            )
            per[cid] = metrics.compute()
            merged.merge(metrics)
        return per, merged


class Vectorized(Sequential):
    """Groups of up to ``size`` consecutive clients trained as one batched computation.

    Args:
        size: ``model.vectorize``.
    """

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size
        self.max_group: int | None = None
        self.stacks: dict[tuple[Any, ...], StackedWorker] = {}

    def train(self, engine: Engine, round: int, clients: list[int]) -> Iterator[Outcome]:
        worker = engine.worker
        initial = _personal_initial(engine)
        size = self._group_size(engine, worker, clients)
        for start in range(0, len(clients), size):
            group = clients[start : start + size]
            trained = None
            if len(group) > 1:
                messages = [engine.message(cid, round) for cid in group]
                states = [engine.store.get(cid) for cid in group]
                try:
                    trained = train_stacked(
                        self._stack(worker, len(group)),
                        engine.strategy,
                        messages,
                        states,
                        [engine.clients[cid] for cid in group],
                        round,
                        engine.config.local,
                        engine.precision,
                    )
                except UnvectorizableError as err:  # a declared reason; any other error propagates
                    engine.notice(
                        f"model.vectorize: a group of {len(group)} clients was trained one at a time: {err}",
                        key=f"runtime: {err}",
                    )
            if trained is None:
                for cid in group:
                    yield self._one(engine, worker, initial, cid, round)
                continue
            for cid, message, state, done in zip(group, messages, states, trained, strict=True):
                try:
                    res: ClientResult | Exception = finish_client(
                        worker,
                        engine.strategy,
                        message,
                        state,
                        engine.clients[cid],
                        done,
                        round,
                        engine.config.local,
                        engine.precision,
                        _local_metrics(engine, cid),
                    )
                except Exception as err:
                    res = err
                self.counts["vectorised"] += 1
                yield cid, message, res

    def _group_size(self, engine: Engine, worker: ClientModule, clients: list[int]) -> int:
        """Clients per group this round (1: one at a time), with the run's one notice on why."""
        if self.size <= 1 or len(clients) <= 1:
            return 1
        reason = cannot_vectorize(worker, engine.strategy, engine.config.local, engine.precision)
        if reason is not None:
            engine.notice(f"model.vectorize={self.size}: clients train one at a time: {reason}")
            return 1
        if self.max_group is None:
            largest = max(engine.clients, key=lambda d: d.num_samples)
            config = engine.config.local
            self.max_group, note = group_size(
                self.size, worker, largest, config.batch_size, config.vectorize_memory_gb
            )
            log.info("model.vectorize=%d: groups of up to %d clients (%s)", self.size, self.max_group, note)
        return min(self.max_group, len(clients))

    def _stack(self, worker: ClientModule, size: int) -> StackedWorker:
        """The stacked worker for ``size`` clients (kept for the next rounds; at most two sizes)."""
        key = (id(worker), module_device(worker), size)
        stack = self.stacks.get(key)
        if stack is None:
            if len(self.stacks) >= 2:
                self.stacks.pop(min(self.stacks, key=lambda k: k[2]))
            stack = self.stacks[key] = StackedWorker(worker, size)
        return stack


class ProcessGroup(Executor):
    """Each process of a ``torch.distributed`` group trains its share of the round with ``inner``.

    The share is longest-processing-time-first by sample count (:func:`assign_clients`). After the local
    work, :meth:`gather` makes one object exchange (the aggregator's share, which clients were accepted or
    failed, their metrics, training-metric states, bytes and new states) and one flat all-reduce of the
    weighted sums, so every process applies the same server update and holds every client's state.

    Args:
        inner: The executor of this process's share (:class:`Sequential` or :class:`Vectorized`).
    """

    def __init__(self, inner: Executor) -> None:
        super().__init__()
        self.inner = inner
        self.counts = inner.counts

    def share(self, engine: Engine, sampled: list[int]) -> list[int]:
        rank, size = world()
        sizes = {c: engine.clients[c].num_samples for c in sampled}
        return assign_clients(sampled, sizes, size)[rank]

    def train(self, engine: Engine, round: int, clients: list[int]) -> Iterator[Outcome]:
        return self.inner.train(engine, round, clients)

    def gather(self, engine: Engine, agg: Aggregator, result: RoundResult) -> None:
        mine = {
            "agg": agg.share(),
            "aggregated": result.info.aggregated,
            "failed": result.failed,
            "metrics": result.client_metrics,
            "train_states": result.train_states,
            "bytes": (result.bytes_down, result.bytes_up),
            "error": result.error,
            "vectorised": result.vectorised,
            "states": {cid: engine.store.get(cid) for cid in result.info.aggregated},
        }
        parts = all_gather_objects(mine)
        agg.combine([p["agg"] for p in parts], module_device(engine.model))
        result.info.aggregated, result.failed, result.client_metrics, result.train_states = [], [], {}, {}
        result.bytes_down = result.bytes_up = result.vectorised = 0
        result.error = ""
        for part in parts:
            result.info.aggregated += part["aggregated"]
            result.failed += part["failed"]
            result.client_metrics.update(part["metrics"])
            result.train_states.update(part["train_states"])
            result.bytes_down += part["bytes"][0]
            result.bytes_up += part["bytes"][1]
            result.error = result.error or part["error"]
            result.vectorised += part["vectorised"]
            for cid, state in part["states"].items():
                if cid not in mine["states"]:
                    engine.store.put(cid, state)
        result.info.aggregated.sort()
        result.failed.sort()
        result.client_metrics = dict(sorted(result.client_metrics.items()))

    def evaluate(self, engine: Engine, clients: list[int]) -> Evaluation:
        rank, size = world()
        per, merged = self.inner.evaluate(engine, clients[rank::size])
        merged_all = engine.metrics()
        gathered: dict[int, dict[str, float]] = {}
        for part_per, states in all_gather_objects((per, merged.state_tensors())):
            gathered.update(part_per)
            merged_all.merge(TaskMetrics.from_state_tensors(merged.task, merged.num_classes, states))
        return dict(sorted(gathered.items())), merged_all


def default_executor(engine: Engine) -> Executor:
    """One client at a time, or vectorised groups (``model.vectorize > 1``); each process its share inside
    a process group."""
    size = engine.config.local.vectorize
    inner: Executor = Vectorized(size) if size > 1 else Sequential()
    return ProcessGroup(inner) if is_distributed() else inner


def _local_metrics(engine: Engine, cid: int) -> TaskMetrics | None:
    """The metrics of a freshly trained client's model on its local test split (None: it has none)."""
    return engine.local_metrics if engine.clients[cid].test_idx.numel() else None


def _personal_initial(engine: Engine) -> dict[str, torch.Tensor]:
    """The global model's personal entries, where a client's first round starts its personal layers."""
    personal = engine.strategy.personal_names(engine.model)
    return {n: t for n, t in engine.model.state_dict().items() if n in personal}


__all__ = [
    "Evaluation",
    "Executor",
    "Outcome",
    "ProcessGroup",
    "Sequential",
    "Vectorized",
    "default_executor",
]
