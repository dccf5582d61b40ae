"""Asynchronous and buffered aggregation on the simulated clock: an event-driven schedule of server steps.

With an :class:`~fl_lightning.api.asynchronous.AsyncStrategy` (FedBuff, FedAsync) the engine's
:meth:`~fl_lightning.engine.round.Engine.run_round` hands each server step to an :class:`AsyncSchedule`:

- ``M`` clients are in flight (:class:`~fl_lightning.engine.flight.Flight`), each dispatched on the global
  model of the moment, with the version (server steps done) it started from. Dispatching a set of clients is a
  :class:`~fl_lightning.engine.work.Work` like any round's, run by the run's executor (one process,
  vectorised, a process group, Flower's grid): the clients train when they are dispatched, so each trains on
  exactly the model of its dispatch, and what the server keeps of its upload (the strategy's ``hold``) waits
  for its simulated arrival, ``dispatch + download + computation + upload`` of its device (``model.system``).
- A server step consumes the next ``K`` arrivals in the clock's order (ties: the lower client id): each
  arrival advances the clock, a failed one (an error, a non-finite upload, a mid-round dropout) is counted
  and not aggregated, and every arrival frees its place, which is refilled at once on the current model (the
  ``K``-th's after the server step, at the start of the next one). The consumed arrivals' ``release`` (with
  their staleness ``t - tau_k``) go through the strategy's aggregator, ``process_aggregate``,
  ``server_update`` and the server optimizer's step.
- The clients in flight (their held uploads, versions, dispatch and arrival times), the clock and the
  dispatch count are the schedule's state, kept in the checkpoint, so a resume continues exactly.

A synchronous round is the special case where every client starts together and ``K`` is the cohort
(:class:`~fl_lightning.engine.schedule.Rounds`, which streams its uploads into the aggregator instead of
holding them); both schedules use the engine's one online draw, dropout policy and server step
(:class:`~fl_lightning.engine.schedule.Host`).
"""

from __future__ import annotations

import logging
from typing import Any

from fl_lightning.api.aggregation import Aggregator
from fl_lightning.api.asynchronous import AsyncStrategy
from fl_lightning.api.types import RoundInfo, RoundResult
from fl_lightning.engine.flight import Flight
from fl_lightning.engine.record import SimulatedTime
from fl_lightning.engine.schedule import Host, RoundListener, Schedule, ServerStep, Stepped
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

    def __init__(self, host: Host, strategy: AsyncStrategy, in_flight: int, buffer: int) -> None:
        super().__init__(host)
        self.strategy = strategy
        self.in_flight = in_flight
        self.buffer = buffer
        self.flights: list[Flight] = []
        self.dispatches = 0  # dispatch events so far: each one's Work round and availability draw
        self.failed_streak = 0  # consecutive failed arrivals

    # ------------------------------------------------------------------------------ a server step
    def step(self, round: int, step: ServerStep, listener: RoundListener) -> Stepped:
        """Server step ``round``: refill, consume the next ``K`` arrivals, aggregate, step."""
        e = self.host
        e.check_round(round)
        start = e.clock
        traffic = {"down": 0, "up": 0, "dispatched": 0, "vectorised": 0}
        self._fill(round, listener, traffic)
        accepted: list[Flight] = []
        failed: list[Flight] = []
        waits = 0
        while len(accepted) < self.buffer:
            if not self.flights:  # nobody in flight and nobody could be dispatched: wait for a client
                waits += 1
                if waits > MAX_WAITS:
                    raise RunError(
                        f"server step {round}: no client came online in {MAX_WAITS} dispatch attempts; raise "
                        "model.system.availability (or online_fraction)"
                    )
                e.clock = e.system.next_online_s(e.clock)
                self._fill(round, listener, traffic)
                continue
            arrival = min(self.flights, key=lambda f: f.order)
            self.flights.remove(arrival)
            e.clock = max(e.clock, arrival.arrival_s)
            if arrival.held is None:
                failed.append(arrival)
                self._failed(round, arrival)
            else:
                accepted.append(arrival)
                self.failed_streak = 0
            if len(accepted) < self.buffer:
                self._fill(round, listener, traffic)
        result = self._server_step(round, step, accepted, failed)
        result.bytes_down, result.bytes_up = traffic["down"], traffic["up"]
        result.vectorised = traffic["vectorised"]
        if failed:
            first = failed[0]
            result.error = f"client {first.client}: {first.error}"
        staleness = [round - f.version for f in accepted]
        sim = SimulatedTime(
            round_s=e.clock - start,
            time_s=e.clock,
            staleness_mean=sum(staleness) / len(staleness),
            staleness_max=max(staleness),
            dispatched=traffic["dispatched"],
            in_flight=len(self.flights),
        )
        return Stepped(result, sim, {f.client: f.steps for f in accepted})

    def _server_step(
        self, round: int, step: ServerStep, accepted: list[Flight], failed: list[Flight]
    ) -> RoundResult:
        """The consumed arrivals' ``release`` (with their staleness) into the aggregator, then the engine's
        server step (the same on every process: every process holds every flight)."""
        e = self.host
        strategy = self.strategy
        agg = strategy.aggregator()
        for f in accepted:  # in the order they arrived
            assert f.held is not None
            agg.add(strategy.release(e.model, f.held, round - f.version), f.num_samples, f.client)
        sampled = [f.client for f in sorted(accepted + failed, key=lambda f: f.order)]
        result = RoundResult(
            means={},
            info=RoundInfo(round, sampled, [f.client for f in accepted], e.num_clients),
            client_metrics={f.client: dict(f.metrics) for f in accepted},
            failed=sorted(f.client for f in failed),
            train_states={f.client: f.train_state for f in accepted},
        )
        e.server_step(round, agg, result, step)
        return result

    def _failed(self, round: int, arrival: Flight) -> None:
        """Count a failed arrival; ``max_failed_rounds * M`` consecutive ones stop the run."""
        e = self.host
        self.failed_streak += 1
        log.warning(
            "server step %d: client %d's work arrives failed: %s", round, arrival.client, arrival.error
        )
        limit = e.config.max_failed_rounds * self.in_flight
        if self.failed_streak >= limit:
            raise RunError(
                f"server step {round}: {self.failed_streak} consecutive arrivals failed (last: client "
                f"{arrival.client}: {arrival.error}); see the warnings above, fix the cause or raise "
                f"model.max_failed_rounds={e.config.max_failed_rounds} (the limit is it times the "
                f"{self.in_flight} clients in flight)"
            )

    # ------------------------------------------------------------------------------ dispatch
    def _fill(self, round: int, listener: RoundListener, traffic: dict[str, int]) -> None:
        """Dispatch clients until ``M`` are in flight: online ones not in flight, drawn by the strategy's
        ``select_clients`` (seeded by the dispatch count), trained now on the current model (a ``Work``
        through the run's executor), each with its arrival time on the clock."""
        e = self.host
        free = self.in_flight - len(self.flights)
        if free <= 0:
            return
        system = e.system
        slot = self.dispatches
        self.dispatches += 1
        busy = {f.client for f in self.flights}
        online = [c for c in e.eligible(system.online(slot, e.clock)) if c not in busy]
        if not online:
            return
        chosen = e.draw(online, min(free, len(online)), slot)
        dropped = set(system.dropouts(slot, chosen))
        if dropped:
            e.refuse_dropout(f"server step {round}", min(dropped))
        trained = [c for c in chosen if c not in dropped]
        hold = Aggregator(weighting="uniform", reduce=_kept)  # keeps every upload; gathered across processes
        result = RoundResult(means={}, info=RoundInfo(slot, trained, [], e.num_clients))
        if trained:
            listener.round_start(round, trained)
            work = e.work(slot, trained)
            e.collect(round, work, hold, result, listener)
        uploads = {cid: upload for cid, upload, _ in hold.entries}
        traffic["down"] += result.bytes_down
        traffic["up"] += result.bytes_up
        traffic["dispatched"] += len(chosen)
        traffic["vectorised"] += result.vectorised
        setup = system.setup
        for cid in chosen:
            steps = setup.full_steps[cid]
            arrival = e.clock + system.client_seconds(cid, steps)
            flight = Flight(cid, slot, round, e.clock, arrival, steps, e.clients[cid].num_samples)
            if cid in uploads:
                flight.held = self.strategy.hold(e.model, uploads[cid], round)
                flight.metrics = dict(result.client_metrics.get(cid, {}), steps=steps)
                flight.train_state = result.train_states.get(cid, {})
            elif cid in dropped:
                flight.error = "dropped out mid-round (model.system.dropout)"
            else:
                flight.error = result.error.split(": ", 1)[-1] if result.error else "failed"
            self.flights.append(flight)

    # ------------------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        """The clients in flight, the dispatch count and the failure streak (the clock is the engine's)."""
        return {
            "flights": [f.state() for f in self.flights],
            "dispatches": self.dispatches,
            "failed_streak": self.failed_streak,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        device = module_device(self.host.model)
        self.flights = [Flight.from_state(f, device) for f in state["flights"]]
        self.dispatches = int(state["dispatches"])
        self.failed_streak = int(state["failed_streak"])


__all__ = ["MAX_WAITS", "AsyncSchedule"]
