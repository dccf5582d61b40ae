"""Executors: where the clients' local work of a round runs. They hold no round semantics.

An executor receives the round's :class:`~fl_lightning.engine.work.Work` (a frozen record: the round, its
clients, how to build each one's message and read its state, their data, the local configuration, the
precision plugin, the strategy) and never the engine: :meth:`~fl_lightning.engine.work.Executor.share`
says which of the round's clients this process trains, :meth:`~fl_lightning.engine.work.Executor.train`
yields their outcomes (the client, the message it got, its :class:`~fl_lightning.api.types.ClientResult`
or the exception its work raised), and once every outcome went through the engine's policies,
:meth:`~fl_lightning.engine.work.Executor.gather` makes every process hold the round's aggregate and facts.
Evaluation of the clients' deployed models goes the same way
(:meth:`~fl_lightning.engine.work.Executor.evaluate`).

- :class:`Sequential`: one client at a time on the work's worker (:func:`run_client`, the client path the
  Flower ClientApp runs too).
- :class:`Vectorized`: groups of up to ``model.runtime.vectorize`` clients as one batched computation
  (:mod:`fl_lightning.engine.vectorized`; on a CPU only where that is measured to pay,
  :mod:`fl_lightning.engine.calibrate`); a group trains one client at a time only for a declared reason
  (the strategy or model cannot be stacked, :func:`~fl_lightning.engine.vectorized.cannot_vectorize`, or a
  :class:`~fl_lightning.engine.vectorized.UnvectorizableError`), named in a notice; any other error
  propagates.
- :class:`ProcessGroup`: each process of a ``torch.distributed`` group trains its share (balanced by sample
  counts) with an inner executor; one object exchange and one flat all-reduce per round.
- The Flower adapter's executor sends the work to SuperNodes through Flower's grid
  (:class:`fl_lightning.flower.executor.FlowerExecutor`).

:func:`default_executor` chooses among the first three for a run; the adapter that sets the engine up
calls it (the round itself imports no executor).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator
from typing import Any

import torch

from fl_lightning.api.aggregation import Aggregator
from fl_lightning.api.client import ClientModule
from fl_lightning.api.collectives import all_gather_objects, is_distributed, world
from fl_lightning.api.metrics import TaskMetrics
from fl_lightning.api.strategy import declaring
from fl_lightning.api.types import ClientResult, RoundResult
from fl_lightning.engine.batched import linear_chain
from fl_lightning.engine.calibrate import CpuDecision
from fl_lightning.engine.distributed import assign_clients
from fl_lightning.engine.local import LocalConfig, outputs_together, train_client
from fl_lightning.engine.vectorized import (
    StackedWorker,
    UnvectorizableError,
    cannot_vectorize,
    evaluate_stacked,
    finish_client,
    group_size,
    runs_under_vmap,
    train_stacked,
)
from fl_lightning.engine.work import Evaluation, Executor, Outcome, State, Work
from fl_lightning.functional.tensor import load_tensors, module_device

log = logging.getLogger("fl_lightning")


def run_client(work: Work, worker: ClientModule, initial: dict[str, torch.Tensor], client_id: int) -> Outcome:
    """One client's local work on ``worker``: the client path of every executor and of a Flower SuperNode.

    The worker's personal entries go back to ``initial`` (a client's first round starts its personal layers
    from the global model's; the worker last trained another client), then
    :func:`~fl_lightning.engine.local.train_client` runs with the client's message, state and data. An
    exception is returned, not raised: the engine's failure policy decides (a ``ConfigError`` is re-raised
    there).
    """
    message = work.message(client_id)
    load_tensors(worker, initial)
    try:
        res: ClientResult | Exception = train_client(
            worker,
            work.strategy,
            message,
            work.state(client_id),
            work.data[client_id],
            work.round,
            work.local_for(client_id),
            work.precision,
            work.eval_metrics(client_id),
        )
    except Exception as err:
        res = err
    return client_id, message, res


class Sequential(Executor):
    """One client at a time on the work's worker, in this process."""

    def train(self, work: Work) -> Iterator[Outcome]:
        worker = work.worker()
        initial = work.personal_initial()
        for cid in work.clients:
            yield self._one(work, worker, initial, cid)

    def _one(self, work: Work, worker: ClientModule, initial: dict[str, torch.Tensor], cid: int) -> Outcome:
        outcome = run_client(work, worker, initial, cid)
        self.counts["sequential"] += 1
        return outcome

    def evaluate(self, work: Work) -> Evaluation:
        worker = work.worker()
        weights = {k: v for k, v in work.model.state_dict().items() if v.is_floating_point()}
        merged = work.metrics()
        per: dict[int, dict[str, float]] = {}
        metrics = work.metrics()  # one set, reset per client (building a set costs more than evaluating)
        for cid in work.clients:
            metrics.reset()
            work.evaluate_client(worker, weights, cid, metrics)
            per[cid] = metrics.compute()
            merged.merge(metrics)
        return per, merged


class Vectorized(Sequential):
    """Groups of up to ``size`` consecutive clients trained as one batched computation.

    On a CPU, whether the groups train batched or one client at a time is measured on the run's first
    clients (``model.runtime.vectorize_cpu=measure``, :class:`~fl_lightning.engine.calibrate.CpuDecision`) or
    pinned (``batched``, ``one_at_a_time``); on an accelerator they train batched. The choice and its
    measurement are logged once and reported every round (:meth:`facts`).

    Args:
        size: ``model.runtime.vectorize``: an integer, or ``"auto"``: every client of the round (this
            process's share), as many as the memory budget allows.
    """

    def __init__(self, size: int | str) -> None:
        super().__init__()
        self.size = size
        self.max_group: int | None = None
        self.stacks: dict[tuple[Any, ...], StackedWorker] = {}
        #: The CPU's choice between batched groups and one client at a time (None: not on a CPU).
        self.decision: CpuDecision | None = None
        self._bound = 0  # the clients per group in the last round (1: none vectorised)
        self._fused: bool | None = None  # whether the last batched group's SGD step was fused
        self._said: set[str] = set()

    def train(self, work: Work) -> Iterator[Outcome]:
        worker = work.worker()
        initial = work.personal_initial()
        left = list(work.clients)
        size = self._bound = self._group_size(work, worker)
        decision = self._decision(work, worker, size)
        while left:
            n = decision.next_group(len(left)) if decision is not None else min(size, len(left))
            group, left = left[:n], left[n:]
            if n == 1:
                yield self._timed(work, worker, initial, group[0], decision)
            else:
                yield from self._stacked(work, worker, initial, group, decision)

    def _timed(
        self,
        work: Work,
        worker: ClientModule,
        initial: dict[str, torch.Tensor],
        cid: int,
        decision: CpuDecision | None,
    ) -> Outcome:
        """One client one at a time; its local work timed for the CPU's measurement while it measures."""
        clock = decision.clock if decision is not None else time.perf_counter
        start = clock()
        outcome = self._one(work, worker, initial, cid)
        if decision is not None and decision.measuring and not isinstance(outcome[2], Exception):
            steps = work.local_for(cid).num_steps(work.data[cid])
            if decision.add(1, clock() - start, steps, work.round):
                self._decided(decision)
        return outcome

    def _stacked(
        self,
        work: Work,
        worker: ClientModule,
        initial: dict[str, torch.Tensor],
        group: list[int],
        decision: CpuDecision | None,
    ) -> Iterator[Outcome]:
        """A group as one batched computation (one at a time after a declared reason); its local work
        timed while the CPU measures (the clients' finishing included, the engine's work between them not)."""
        stack = self._stack(worker, len(group))
        messages = [work.message(cid) for cid in group]
        states = [work.state(cid) for cid in group]
        datas = [work.data[cid] for cid in group]
        clock = decision.clock if decision is not None else time.perf_counter
        start = clock()
        try:
            trained = train_stacked(
                stack,
                work.strategy,
                messages,
                states,
                datas,
                work.round,
                work.local,
                work.precision,
                steps=work.group_steps(group),
            )
        except UnvectorizableError as err:  # a declared reason; any other error propagates
            self.notice(
                f"model.runtime.vectorize: a group of {len(group)} clients was trained one at a time: {err}",
                key=f"runtime: {err}",
            )
            for cid in group:
                yield self._one(work, worker, initial, cid)
            return
        evaluated: list[Any] = [None] * len(group)  # each client's outputs on its local test split
        if work.local_metrics is not None and any(d.test_idx.numel() for d in datas):
            evaluated = evaluate_stacked(stack, trained, datas, work.local, work.precision)
        seconds = clock() - start
        self._note_path(stack)
        for cid, message, state, done, outputs in zip(
            group, messages, states, trained, evaluated, strict=True
        ):
            start = clock()
            try:
                res: ClientResult | Exception = finish_client(
                    worker,
                    work.strategy,
                    message,
                    state,
                    work.data[cid],
                    done,
                    work.round,
                    work.local_for(cid),
                    work.precision,
                    work.eval_metrics(cid),
                    outputs,
                )
            except Exception as err:
                res = err
            seconds += clock() - start
            self.counts["vectorised"] += 1
            yield cid, message, res
        if decision is not None and decision.measuring:
            steps = sum(work.local_for(cid).num_steps(work.data[cid]) for cid in group)
            if decision.add(len(group), seconds, steps, work.round):
                self._decided(decision)

    def evaluate(self, work: Work) -> Evaluation:
        """As one at a time (:meth:`Sequential.evaluate`); where every client deploys the global model
        itself (a strategy that declares no ``deploys_personal_model`` and keeps no personal layers, on a
        network that vectorises), the clients' test batches go through it together, about
        ``eval_batch_size`` samples per forward, and each client's metrics are updated with its own batches'
        outputs as one at a time."""
        worker = work.worker()
        strategy, local = work.strategy, work.local
        if (
            self.size == 1
            or declaring(strategy, "deploys_personal_model")
            or strategy.personal_names(work.model)
            or cannot_vectorize(worker, strategy, local, work.precision) is not None
        ):
            return super().evaluate(work)
        load_tensors(worker, {k: v for k, v in work.model.state_dict().items() if v.is_floating_point()})
        merged, metrics = work.metrics(), work.metrics()
        per: dict[int, dict[str, float]] = {}
        pending: list[tuple[int, list[Any]]] = []

        def flush() -> None:
            outputs = iter(outputs_together(worker, [b for _, bs in pending for b in bs], work.precision))
            for cid, batches in pending:
                metrics.reset()
                for _, target in batches:
                    metrics.update(next(outputs), target)
                per[cid] = metrics.compute()
                merged.merge(metrics)
            pending.clear()

        samples = 0
        for cid in work.clients:
            batches = list(work.data[cid].eval_batches(local.eval_batch_size))
            pending.append((cid, batches))
            samples += sum(len(y) for _, y in batches)
            if samples >= local.eval_batch_size:
                flush()
                samples = 0
        flush()
        return per, merged

    def _group_size(self, work: Work, worker: ClientModule) -> int:
        """Clients per group this round (1: one at a time), with the run's one notice on why."""
        if self.size == 1 or len(work.clients) <= 1:
            return 1
        reason = cannot_vectorize(worker, work.strategy, work.local, work.precision)
        if reason is not None:
            self.notice(f"model.runtime.vectorize={self.size}: clients train one at a time: {reason}")
            return 1
        if self.max_group is None:
            largest = max(work.data, key=lambda d: d.num_samples)
            local = work.local
            requested = len(work.data) if self.size == "auto" else int(self.size)
            self.max_group, note = group_size(
                requested, worker, largest, local.batch_size, local.vectorize_memory_gb
            )
            log.info(
                "model.runtime.vectorize=%s: groups of up to %d clients (%s)", self.size, self.max_group, note
            )
        return min(self.max_group, len(work.clients))

    def _decision(self, work: Work, worker: ClientModule, size: int) -> CpuDecision | None:
        """The CPU's choice between batched groups and one at a time (None: groups train batched)."""
        if size <= 1 or module_device(worker).type != "cpu":
            return None
        if self.decision is None:
            self.decision = CpuDecision(work.local.vectorize_cpu, size)
            if self.decision.batched is False:
                log.info(
                    "model.runtime.vectorize=%s: clients train one at a time (model.runtime.vectorize_cpu)",
                    self.size,
                )
            elif self.decision.measuring:
                _, not_chain = linear_chain(worker.net)
                why = runs_under_vmap(not_chain, module_device(worker), work.local, work.precision)
                if why is not None:  # measured slower than one at a time on CPUs: see engine/calibrate.py
                    self.decision.rule(
                        f"a group would run under torch.func.vmap ({why}), which measured slower than one "
                        "client at a time on CPUs (engine/calibrate.py); model.runtime.vectorize_cpu=batched "
                        "batches it anyway"
                    )
                    self._decided(self.decision)
        return self.decision

    def _decided(self, decision: CpuDecision) -> None:
        """Say the CPU's measured choice once, and drop the stacks it no longer needs."""
        if decision.batched:
            log.info(
                "model.runtime.vectorize=%s: groups train batched on this CPU: %s",
                self.size,
                decision.describe(),
            )
        else:
            where = "" if decision.reason is not None else ", where batching does not pay"
            self.notice(
                f"model.runtime.vectorize={self.size}: clients train one at a time on this CPU{where}: "
                f"{decision.describe()}"
            )
            self.stacks.clear()

    def _note_path(self, stack: StackedWorker) -> None:
        """Log once how a stacked group's forward, backward and step ran."""
        if stack.chained:
            self._fused = stack.unfused is None
            text = (
                "a batched linear chain, the local SGD step fused into its backward"
                if stack.unfused is None
                else f"a batched linear chain, the local step not fused: {stack.unfused}"
            )
        else:
            self._fused = False
            why = f" (not a linear chain: {stack.chain_reason})" if stack.chain is None else ""
            text = f"torch.func.vmap over the stacked parameters{why}"
        if text not in self._said:
            self._said.add(text)
            log.info("model.runtime.vectorize: a group's forward and backward run as %s", text)

    def facts(self) -> dict[str, float]:
        """The ``vectorize/*`` scalars of the round's record (see :mod:`~fl_lightning.engine.calibrate`)."""
        if self._bound <= 1:
            return {}
        decision = self.decision
        out = {}
        if decision is None or decision.batched is not None:  # decided (or not on a CPU)
            batched = decision is None or bool(decision.batched)
            out["vectorize/batched"] = float(batched)
            out["vectorize/group_size"] = float(self._bound if batched else 1)
        if decision is not None and decision.round is not None:
            out["vectorize/speedup"] = decision.speedup
        if self._fused is not None:
            out["vectorize/fused_sgd"] = float(self._fused)
        return out

    def _stack(self, worker: ClientModule, size: int) -> StackedWorker:
        """The stacked worker for ``size`` clients, kept for the next rounds: one of the round's group size
        (or larger, built before) for this worker and device, or for a smaller group a stack within it
        (its first ``size`` slots, no copy of the parameters); a larger group replaces them."""
        where = (id(worker), module_device(worker))
        stack = self.stacks.get((*where, size))
        if stack is not None:
            return stack
        own = next((s for k, s in self.stacks.items() if k[:2] == where and s.within is None), None)
        if own is None or own.size < size:
            self.stacks = {k: s for k, s in self.stacks.items() if k[:2] != where}
            own = StackedWorker(worker, max(size, self._bound))
            self.stacks[(*where, own.size)] = own
        if own.size == size:
            return own
        stack = self.stacks[(*where, size)] = StackedWorker(worker, size, within=own)
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
        self.notices = inner.notices

    def share(self, work: Work) -> list[int]:
        rank, size = world()
        sizes = {c: work.data[c].num_samples for c in work.clients}
        return assign_clients(list(work.clients), sizes, size)[rank]

    def train(self, work: Work) -> Iterator[Outcome]:
        return self.inner.train(work)

    def facts(self) -> dict[str, float]:
        return self.inner.facts()

    def gather(self, work: Work, agg: Aggregator, result: RoundResult) -> dict[int, State]:
        mine = {
            "agg": agg.share(),
            "aggregated": result.info.aggregated,
            "failed": result.failed,
            "metrics": result.client_metrics,
            "train_states": result.train_states,
            "bytes": (result.bytes_down, result.bytes_up),
            "error": result.error,
            "vectorised": result.vectorised,
            "states": {cid: work.state(cid) for cid in result.info.aggregated},
        }
        parts = all_gather_objects(mine)
        agg.combine([p["agg"] for p in parts], module_device(work.model))
        result.info.aggregated, result.failed, result.client_metrics, result.train_states = [], [], {}, {}
        result.bytes_down = result.bytes_up = result.vectorised = 0
        result.error = ""
        others: dict[int, State] = {}
        for part in parts:
            result.info.aggregated += part["aggregated"]
            result.failed += part["failed"]
            result.client_metrics.update(part["metrics"])
            result.train_states.update(part["train_states"])
            result.bytes_down += part["bytes"][0]
            result.bytes_up += part["bytes"][1]
            result.error = result.error or part["error"]
            result.vectorised += part["vectorised"]
            others.update({cid: s for cid, s in part["states"].items() if cid not in mine["states"]})
        result.info.aggregated.sort()
        result.failed.sort()
        result.client_metrics = dict(sorted(result.client_metrics.items()))
        return others

    def evaluate(self, work: Work) -> Evaluation:
        rank, size = world()
        per, merged = self.inner.evaluate(dataclasses.replace(work, clients=work.clients[rank::size]))
        merged_all = work.metrics()
        gathered: dict[int, dict[str, float]] = {}
        for part_per, states in all_gather_objects((per, merged.state_tensors())):
            gathered.update(part_per)
            merged_all.merge(TaskMetrics.from_state_tensors(merged.task, merged.num_classes, states))
        return dict(sorted(gathered.items())), merged_all


def default_executor(local: LocalConfig) -> Executor:
    """The executor of a run in this process: one client at a time, or vectorised groups
    (``model.runtime.vectorize`` above 1 or auto); each process its share inside a ``torch.distributed``
    process group."""
    inner: Executor = Vectorized(local.vectorize) if local.vectorized else Sequential()
    return ProcessGroup(inner) if is_distributed() else inner


__all__ = [
    "Evaluation",
    "Executor",
    "Outcome",
    "ProcessGroup",
    "Sequential",
    "Vectorized",
    "Work",
    "default_executor",
    "run_client",
]
