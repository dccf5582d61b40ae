"""Asynchronous and buffered aggregation on the simulated clock: the server steps of FedBuff and FedAsync.

With an :class:`~fl_lightning.api.asynchronous.AsyncStrategy` the engine's schedule is an
:class:`AsyncSchedule`, the asynchronous case of the one event-driven server step
(:class:`~fl_lightning.engine.schedule.Schedule`):

- ``M`` clients are in flight (:class:`~fl_lightning.engine.flight.Flight`), each dispatched on the global
  model of the moment, with the version (server steps done) it started from. A dispatch is the schedule's
  shared :meth:`~fl_lightning.engine.schedule.Schedule.send`, run by the run's executor (one process,
  vectorised, a process group, Flower's grid): the clients train when they are dispatched, so each trains on
  exactly the model of its dispatch, and what the server keeps of its upload (the strategy's ``hold``) waits
  for its simulated arrival, ``dispatch + download + computation + upload`` of its device (``model.system``).
- A server step consumes the next ``K`` accepted arrivals in the clock's order: each arrival advances the
  clock, a failed one (an error, a non-finite upload, a mid-round dropout) is counted and not aggregated, and
  every arrival frees its place, which is refilled at once on the current model (the ``K``-th's after the
  server step, at the start of the next one). The consumed arrivals' ``release`` (with their staleness
  ``t - tau_k``) go through the strategy's aggregator, then the engine's server step.
- The clients in flight (their held uploads, versions, dispatch and arrival times) and the dispatch count are
  the schedule's state, kept in the checkpoint with the engine's clock, so a resume continues exactly.
"""

from __future__ import annotations

import logging
from typing import Any

from fl_lightning.api.aggregation import Aggregator
from fl_lightning.api.asynchronous import AsyncStrategy
from fl_lightning.api.types import RoundInfo, RoundResult
from fl_lightning.engine.flight import Flight
from fl_lightning.engine.record import SimulatedTime
from fl_lightning.engine.schedule import Host, Schedule, Stepped, StepState
from fl_lightning.errors import RunError
from fl_lightning.functional.tensor import module_device

log = logging.getLogger("fl_lightning")

#: Dispatch attempts without any client online (a day/night cycle, a low availability) before giving up.
MAX_WAITS = 10_000


def _kept(entries: list[Any]) -> dict:
    """A reduction that aggregates nothing: the dispatch's aggregator only keeps (and gathers) the uploads."""
    return {}


class AsyncSchedule(Schedule):
    """The server steps of an asynchronous strategy on the engine's simulated clock (module docstring).

    Args:
        host: The engine whose clock, system model and policies the schedule uses.
        strategy: The asynchronous strategy (FedBuff, FedAsync).
        in_flight: ``M``, the clients in flight.
        buffer: ``K``, the arrivals a server step consumes.
    """

    unit = "server step"
    dropouts_arrive = True

    def __init__(self, host: Host, strategy: AsyncStrategy, in_flight: int, buffer: int) -> None:
        super().__init__(host)
        self.strategy = strategy
        self.in_flight = in_flight
        self.buffer = buffer
        self.dispatches = 0  # dispatch events so far: each one's Work round and availability draw

    # ------------------------------------------------------------------------------ a server step
    def dispatch(self, now: StepState) -> None:
        """Dispatch clients until ``M`` are in flight: online ones not in flight, drawn by the strategy's
        ``select_clients`` (seeded by the dispatch count), trained now on the current model; what the server
        keeps of each upload (the strategy's ``hold``) waits in its flight for the arrival."""
        e = self.host
        free = self.in_flight - len(self.flights)
        if free <= 0:
            return
        slot = self.dispatches
        self.dispatches += 1
        online = self.online(slot)
        if not online:
            return
        hold = Aggregator(weighting="uniform", reduce=_kept)  # keeps every upload; gathered across processes
        result = RoundResult(means={}, info=RoundInfo(slot, [], [], e.num_clients))
        sent = len(self.flights)
        self.send(now, slot, online, min(free, len(online)), hold, result)
        uploads = {cid: upload for cid, upload, _ in hold.entries}
        for flight in self.flights[sent:]:
            if flight.client in uploads:
                flight.held = self.strategy.hold(e.model, uploads[flight.client], now.round)
                flight.metrics = dict(result.client_metrics.get(flight.client, {}), steps=flight.steps)
                flight.train_state = result.train_states.get(flight.client, {})
        now.result.bytes_down += result.bytes_down
        now.result.bytes_up += result.bytes_up
        now.result.vectorised += result.vectorised

    def enough(self, now: StepState) -> bool:
        return len(now.result.info.aggregated) >= self.buffer  # the next K accepted arrivals

    def next_arrival(self, now: StepState) -> Flight:
        """The next arrival; with nobody in flight (nobody could be dispatched), wait for a client to come
        online and dispatch again."""
        e = self.host
        waits = 0
        while not self.flights:
            if waits == MAX_WAITS:
                raise RunError(
                    f"server step {now.round}: no client came online in {MAX_WAITS} dispatch attempts; raise "
                    "model.system.availability (or online_fraction)"
                )
            waits += 1
            e.clock = e.system.next_online_s(e.clock)
            self.dispatch(now)
        return super().next_arrival(now)

    def consume(self, now: StepState, arrival: Flight) -> None:
        """An accepted arrival's ``release`` (with its staleness ``t - tau_k``) enters the aggregate; a failed
        one is counted (the engine's failure streak, ``M`` arrivals a round); then its place is refilled on
        the current model (the ``K``-th's after the server step, at the start of the next one)."""
        e, result = self.host, now.result
        where = f"server step {now.round}"
        if arrival.failed:
            log.warning("%s: client %d's work arrives failed: %s", where, arrival.client, arrival.error)
            error = f"client {arrival.client}: {arrival.error}"
            result.failed.append(arrival.client)
            result.error = result.error or error
            e.count_failures(where, True, error, units="arrivals", per_round=self.in_flight)
        else:
            assert arrival.held is not None
            staleness = now.round - arrival.version
            now.agg.add(
                self.strategy.release(e.model, arrival.held, staleness), arrival.num_samples, arrival.client
            )
            result.info.aggregated.append(arrival.client)
            result.client_metrics[arrival.client] = dict(arrival.metrics)
            result.train_states[arrival.client] = arrival.train_state
            e.count_failures(where, False)
        if not self.enough(now):
            self.dispatch(now)

    def close(self, now: StepState) -> None:
        """The step's clients in the order they arrived (the same on every process: each holds every
        flight)."""
        now.result.info.sampled = [f.client for f in sorted(now.consumed, key=lambda f: f.order)]
        now.result.failed.sort()

    def stepped(self, now: StepState) -> Stepped:
        accepted = [f for f in now.consumed if not f.failed]
        staleness = [now.round - f.version for f in accepted]
        sim = SimulatedTime(
            round_s=self.host.clock - now.start_s,
            time_s=self.host.clock,
            staleness_mean=sum(staleness) / len(staleness),
            staleness_max=max(staleness),
            dispatched=now.dispatched,
            in_flight=len(self.flights),
        )
        return Stepped(now.result, sim, {f.client: f.steps for f in accepted})

    # ------------------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        """The clients in flight and the dispatch count (the clock and the failure streak are the
        engine's)."""
        return {"flights": [f.state() for f in self.flights], "dispatches": self.dispatches}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (a checkpoint's ``failed_streak`` of older versions, 0 between server
        steps, is the engine's now)."""
        device = module_device(self.host.model)
        self.flights = [Flight.from_state(f, device) for f in state["flights"]]
        self.dispatches = int(state["dispatches"])


__all__ = ["MAX_WAITS", "AsyncSchedule"]
