"""How rounds are scheduled on the engine's clock: one event-driven server step for every schedule.

The engine (:class:`~fl_lightning.engine.round.Engine`) runs each round or server step through its
:class:`Schedule`, whose :meth:`Schedule.step` is the one loop::

    dispatch          clients start on the current model at the clock's time (:meth:`Schedule.send`: the
                      engine's online draw, the system model's plan of their work, the dropout policy, the
                      local work through the executor); each becomes an arrival on the clock (a Flight)
    consume           the arrivals in the clock's order (ties: the lower client id), each advancing the
                      clock, until the step has enough; a failed one is counted (the engine's failure streak)
    server step       the engine's: aggregate, process_aggregate, server_update, the optimizer's step (or
                      the skip of a step without uploads)

A schedule says only who it dispatches when, when a step has enough, and what an arrival brings:

- :class:`Rounds`: a synchronous round. The cohort is drawn among the clients online when the round starts
  and dispatched together; the round consumes every arrival of it (the system model's plan says who is late,
  cut or dropped, and how long the round lasts). Its uploads stream into the aggregator as they are
  computed, since the round aggregates all of them; the round is one unit of the failure streak.
- :class:`~fl_lightning.engine.asynchronous.AsyncSchedule`: ``M`` clients in flight, each refilled as it
  arrives; a server step consumes the next ``K`` accepted arrivals, each releasing its held upload into the
  aggregate (FedBuff, FedAsync); each arrival is a unit of the failure streak (``M`` a round).

Everything else is the engine's, written once (:class:`Host`). Without ``model.system`` the clock is the
null system model (every client online, instantaneous, never dropping out), so a round is the same sequence
with or without one.
"""

from __future__ import annotations

import logging
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from fl_lightning.api.aggregation import Aggregator
from fl_lightning.api.types import ClientResult, RoundInfo, RoundResult
from fl_lightning.engine.flight import Flight
from fl_lightning.engine.record import RoundRecord, SimulatedTime
from fl_lightning.engine.system import RoundPlan, SystemModel
from fl_lightning.engine.work import Work
from fl_lightning.errors import ConfigError

if TYPE_CHECKING:
    from fl_lightning.api.client import ClientModule
    from fl_lightning.api.strategy import Strategy
    from fl_lightning.data.federated import ClientData
    from fl_lightning.engine.config import EngineConfig

log = logging.getLogger("fl_lightning")


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


def one_line(err: BaseException) -> str:
    """``"<Type>: <first line of the message>"`` (just the type for an empty message)."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__


def timed() -> Callable[[], float]:
    """A stopwatch: call the returned function for the seconds since creation."""
    start = time.perf_counter()
    return lambda: time.perf_counter() - start


class ServerStep:
    """How the engine takes the server optimizer's step (an adapter may count it, e.g. as Lightning's step).

    Args:
        optimizer: The server optimizer (or a wrapper with ``zero_grad`` and ``step``).
    """

    def __init__(self, optimizer: Any) -> None:
        self.optimizer = optimizer

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def step(self) -> None:
        """Step with the pseudo-gradient ``server_update`` set."""
        self.optimizer.step()

    def skip(self) -> None:
        """A round without any upload: weights and optimizer state stay as they are (nothing to do here)."""


class RoundListener:
    """Round events an adapter may report (progress bars, callbacks); every method is optional."""

    def round_start(self, round: int, clients: list[int]) -> None:
        """Before the sampled clients train."""

    def client_end(self, round: int, index: int, total: int, result: ClientResult | None) -> None:
        """After the ``index``-th of this process's ``total`` clients (``result`` None: it failed)."""


@dataclass
class RoundOutcome:
    """What a round returns: its record (also appended to the engine's history), its aggregate and facts,
    and the reason the run must stop after it ("" to go on)."""

    record: RoundRecord
    result: RoundResult
    stop_reason: str = ""


@dataclass
class Stepped:
    """What a schedule's step did, for the engine's record: the round's result (aggregate, clients, bytes),
    its view of the simulated clock and the local steps each aggregated client ran."""

    result: RoundResult
    sim: SimulatedTime
    steps: dict[int, int]
    late: list[int] = field(default_factory=list)  # the clients' fates by id (the per-client table's counts)
    partial: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)


class Host(Protocol):
    """The engine as a schedule sees it: its clock, its system model and its policies (written once there)."""

    model: ClientModule
    strategy: Strategy
    config: EngineConfig
    clients: list[ClientData]
    clock: float

    @property
    def system(self) -> SystemModel: ...

    @property
    def num_clients(self) -> int: ...

    @property
    def cohort(self) -> int: ...

    def eligible(self, candidates: Any) -> list[int]: ...

    def draw(self, online: list[int], count: int, slot: int) -> list[int]: ...

    def work(self, round: int, clients: list[int], steps: dict[int, int] | None = None) -> Work: ...

    def collect(
        self, round: int, work: Work, agg: Aggregator, result: RoundResult, listener: RoundListener
    ) -> None: ...

    def refuse_dropout(self, where: str, client: int) -> None: ...

    def count_failures(
        self, where: str, failed: bool, error: str = "", units: str = "rounds", per_round: int = 1
    ) -> None: ...

    def server_step(self, round: int, agg: Aggregator, result: RoundResult, step: ServerStep) -> None: ...

    def check_round(self, round: int) -> None: ...


@dataclass
class StepState:
    """One server step while it runs: what it aggregates so far and what it consumed.

    Attributes:
        round: The round (or server step) index.
        start_s: The clock when the step began.
        agg: The step's aggregator (the strategy's).
        result: The step's result: the aggregated clients, the failed ones, bytes, metrics.
        listener: Where the step's events go.
        consumed: The arrivals consumed so far, in the order they were consumed.
        dispatched: The clients the step dispatched.
        checked: Whether the engine's :meth:`~Host.check_round` has let the step run.
    """

    round: int
    start_s: float
    agg: Aggregator
    result: RoundResult
    listener: RoundListener
    consumed: list[Flight] = field(default_factory=list)
    dispatched: int = 0
    checked: bool = False


class Schedule(ABC):
    """Who trains when, and which arrivals a server step consumes (module docstring).

    :meth:`step` is the one loop of every schedule; a subclass says only who it dispatches (:meth:`dispatch`),
    when a step has consumed enough (:meth:`enough`) and what an arrival brings to it (:meth:`consume`).

    Args:
        host: The engine whose clock, system model and policies the schedule uses.

    Attributes:
        flights: The clients dispatched whose arrival has not been consumed yet.
    """

    #: How the schedule's unit is named in messages and progress lines ("round", "server step").
    unit = "round"

    #: Whether a client that drops out mid-work arrives, failed, when its work would have (an asynchronous
    #: server learns of it then); a synchronous round does not wait for it (a failed client of the round).
    dropouts_arrive = False

    def __init__(self, host: Host) -> None:
        self.host = host
        self.flights: list[Flight] = []

    def step(self, round: int, step: ServerStep, listener: RoundListener) -> Stepped:
        """Run round (or server step) ``round``: dispatch, consume the arrivals in the clock's order (each
        advances the clock) until the step has :meth:`enough`, then the engine's server step (or the skip of a
        step without uploads)."""
        host = self.host
        info = RoundInfo(round, [], [], host.num_clients)
        now = StepState(round, host.clock, host.strategy.aggregator(), RoundResult({}, info), listener)
        self.dispatch(now)
        self.check(now)  # a step whose dispatch drew nobody
        while not self.enough(now):
            arrival = self.next_arrival(now)
            host.clock = max(host.clock, arrival.arrival_s)
            now.consumed.append(arrival)
            self.consume(now, arrival)
        self.close(now)
        host.server_step(round, now.agg, now.result, step)
        return self.stepped(now)

    # ------------------------------------------------------------------------------ what a schedule says
    @abstractmethod
    def dispatch(self, now: StepState) -> None:
        """Dispatch the clients the step starts with (:meth:`send`)."""

    @abstractmethod
    def enough(self, now: StepState) -> bool:
        """Whether the step has consumed the arrivals it waits for."""

    def next_arrival(self, now: StepState) -> Flight:
        """The next arrival in the clock's order (ties: the lower client id), out of :attr:`flights`."""
        arrival = min(self.flights, key=lambda f: f.order)
        self.flights.remove(arrival)
        return arrival

    @abstractmethod
    def consume(self, now: StepState, arrival: Flight) -> None:
        """What ``arrival`` brings to the step (the clock is at its arrival)."""

    @abstractmethod
    def close(self, now: StepState) -> None:
        """After the last arrival, before the server step."""

    @abstractmethod
    def stepped(self, now: StepState) -> Stepped:
        """What the step did, for the engine's record."""

    # ------------------------------------------------------------------------------ written once
    def online(self, slot: int) -> list[int]:
        """The clients that may be dispatched now: online at the clock's time in draw ``slot`` (the system
        model's availability), eligible for training (not held out) and not in flight, sorted."""
        host = self.host
        busy = {f.client for f in self.flights}
        return [c for c in host.eligible(host.system.online(slot, host.clock)) if c not in busy]

    def check(self, now: StepState) -> None:
        """The engine's refusal of the step (e.g. resumed past a privacy budget, whose accountant needs the
        round's sampling rate: known once the strategy has drawn), once per step, before any client trains."""
        if not now.checked:
            self.host.check_round(now.round)
            now.checked = True

    def send(
        self, now: StepState, slot: int, online: list[int], count: int, agg: Aggregator, result: RoundResult
    ) -> RoundPlan:
        """Dispatch ``count`` of the ``online`` clients on the current model at the clock's time: the engine's
        draw (seeded by ``slot``: a round, or an asynchronous dispatch), the system model's plan of their work
        (steps, dropouts, the deadline), the dropout policy, and their local work through the run's executor
        into ``agg`` and ``result``. Returns the plan; each client that trains joins :attr:`flights`, arriving
        at ``clock + download + computation + upload`` (failed if its work failed), and so does each dropout
        where :attr:`dropouts_arrive`."""
        host, system = self.host, self.host.system
        sampled = host.draw(online, count, slot)
        self.check(now)  # after the draw (what the strategy knows of the round), before anything trains
        plan = system.plan(slot, sampled, host.cohort)
        plan.online = len(online)
        if plan.dropped_out:
            host.refuse_dropout(f"{self.unit} {now.round}", plan.dropped_out[0])
        now.listener.round_start(now.round, sampled)
        full = system.setup.full_steps
        cut = {c: n for c, n in plan.steps.items() if n != full[c]}  # partial work; the rest runs in full
        host.collect(now.round, host.work(slot, plan.trained, steps=cut or None), agg, result, now.listener)
        now.dispatched += len(sampled)
        failed = set(result.failed)
        error = result.error.split(": ", 1)[-1] if result.error else "failed"
        for c in sorted([*plan.trained, *(plan.dropped_out if self.dropouts_arrive else [])]):
            steps = plan.steps.get(c, full[c])
            seconds = plan.finish_s[c] if c in plan.finish_s else system.client_seconds(c, steps)
            flight = Flight(
                c, slot, now.round, host.clock, host.clock + seconds, steps, host.clients[c].num_samples
            )
            if c in plan.dropped_out:
                flight.error = "dropped out mid-round (model.system.dropout)"
            elif c in failed:
                flight.error = error
            self.flights.append(flight)
        return plan

    # ------------------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        """The schedule's own state for the checkpoint (the clock is the engine's; default: none)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (default: nothing to restore)."""
        return None


class Rounds(Schedule):
    """Synchronous rounds: the cohort starts together on the current model and the server waits for all of it.

    :meth:`dispatch`: wait for a client to come online (a day/night cycle), draw the cohort among the clients
    online (``ceil((1 + r) K)`` with over-selection) and :meth:`send` it: the system model's plan says who
    trains for how many steps, and their uploads stream into the round's aggregator as they are computed (a
    synchronous round aggregates all of them: no upload waits for its arrival). The round then consumes every
    arrival of the cohort, which only advances the clock; its mid-round dropouts are failed clients; the
    round is one unit of the failure streak, then the server step (or the skip of a round without uploads).

    Attributes:
        plan: The system model's plan of the round being run (who trains, for how many steps, how long).
        start_s: When the round's cohort was dispatched (after waiting for a client to come online).
    """

    plan: RoundPlan
    start_s: float

    def dispatch(self, now: StepState) -> None:
        host = self.host
        system = host.system
        host.clock = self.start_s = system.next_online_s(host.clock)  # a day/night cycle: wait for one online
        online = self.online(now.round)
        count = system.sample_count(host.cohort, len(online))
        self.plan = plan = self.send(now, now.round, online, count, now.agg, now.result)
        plan.wait_s = self.start_s - now.start_s
        now.result.info.sampled = list(plan.sampled)

    def enough(self, now: StepState) -> bool:
        return not self.flights  # every arrival of the cohort

    def consume(self, now: StepState, arrival: Flight) -> None:
        """Nothing but the clock: the arrival's upload is in the round's aggregator already."""

    def close(self, now: StepState) -> None:
        """The round lasts the plan's duration (past its last arrival: until the deadline a late client
        missed, or a dropped straggler's finish); its dropouts are failed clients; the round is one unit of
        the failure streak (a round without any work, every client late or none online, is none)."""
        host, plan, result = self.host, self.plan, now.result
        host.clock = max(host.clock, self.start_s + plan.duration_s)
        self._dropouts(now.round, plan, result)
        if result.info.aggregated or result.failed:
            host.count_failures(f"round {now.round}", not result.info.aggregated, result.error)

    def stepped(self, now: StepState) -> Stepped:
        plan = self.plan
        sim = SimulatedTime(
            round_s=plan.wait_s + plan.duration_s,
            time_s=self.host.clock,
            online=plan.online,
            late=len(plan.late),
            partial=len(plan.partial),
            discarded=len(plan.discarded),
            dropped_out=len(plan.dropped_out),
        )
        return Stepped(
            now.result, sim, dict(plan.steps), list(plan.late), list(plan.partial), list(plan.dropped_out)
        )

    def _dropouts(self, round: int, plan: RoundPlan, result: RoundResult) -> None:
        """The plan's mid-round dropouts are failed clients of the round (after the processes' exchange: every
        process adds the same); why a round has no work to aggregate."""
        if not plan.sampled:
            result.error = "no client was online when the round sampled"
            return
        if not plan.steps and not plan.dropped_out:
            result.error = "every sampled client was late (model.round_policy.policy=drop)"
        if not plan.dropped_out:
            return
        result.failed = sorted(result.failed + plan.dropped_out)
        result.error = result.error or f"client {plan.dropped_out[0]}: dropped out mid-round (model.system)"
        log.debug("round %d: clients %s dropped out mid-round", round, plan.dropped_out)


__all__ = [
    "Host",
    "RoundListener",
    "RoundOutcome",
    "Rounds",
    "Schedule",
    "ServerStep",
    "StepState",
    "Stepped",
    "checked_selection",
    "num_sampled",
    "one_line",
    "timed",
]
