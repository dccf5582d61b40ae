"""The federated round, written once.

:class:`Engine` owns everything a round means: the clients it samples, the message each receives, the
simulated attack, the failure policy, the aggregate, ``process_aggregate``, the server update and the
server optimizer's step, the round's metrics and the reason to stop. It uses no Lightning API: the clients'
local work is handed to an executor as a :class:`~fl_lightning.engine.work.Work` (the executors are in
:mod:`fl_lightning.engine.executors`: one client at a time, vectorised groups, a process group's share; or
a Flower grid's SuperNodes; the adapter that sets the engine up chooses one, and this module imports none
of them) and the adapters above it only drive rounds and report what they return:
:class:`~fl_lightning.lightning.module.FederatedModule` (a round is a Lightning training step: logging,
checkpoints, callbacks) and the Flower ServerApp. A policy therefore holds the same on every path.

A round runs through the engine's schedule (:mod:`fl_lightning.engine.schedule`: one event-driven server
step, whose synchronous case waits for the whole cohort and whose asynchronous case consumes the next ``K``
arrivals), which says who trains when on the system model's clock (without ``model.system`` the null model:
everyone online, instantaneous); everything else is the engine's, written once for both. A round, in
order::

    sample            strategy.select_clients among the clients online (seeded by (seed, round));
                      stop_reason(round) or the simulated time budget refuses it
    message           strategy.message(model, client, round), built when its client's work starts
    local work        the executor: train_client per client (or a vectorised group), anywhere
    attack            the run's simulated attack (model.attack, or the Attack plug-in) replaces what a
                      malicious client sends
    failure policy    a client whose work raised (not a ConfigError) or uploaded non-finite values is
                      excluded and counted; with tolerate_client_failures=false the run stops;
                      max_failed_rounds rounds' worth of consecutive failed units (a round without
                      any upload; M failed arrivals of an asynchronous schedule) stop it too
    aggregate         strategy.aggregator(): add per accepted upload; combined across processes
    process_aggregate strategy.process_aggregate(means, info) (e.g. central DP noise)
    server step       strategy.server_update (pseudo-gradient) -> server optimizer step ->
                      strategy.on_after_server_step; a round without uploads is skipped
    round metrics     bytes, time, clients, train metrics (merged by state), strategy.round_metrics()
    stop reason       strategy.stop_reason(round + 1): the run ends after this round
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from fl_lightning.api.aggregation import Aggregator
from fl_lightning.api.asynchronous import AsyncStrategy, check_buffer
from fl_lightning.api.client import ClientModule, merge_train_states
from fl_lightning.api.metrics import TaskMetrics
from fl_lightning.api.strategy import own_local_step
from fl_lightning.api.task import Task
from fl_lightning.api.types import ClientResult, Payload, RoundResult, RunSpec
from fl_lightning.data.federated import ClientData
from fl_lightning.engine.asynchronous import AsyncSchedule
from fl_lightning.engine.attack import SimulatedAttack, run_attack
from fl_lightning.engine.config import EngineConfig
from fl_lightning.engine.local import check_upload
from fl_lightning.engine.record import RoundRecord, SimulatedTime
from fl_lightning.engine.schedule import (
    RoundListener,
    RoundOutcome,
    Rounds,
    Schedule,
    ServerStep,
    checked_selection,
    num_sampled,
    one_line,
    timed,
)
from fl_lightning.engine.state import ClientStateStore
from fl_lightning.engine.system import Devices, Instant, Setup, SystemModel
from fl_lightning.engine.work import Executor, Work
from fl_lightning.errors import ConfigError, RunError
from fl_lightning.functional.sampling import sample_clients
from fl_lightning.functional.tensor import derive_seed, module_device, payload_bytes, shared_state

if TYPE_CHECKING:
    from fl_lightning.api.strategy import Strategy

log = logging.getLogger("fl_lightning")

#: Seed stream of the clients sampled for evaluation (``model.eval_fraction``).
EVAL_STREAM = 0xE7A


def _null_system(strategy: Strategy) -> SystemModel:
    """The system model of a run without ``model.system``: the null model, every client online and
    instantaneous; an asynchronous strategy needs a clock: every client an equal device."""
    if not isinstance(strategy, AsyncStrategy):
        return Instant()
    log.info(
        "%s without model.system: every client an equal device (Devices with sigma 0)",
        type(strategy).__name__,
    )
    return Devices(speed_sigma=0.0, bandwidth_sigma=0.0)


@dataclass
class Engine:
    """The federated round for one global model and strategy, with the clients' state.

    Use: :meth:`setup` once (the federation's clients and task), then :meth:`run_round` per round; the
    history of round records (:attr:`history`) and the client state store (:attr:`store`) are what a
    checkpoint keeps besides the model and the server optimizer.

    Attributes:
        model: The global model (a :class:`~fl_lightning.api.client.ClientModule`).
        strategy: The federated algorithm.
        config: How rounds run.
        store: Every client's persistent state (on the host, spilling to disk past a budget).
        executor: Runs the clients' local work (given to :meth:`setup`, e.g.
            :func:`~fl_lightning.engine.executors.default_executor`); it receives each round's work as a
            :class:`~fl_lightning.engine.work.Work` and never sees the engine.
        precision: A Lightning precision plugin for the clients' steps and evaluation (None: fp32).
        num_rounds: The rounds the run will do (-1: unknown); no stop is announced for the last one.
        attack: The run's simulated attack and where it was declared (set by :meth:`setup`; None: none).
        clock: The simulated time in seconds (part of the checkpoint; 0 without a clocked system model).
        schedule: Who trains when (set by :meth:`setup`): synchronous
            :class:`~fl_lightning.engine.schedule.Rounds`, or the
            :class:`~fl_lightning.engine.asynchronous.AsyncSchedule` of an
            :class:`~fl_lightning.api.asynchronous.AsyncStrategy`.
        unseen: Clients held out of training (``data.unseen_clients``): never sampled (:meth:`eligible`).
        failed_streak: Consecutive failed units of the schedule (:meth:`count_failures`); restored from the
            history on resume (:meth:`load_schedule_state`).
    """

    model: ClientModule
    strategy: Strategy
    config: EngineConfig
    store: ClientStateStore = field(default_factory=ClientStateStore)
    executor: Executor | None = None
    precision: Any = None
    num_rounds: int = -1
    history: list[RoundRecord] = field(default_factory=list)
    clients: list[ClientData] = field(default_factory=list, repr=False)
    task: Task | None = None
    num_classes: int = 0
    _optimizer: torch.optim.Optimizer | None = field(default=None, repr=False)
    _worker: ClientModule | None = field(default=None, repr=False)
    _local_metrics: TaskMetrics | None = field(default=None, repr=False)
    attack: tuple[str, SimulatedAttack] | None = None
    clock: float = 0.0
    schedule: Schedule | None = None
    unseen: frozenset[int] = frozenset()
    failed_streak: int = 0
    _system: SystemModel | None = field(default=None, repr=False)

    # ------------------------------------------------------------------------------------ setup
    def setup(
        self,
        clients: list[ClientData],
        task: str,
        num_classes: int,
        precision: Any = None,
        executor: Executor | None = None,
    ) -> None:
        """Bind the federation and check the configuration against it (one ``ConfigError`` line).

        Validates ``clients_per_round``, sets up the strategy's server state (before a checkpoint is
        restored into it), runs :meth:`Strategy.check <fl_lightning.api.strategy.Strategy.check>`, resolves
        the run's simulated attack (:func:`~fl_lightning.engine.attack.run_attack`) and binds ``executor``
        (None: keep the one given before; the caller chooses it, e.g.
        :func:`~fl_lightning.engine.executors.default_executor`, or Flower's grid).
        """
        if executor is not None:
            self.executor = executor
        if self.executor is None:
            raise ValueError("Engine.setup needs an executor, e.g. default_executor(config.local)")
        self.clients = clients
        self.task = Task(task)
        self.num_classes = int(num_classes)
        self.precision = precision
        num_sampled(len(clients), self.config.participation, self.config.clients_per_round)
        self.strategy.setup(self.model, len(clients))
        spec = self.spec()
        owner = own_local_step(self.strategy)
        if spec.grad_scaler and owner is not None:  # the local loop steps through the scaler instead
            raise ConfigError(
                f"model.strategy: {owner} needs its own local step, which trainer.precision=16-mixed "
                "bypasses (its gradient scaler steps the optimizer); set trainer.precision to bf16-mixed or "
                "32-true"
            )
        self.strategy.check(self.model, spec)
        self.attack = run_attack(self.config.attack, self.strategy)
        if self.attack is not None:
            log.info("%s: clients %s are malicious", self.attack[0], sorted(self.malicious()))
        self._bind_system()

    def _bind_system(self) -> None:
        """Bind the system model to the run (its devices, its checks) and, for an asynchronous strategy, make
        its schedule; one ``ConfigError`` line for a configuration they cannot run."""
        strategy, system = self.strategy, self.config.system
        asynchronous = isinstance(strategy, AsyncStrategy)
        inner = next((m for m in strategy.modules() if isinstance(m, AsyncStrategy)), None)
        if inner is not None and not asynchronous:
            raise ConfigError(
                f"model.strategy: {type(strategy).__name__} cannot wrap {type(inner).__name__}, an "
                "asynchronous strategy (its server steps consume arrivals, not rounds); use it on its own"
            )
        system = system or _null_system(strategy)
        local = self.config.local
        nbytes = payload_bytes(
            {"weights": shared_state(self.model, exclude=strategy.personal_names(self.model))}
        )
        system.bind(
            Setup(
                num_clients=self.num_clients,
                seed=self.config.seed,
                batch_size=local.batch_size,
                full_steps=tuple(local.num_steps(d) for d in self.clients),
                steps_per_epoch=tuple(d.steps_per_epoch(local.batch_size) for d in self.clients),
                local_epochs=local.local_epochs if local.local_steps is None else None,
                local_steps=local.local_steps,
                bytes_down=nbytes,
                bytes_up=nbytes,
            ),
            self.config.round_policy,
        )
        self._system = system
        if system.clocked:
            log.info("model.system: %s", system.describe())
        for notice in [] if asynchronous else system.idle(self.cohort):  # asynchronous: refused below
            log.warning(notice)
        self.schedule = self._async_schedule(strategy, system) if asynchronous else Rounds(self)

    def _async_schedule(self, strategy: AsyncStrategy, system: SystemModel) -> AsyncSchedule:
        """The asynchronous schedule of ``strategy``, after refusing what it cannot run (one line each)."""
        name = type(strategy).__name__
        rounds_only = system.plans_rounds  # a preset of round-level work (Stragglers)
        policy = system.round_policy
        if policy.deadline_s is not None or policy.over_selection > 0 or rounds_only:
            what = (
                f"model.system={type(system).__name__}"
                if rounds_only
                else f"{policy.field}.deadline_s"
                if policy.deadline_s is not None
                else f"{policy.field}.over_selection"
            )
            raise ConfigError(
                f"{what} shapes synchronous rounds; model.strategy={name} has none (a server step consumes "
                "arrivals): unset it, or use model.system=Devices or Trace without a deadline"
            )
        if self.config.local.lr_decay != 1:
            raise ConfigError(
                f"model.lr_decay={self.config.local.lr_decay} decays the local lr per round; "
                f"model.strategy={name} has no rounds: set it to 1"
            )
        cohort = num_sampled(self.num_clients, self.config.participation, self.config.clients_per_round)
        in_flight = strategy.in_flight(cohort)
        if in_flight > self.num_clients:
            raise ConfigError(
                f"model.strategy.concurrency={in_flight} is larger than data.num_clients={self.num_clients}: "
                f"at most {self.num_clients} clients can be in flight"
            )
        buffer = strategy.buffer(in_flight)
        if strategy.concurrency is None and buffer > in_flight:
            raise ConfigError(
                f"model.strategy.buffer_size={buffer} is larger than the {in_flight} clients in flight "
                "(model.strategy.concurrency unset: the clients a round samples, model.clients_per_round or "
                f"model.participation); set buffer_size <= {in_flight} or set concurrency"
            )
        check_buffer(buffer, in_flight, name)
        every = "at every arrival" if buffer == 1 else f"every {buffer} arrivals"
        log.info("%s: %d clients in flight, a server step %s", name, in_flight, every)
        return AsyncSchedule(self, strategy, in_flight, buffer)

    @property
    def system(self) -> SystemModel:
        """The bound system model (``model.system``; without one, the null model :class:`Instant`, or equal
        devices for an asynchronous strategy)."""
        assert self._system is not None, "call setup() first"
        return self._system

    @property
    def cohort(self) -> int:
        """``K``, the clients a round keeps (``model.clients_per_round`` or ``model.participation`` of the
        :meth:`eligible` clients)."""
        pool = len(self.eligible(range(self.num_clients)))
        return num_sampled(pool, self.config.participation, self.config.clients_per_round)

    def spec(self) -> RunSpec:
        """What the run is made of, for the strategy's :meth:`check`."""
        first = self.clients[0]
        labels = first.y
        return RunSpec(
            task=self.task,
            num_classes=self.num_classes,
            num_clients=len(self.clients),
            input_shape=tuple(first.x.shape[1:]),
            integer_labels=labels.dim() == 1 and not labels.is_floating_point(),
            grad_scaler=getattr(self.precision, "scaler", None) is not None,
            unseen=frozenset(self.unseen),
        )

    @property
    def num_clients(self) -> int:
        return len(self.clients)

    def server_optimizer(self) -> torch.optim.Optimizer:
        """The strategy's server optimizer over the global model's trainable parameters (made once)."""
        if self._optimizer is None:
            params = [p for p in self.model.parameters() if p.requires_grad]
            self._optimizer = self.strategy.configure_server_optimizer(params)
        return self._optimizer

    @property
    def worker(self) -> ClientModule:
        """The working copy of the model that this process's clients train in turn (on the model's device)."""
        w = self._worker
        if w is None or module_device(w) != module_device(self.model):
            w = copy.deepcopy(self.model).to(module_device(self.model))
            self._worker = w
        return w

    def metrics(self) -> TaskMetrics:
        """Fresh evaluation metrics of the run's task, on the model's device (they follow their inputs)."""
        assert self.task is not None, "call setup() first"
        metrics = TaskMetrics(self.task, self.num_classes)
        device = module_device(self.model)
        return metrics if device.type == "cpu" else metrics.to(device)

    @property
    def local_metrics(self) -> TaskMetrics:
        """The metrics of a client's freshly trained model on its local test split (reset per client)."""
        if self._local_metrics is None:
            self._local_metrics = self.metrics()
        return self._local_metrics

    # ------------------------------------------------------------------------------------ facts
    def eligible(self, candidates: Any) -> list[int]:
        """The ``candidates`` that may be sampled for training: all but the :attr:`unseen` clients (the one
        place sampling skips them; synchronous rounds, system rounds and asynchronous dispatch call it)."""
        return [int(c) for c in candidates if int(c) not in self.unseen]

    def sample(self, round: int) -> list[int]:
        """The clients of ``round``, sorted: :meth:`draw` among the clients online when the round starts."""
        system = self.system
        online = self.eligible(system.online(round, system.next_online_s(self.clock)))
        return self.draw(online, system.sample_count(self.cohort, len(online)), round)

    def draw(self, online: list[int], count: int, slot: int) -> list[int]:
        """``count`` of the ``online`` clients (sorted ids; none online: none), drawn by the strategy's
        ``select_clients`` seeded by ``(seed, slot)`` (a round, or an asynchronous dispatch): its indices map
        onto the online clients in id order, so with every client online it draws client ids directly."""
        if not online:
            return []
        chosen = self.strategy.select_clients(len(online), count, slot, self.config.seed)
        return [online[i] for i in checked_selection(chosen, len(online))]

    def malicious(self) -> frozenset[int]:
        """The clients the run's simulated attack makes malicious (drawn once from the run seed)."""
        if self.attack is None:
            return frozenset()
        return self.attack[1].malicious(self.num_clients, self.config.seed)

    def message(self, client_id: int, round: int) -> Payload:
        """What the server sends ``client_id`` in ``round``."""
        return self.strategy.message(self.model, client_id, round)

    def work(
        self,
        round: int,
        clients: list[int],
        message: Callable[[int], Payload] | None = None,
        state: Callable[[int], dict[str, torch.Tensor]] | None = None,
        steps: dict[int, int] | None = None,
    ) -> Work:
        """What an executor needs to run ``clients``' work of ``round`` (-1: an evaluation).

        ``message`` and ``state`` default to the strategy's message and the store's state; a Flower
        SuperNode passes the message it received and the state its node keeps. ``steps``: the local steps
        decided per client (a system model's partial work; None: ``local.num_steps`` each).
        """
        assert self.executor is not None and self.task is not None, "call setup() first"
        if message is None:

            def message(client_id: int) -> Payload:
                return self.message(client_id, round)

        return Work(
            round=round,
            clients=tuple(clients),
            strategy=self.strategy,
            model=self.model,
            data=self.clients,
            message=message,
            state=self.store.get if state is None else state,
            local=self.config.local,
            precision=self.precision,
            worker=lambda: self.worker,
            metrics=self.metrics,
            local_metrics=lambda: self.local_metrics,
            steps=steps,
        )

    def eval_sample(self, rounds_done: int) -> list[int] | None:
        """The clients evaluated during fit after ``rounds_done`` rounds (None: all, ``eval_fraction=1``)."""
        if self.config.eval_fraction >= 1:
            return None
        m = self.num_clients
        count = num_sampled(m, self.config.eval_fraction, None)
        return sample_clients(m, count, derive_seed(self.config.seed, EVAL_STREAM), rounds_done)

    # ------------------------------------------------------------------------------------ a round
    def run_round(
        self, round: int, step: ServerStep | None = None, listener: RoundListener | None = None
    ) -> RoundOutcome:
        """Run round (or server step) ``round`` (0-based) through the schedule and record it in
        :attr:`history`.

        Raises:
            RunError: The strategy refuses the round (e.g. a spent privacy budget), or
                ``max_failed_rounds`` consecutive rounds had no accepted upload.
        """
        assert self.schedule is not None, "call setup() first"
        watch = timed()
        step = step if step is not None else ServerStep(self.server_optimizer())
        listener = listener if listener is not None else RoundListener()
        done = self.schedule.step(round, step, listener)
        sim = done.sim if self.system.clocked else None
        record = self.round_record(round, done.result, watch(), sim, done.steps)
        record.late_ids, record.partial_ids, record.dropped_ids = done.late, done.partial, done.dropped
        self.history.append(record)
        return RoundOutcome(record, done.result, self.stop_after(round))

    def check_round(self, round: int) -> None:
        """Refuse a round (or server step) the strategy refuses (e.g. a spent privacy budget) or that the
        simulated time budget does not allow (a resumed run), before anything of it runs."""
        reason = self.strategy.stop_reason(round) or self._budget_spent()
        if reason:
            unit = self.schedule.unit if self.schedule is not None else "round"
            raise RunError(f"{unit} {round} cannot run: {reason}")

    def server_step(self, round: int, agg: Aggregator, result: RoundResult, step: ServerStep) -> None:
        """The server step of every schedule: the aggregate through ``process_aggregate``, ``server_update``,
        the server optimizer's step and ``on_after_server_step``; a round without uploads is skipped."""
        if not result.info.aggregated:  # every client failed: nothing to aggregate (the round is skipped)
            self._skip(round, result, step)
            return
        result.info.weight_totals = agg.weight_totals
        result.means = self.strategy.process_aggregate(agg.means(), result.info)
        result.train_metrics = merge_train_states(result.train_states[c] for c in sorted(result.train_states))
        step.zero_grad()
        self.strategy.server_update(self.model, result.means, result.info)
        step.step()
        self.strategy.on_after_server_step(self.model, result.means, result.info)

    def refuse_dropout(self, where: str, client: int) -> None:
        """The dropout policy: a mid-round dropout is a failed client, which stops the run under
        ``model.tolerate_client_failures=false``."""
        if not self.config.tolerate_client_failures:
            raise RunError(
                f"{where}: client {client} dropped out mid-round (model.system) and "
                "model.tolerate_client_failures=false stops the run; set it to true to count dropouts as "
                "failed clients"
            )

    def collect(
        self, round: int, work: Work, agg: Aggregator, result: RoundResult, listener: RoundListener
    ) -> None:
        """Run ``work`` on the executor (this process's share), pass each outcome through the attack and the
        failure policy into ``agg`` and ``result``, and gather them across processes."""
        assert self.executor is not None, "call setup() first"
        device = module_device(self.model)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        malicious = self.malicious()
        vectorised = self.executor.counts["vectorised"]
        mine = self.executor.share(work)
        work = dataclasses.replace(work, clients=tuple(mine))
        for index, (cid, message, outcome) in enumerate(self.executor.train(work)):
            try:
                res = self._accept(round, cid, message, outcome, cid in malicious)
            except (ConfigError, RunError):
                raise  # a configuration the strategy cannot run is never a client failure
            except Exception as err:
                if not self.config.tolerate_client_failures:
                    raise RunError(
                        f"round {round}: client {cid} failed ({one_line(err)}) and "
                        "model.tolerate_client_failures=false stops the run; fix the cause, or set it to "
                        "true to exclude failing clients from their rounds"
                    ) from err
                result.error = result.error or f"client {cid}: {one_line(err)}"
                result.failed.append(cid)
                result.bytes_down += payload_bytes(message)
                log.warning("round %d: client %d excluded from the aggregate: %s", round, cid, err)
                listener.client_end(round, index, len(mine), None)
                continue
            agg.add(res.upload, res.num_samples, cid)
            if res.state is not None:
                self.store.put(cid, res.state)
            result.info.aggregated.append(cid)
            result.client_metrics[cid] = dict(res.metrics, num_samples=res.num_samples)
            # the steps it ran (z_client/<id>/steps)
            result.client_metrics[cid]["steps"] = work.local_for(cid).num_steps(work.data[cid])
            result.train_states[cid] = res.train_state
            result.bytes_down += res.bytes_down
            result.bytes_up += res.bytes_up
            listener.client_end(round, index, len(mine), res)
        if device.type == "cuda":
            result.peak_memory_gb = torch.cuda.max_memory_allocated(device) / 2**30
        result.vectorised = self.executor.counts["vectorised"] - vectorised
        for cid, state in self.executor.gather(work, agg, result).items():  # trained by another process
            self.store.put(cid, state)

    def _accept(
        self, round: int, cid: int, message: Payload, outcome: ClientResult | BaseException, malicious: bool
    ) -> ClientResult:
        """The client's result after the attack; raises what makes it a failed client."""
        if isinstance(outcome, BaseException):
            raise outcome
        if malicious:  # the one place an attack replaces an upload (same size: bytes_up holds)
            assert self.attack is not None
            if "weights" not in message:  # IFCA sends its k cluster models: no one model to attack from
                raise ConfigError(
                    f"model.attack needs the global model in the round's message, which "
                    f"model.strategy={type(self.strategy).__name__} does not send; remove model.attack"
                )
            outcome.upload = self.attack[1].apply(outcome.upload, message)
        check_upload(cid, round, outcome.upload)
        return outcome

    def count_failures(
        self, where: str, failed: bool, error: str = "", units: str = "rounds", per_round: int = 1
    ) -> None:
        """The failure-streak rule of every schedule: a unit of its work (a synchronous round, an asynchronous
        arrival) with accepted work ends the streak, a failed one adds to it, and ``model.max_failed_rounds``
        rounds' worth of consecutive failed units (``per_round`` units a round: 1, or the ``M`` clients in
        flight) stop the run with one line quoting the last error. The streak is :attr:`failed_streak`,
        restored from the history on resume."""
        if not failed:
            self.failed_streak = 0
            return
        self.failed_streak += 1
        rounds = self.config.max_failed_rounds
        if self.failed_streak >= rounds * per_round:
            scale = f" (the limit is it times the {per_round} clients in flight)" if per_round > 1 else ""
            raise RunError(
                f"{where}: every sampled client failed for {self.failed_streak} consecutive {units} (last "
                f"error: {error}); see the warnings above, fix the cause or raise "
                f"model.max_failed_rounds={rounds}{scale}"
            )

    def _skip(self, round: int, result: RoundResult, step: ServerStep) -> None:
        """A round in which every sampled client failed: no server update, but the round counts (a unit of the
        failure streak, :meth:`count_failures`). A round whose system model left no work to aggregate without
        any client failing (every client late under ``policy: drop``, or none online) is skipped too, with an
        INFO line, and is not counted: it neither adds to a streak of failed rounds nor ends one."""
        if not result.failed:
            log.info(
                "round %d: no client's work to aggregate (%s); global model unchanged", round, result.error
            )
        else:
            log.warning(
                "round %d skipped: every sampled client failed (%s); global model unchanged (%d of "
                "model.max_failed_rounds=%d consecutive)",
                round,
                result.error,
                self.failed_streak,
                self.config.max_failed_rounds,
            )
        step.skip()

    def round_record(
        self,
        round: int,
        result: RoundResult,
        seconds: float,
        sim: SimulatedTime | None = None,
        steps: dict[int, int] | None = None,
    ) -> RoundRecord:
        """The round's record for the history (and the logs): its facts, the steps each aggregated client
        ran (``steps``; default: the local work's steps) and, with a simulated clock, ``sim``."""
        local = self.config.local
        if steps is None:
            steps = {c: local.num_steps(self.clients[c]) for c in result.info.aggregated}
        facts = self.executor.facts() if self.executor is not None else {}
        return RoundRecord(
            round=round,
            clients=len(result.info.sampled),
            failed=len(result.failed),
            bytes_down=result.bytes_down,
            bytes_up=result.bytes_up,
            time_s=seconds,
            client_lr=local.lr_at(float(getattr(self.model, "lr", 0.0)), round),
            skipped=not result.info.aggregated,
            aggregated=len(result.info.aggregated),
            sampled=list(result.info.sampled),
            failed_ids=list(result.failed),
            client_steps={c: steps[c] for c in sorted(steps) if c in result.info.aggregated},
            train=dict(result.train_metrics),
            sim=sim,
            strategy=dict(self.strategy.round_metrics()),  # e.g. privacy/epsilon
            vectorize=dict(facts),  # how the local work ran (model.runtime.vectorize)
            vectorised_clients=result.vectorised if local.vectorized else None,
            peak_memory_gb=result.peak_memory_gb,
            client_held_state=self.executor is not None and self.executor.state_held,
        )

    def stop_after(self, round: int) -> str:
        """Why the run must end after ``round`` (the strategy refuses the next one, or the simulated time
        budget is spent), "" to go on."""
        nxt = round + 1
        if 0 <= self.num_rounds <= nxt:
            return ""
        reason = self.strategy.stop_reason(nxt) or self._budget_spent()
        if reason:
            unit = self.schedule.unit if self.schedule is not None else "round"
            log.warning("stopping after %d %ss: %s", nxt, unit, reason)  # 1-based: the rounds done
        return reason

    def _budget_spent(self) -> str:
        policy = self.system.round_policy
        budget = policy.max_sim_time_s
        if budget is None or self.clock < budget:
            return ""
        return (
            f"the simulated time budget is spent (sim/time_s={self.clock:.6g} >= "
            f"{policy.field}.max_sim_time_s={budget:g})"
        )

    # ------------------------------------------------------------------------------------ checkpoint
    def schedule_state(self) -> dict[str, Any] | None:
        """The simulated clock and the asynchronous schedule's clients in flight, for the checkpoint (None:
        no simulated clock)."""
        if not self.system.clocked:
            return None
        state: dict[str, Any] = {"clock": self.clock}
        held = self.schedule.state_dict() if self.schedule is not None else {}
        if held:
            state["async"] = held
        return state

    def load_schedule_state(self, state: dict[str, Any] | None) -> None:
        """Restore :meth:`schedule_state` (after :meth:`setup` and the restored :attr:`history`) and the
        failure streak: the history's last rounds that every sampled client failed (a round without any
        work neither adds nor ends it; an asynchronous server step always ends with an accepted arrival)."""
        counted = (r for r in reversed(self.history) if not r.skipped or r.failed)
        self.failed_streak = sum(1 for _ in itertools.takewhile(lambda r: r.skipped, counted))
        if state is None or not self.system.clocked:
            return
        self.clock = float(state["clock"])
        if self.schedule is not None and "async" in state:
            self.schedule.load_state_dict(state["async"])

    def check_resume(self) -> None:
        """Refuse to continue a restored history whose clients kept their state themselves (a Flower run)
        on an executor without that state: the rounds would silently start those states from zero."""
        if any(r.client_held_state for r in self.history):
            strategy = type(self.strategy).__name__
            raise ConfigError(
                f"ckpt_path: the clients of this run ({strategy}) kept their state on their Flower nodes, "
                "which the checkpoint does not hold and a new run does not have; start a new run, or use a "
                "strategy whose clients keep no state"
            )

    # ------------------------------------------------------------------------------------ evaluation
    @torch.inference_mode(False)  # a deployed model may train (FineTune); validate/test infer
    @torch.no_grad()
    def evaluate_clients(
        self, clients: list[int] | None = None
    ) -> tuple[dict[int, dict[str, float]], TaskMetrics]:
        """Evaluate the deployed model of ``clients`` (default: every client) on its local test split.

        Returns the per-client metrics and their merge by metric state (``personal/*``), the same on
        every process.
        """
        assert self.executor is not None, "call setup() first"
        chosen = list(range(self.num_clients)) if clients is None else list(clients)
        return self.executor.evaluate(self.work(-1, chosen))


__all__ = [
    "EVAL_STREAM",
    "Engine",
    "EngineConfig",
    "RoundListener",
    "RoundOutcome",
    "ServerStep",
    "checked_selection",
    "num_sampled",
    "one_line",
    "timed",
]
