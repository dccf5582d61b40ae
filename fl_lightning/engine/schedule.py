"""How rounds are scheduled on the engine's clock, and what every schedule shares.

The engine (:class:`~fl_lightning.engine.round.Engine`) runs each round or server step through its
:class:`Schedule`; a schedule decides only *who* trains *when* and which arrivals a server step consumes,
and uses the engine's policies for everything else (:class:`Host`): the online draw of clients, the local work
through the executor with the attack and the failure policy, the dropout policy, the server step (aggregate,
``process_aggregate``, ``server_update``, the optimizer's step) or the skip of a round without uploads. Two
schedules:

- :class:`Rounds`: a synchronous round. The cohort is drawn among the clients online when the round starts,
  every client of it starts together on the current model, and the server waits for all ``K`` (the system
  model's plan says who is late, cut or dropped, and how long the round lasts);
- :class:`~fl_lightning.engine.asynchronous.AsyncSchedule`: clients in flight, a server step consumes the
  next ``K`` arrivals (FedBuff, FedAsync).

Without ``model.system`` the clock is the null system model (every client online, instantaneous, never
dropping out), so a round is the same sequence with or without one.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from fl_lightning.api.aggregation import Aggregator
from fl_lightning.api.types import ClientResult, RoundInfo, RoundResult
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

    def server_step(self, round: int, agg: Aggregator, result: RoundResult, step: ServerStep) -> None: ...

    def check_round(self, round: int) -> None: ...


class Schedule:
    """Who trains when, and which arrivals a server step consumes (module docstring).

    Args:
        host: The engine whose clock, system model and policies the schedule uses.
    """

    #: How the schedule's unit is named in messages and progress lines ("round", "server step").
    unit = "round"

    def __init__(self, host: Host) -> None:
        self.host = host

    def step(self, round: int, step: ServerStep, listener: RoundListener) -> Stepped:
        """Run round (or server step) ``round``: train, aggregate, take (or skip) the server step."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """The schedule's own state for the checkpoint (the clock is the engine's; default: none)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""


class Rounds(Schedule):
    """Synchronous rounds: the cohort starts together and the server waits for all ``K`` of it.

    A round: wait for a client to come online (a day/night cycle), draw the cohort among the clients online
    (``ceil((1 + r) K)`` with over-selection), let the strategy refuse the round, ask the system model's plan
    who trains for how many steps, run their local work (streamed into the aggregator as it comes), count
    the plan's mid-round dropouts as failed clients, then the server step (or the skip of a round without
    uploads); the clock advances by the plan's duration.
    """

    def step(self, round: int, step: ServerStep, listener: RoundListener) -> Stepped:
        host = self.host
        system = host.system
        start = system.next_online_s(host.clock)  # a day/night cycle: wait for a client to be online
        online = host.eligible(system.online(round, start))
        sampled = host.draw(online, system.sample_count(host.cohort, len(online)), round)
        host.check_round(round)  # e.g. resumed past a privacy budget: nothing has run
        plan = system.plan(round, sampled, host.cohort)
        plan.online, plan.wait_s = len(online), start - host.clock
        listener.round_start(round, sampled)
        agg = host.strategy.aggregator()
        result = RoundResult(means={}, info=RoundInfo(round, sampled, [], host.num_clients))
        full = system.setup.full_steps
        cut = {c: n for c, n in plan.steps.items() if n != full[c]}  # partial work; the rest runs in full
        host.collect(round, host.work(round, plan.trained, steps=cut or None), agg, result, listener)
        self._dropouts(round, plan, result)
        host.server_step(round, agg, result, step)
        host.clock = start + plan.duration_s
        sim = SimulatedTime(
            round_s=plan.wait_s + plan.duration_s,
            time_s=host.clock,
            online=plan.online,
            late=len(plan.late),
            partial=len(plan.partial),
            discarded=len(plan.discarded),
            dropped_out=len(plan.dropped_out),
        )
        return Stepped(
            result, sim, dict(plan.steps), list(plan.late), list(plan.partial), list(plan.dropped_out)
        )

    def _dropouts(self, round: int, plan: RoundPlan, result: RoundResult) -> None:
        """The plan's mid-round dropouts are failed clients of the round (after the processes' exchange: every
        process adds the same), under the failure policy; why a round has no work to aggregate."""
        if not plan.sampled:
            result.error = "no client was online when the round sampled"
            return
        if not plan.steps and not plan.dropped_out:
            result.error = "every sampled client was late (model.round_policy.policy=drop)"
        if not plan.dropped_out:
            return
        self.host.refuse_dropout(f"round {round}", plan.dropped_out[0])
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
    "Stepped",
    "checked_selection",
    "num_sampled",
    "one_line",
    "timed",
]
