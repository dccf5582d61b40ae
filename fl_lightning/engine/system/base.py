"""The client system model: devices on a simulated clock, and how a synchronous round applies its policy.

A :class:`SystemModel` (``model.system``; off by default) gives every client a device (:meth:`profiles`: its
compute speed, download and upload bandwidth, availability, mid-round dropout) and decides each synchronous
round before any client trains (:meth:`plan`): which sampled clients train, how many local steps each runs
(cut to what fits a deadline under ``policy: partial``: the round's
:class:`~fl_lightning.engine.system.policy.RoundPolicy`, ``model.round_policy``), who drops out, and how long
the round lasts on the simulated clock. The engine owns the clock and hands the executors exactly these
steps, so a policy holds the same under one process, vectorised clients, several processes and Flower.

Subclasses say where the devices come from: :class:`~fl_lightning.engine.system.devices.Devices` (seeded
distributions), :class:`~fl_lightning.engine.system.trace.Trace` (a CSV file),
:class:`~fl_lightning.engine.system.stragglers.Stragglers` (FedProx's stragglers, Li et al., MLSys 2020,
Sec. 5.2).
"""

from __future__ import annotations

import math

import torch

from fl_lightning.engine.system.plan import RoundPlan
from fl_lightning.engine.system.policy import RoundPolicy
from fl_lightning.engine.system.profiles import Profiles
from fl_lightning.engine.system.setup import Setup
from fl_lightning.errors import ConfigError, check_number
from fl_lightning.functional.system import (
    bernoulli,
    client_seconds,
    cycle_online,
    first_to_finish,
    next_online,
    over_selected,
    steps_within,
    transfer_seconds,
)
from fl_lightning.functional.tensor import derive_seed

#: Seed streams of the system model's draws (``derive_seed(seed, stream, ...)``).
DEVICE_STREAM, ONLINE_STREAM, DROPOUT_STREAM = 0x5D1, 0x5D2, 0x5D3


class SystemModel:
    """How clients behave as devices, and what a synchronous round does with the slow ones.

    A client's time for a round is download + computation + upload (FedScale's model, Lai et al., ICML 2022):

    .. math:: t_k = \\frac{8 B}{10^6 d_k} + \\frac{s_k b}{v_k} + \\frac{8 B}{10^6 u_k}

    (``B`` the global model's communicated bytes, ``d_k``/``u_k`` Mbit/s, ``s_k`` local steps of batch ``b``,
    ``v_k`` samples/s); a synchronous round lasts as long as its slowest accepted client. With a deadline
    ``D`` (``model.round_policy.deadline_s``) a client with ``t_k > D`` is dropped (``policy: drop``) or runs
    the steps that fit, ``floor((D - down - up) v_k / b)`` (``policy: partial``; dropped if none fits); the
    round then lasts until ``D``. With over-selection ``r`` the round samples ``ceil((1 + r) K)`` clients and
    keeps the first ``K`` to finish (Bonawitz et al., MLSys 2019, Sec. 2.2), lasting until the ``K``-th
    arrival. Clients offline when the round samples are not sampled; a client that drops out mid-round is a
    failed client of the round (the engine's failure policy).

    The policy (``deadline_s``, ``policy``, ``over_selection``: a
    :class:`~fl_lightning.engine.system.policy.RoundPolicy`, ``model.round_policy``) is one object apart from
    the devices; :meth:`bind` hands it over with the run, and :attr:`round_policy` is the policy of the run
    bound (the default policy before).
    """

    def __init__(self) -> None:
        #: The round's policy (``model.round_policy``), given with the run by :meth:`bind`.
        self.round_policy = RoundPolicy()
        self._setup: Setup | None = None
        self._profiles: Profiles | None = None
        self._down: list[float] = []
        self._up: list[float] = []

    #: How the config spells this object (messages name ``model.system.<option>``).
    field = "model.system"

    #: Whether the model decides a synchronous round's work itself (its own :meth:`plan`, e.g.
    #: :class:`~fl_lightning.engine.system.stragglers.Stragglers`): an asynchronous strategy, which has no
    #: rounds, cannot run it.
    plans_rounds = False

    #: Whether the model runs a simulated clock (the null model, :class:`Instant`, does not: a run without
    #: ``model.system`` records no simulated time).
    clocked = True

    # ------------------------------------------------------------------------------ devices
    def profiles(self, num_clients: int, seed: int) -> Profiles:
        """Every client's device, a function of ``(seed, client)``; subclasses say where they come from."""
        raise NotImplementedError

    def bind(self, setup: Setup, round_policy: RoundPolicy | None = None) -> None:
        """Draw (or read) the devices for ``setup``'s run, take its ``round_policy`` (None: the default) and
        check the configuration against them.

        Raises:
            ConfigError: One line, before round 1, e.g. a deadline no client can meet.
        """
        self.round_policy = RoundPolicy() if round_policy is None else round_policy
        self._setup = setup
        self._profiles = p = self.profiles(setup.num_clients, setup.seed)
        if len(p) != setup.num_clients:
            raise ValueError(f"{type(self).__name__}.profiles gave {len(p)} devices for {setup.num_clients}")
        self._down = [transfer_seconds(setup.bytes_down, d) for d in p.download_mbps]
        self._up = [transfer_seconds(setup.bytes_up, u) for u in p.upload_mbps]
        self.check_deadline()

    @property
    def setup(self) -> Setup:
        assert self._setup is not None, "bind() the system model first"
        return self._setup

    @property
    def devices(self) -> Profiles:
        assert self._profiles is not None, "bind() the system model first"
        return self._profiles

    def client_seconds(self, client: int, steps: int) -> float:
        """Client ``client``'s time for ``steps`` local steps: download + computation + upload."""
        speed = self.devices.speed[client]
        return client_seconds(steps, self.setup.batch_size, speed, self._down[client], self._up[client])

    def steps_within(self, client: int, budget_s: float) -> int:
        """The local steps of ``client`` that fit in ``budget_s`` with its download and upload (0: none)."""
        speed = self.devices.speed[client]
        return steps_within(budget_s, self.setup.batch_size, speed, self._down[client], self._up[client])

    def check_deadline(self) -> None:
        """Refuse a deadline that no client can meet (with ``partial``: not even one step), in one line."""
        policy = self.round_policy
        deadline = policy.deadline_s
        if deadline is None:
            return
        s = self.setup
        partial = policy.policy == "partial"
        need = {c: self.client_seconds(c, 1 if partial else s.full_steps[c]) for c in range(s.num_clients)}
        fastest = min(need, key=lambda c: (need[c], c))
        if need[fastest] <= deadline:
            return
        steps = 1 if partial else s.full_steps[fastest]
        work = "one local step" if partial else f"{steps} local steps"
        compute = need[fastest] - self._down[fastest] - self._up[fastest]
        fix = (
            "raise it"
            if partial
            else f"raise it, or set {policy.field}.policy=partial (clients run the steps that fit)"
        )
        raise ConfigError(
            f"{policy.field}.deadline_s={deadline:g} is shorter than every client's round: the fastest, "
            f"client {fastest}, needs {need[fastest]:.3g} s ({self._down[fastest]:.3g} s download, "
            f"{compute:.3g} s for "
            f"{work} of {s.batch_size} samples at {self.devices.speed[fastest]:.3g} samples/s, "
            f"{self._up[fastest]:.3g} s upload); {fix}"
        )

    def idle(self, cohort: int) -> list[str]:
        """Why settings of the round's policy cannot act in this run (none: each can): over-selection when
        every round samples every client, a deadline above every client's full round (no client is ever
        late). The engine logs each once, before round 1."""
        s, policy = self.setup, self.round_policy
        out = []
        if policy.over_selection > 0 and cohort >= s.num_clients:
            out.append(
                f"{policy.field}.over_selection={policy.over_selection:g} cannot act: every round samples "
                f"all {s.num_clients} clients (lower model.participation or model.clients_per_round to use "
                "it)"
            )
        if policy.deadline_s is not None:
            need = {c: self.client_seconds(c, s.full_steps[c]) for c in range(s.num_clients)}
            slowest = max(need, key=lambda c: (need[c], -c))
            if need[slowest] <= policy.deadline_s:
                out.append(
                    f"{policy.field}.deadline_s={policy.deadline_s:g} cannot act: every client's full round "
                    f"fits (the slowest, client {slowest}, needs {need[slowest]:.3g} s), so no client is "
                    "ever late; lower it to cut stragglers"
                )
        return out

    # ------------------------------------------------------------------------------ availability
    def online(self, slot: int, time_s: float) -> list[int]:
        """The clients online at ``time_s`` (their day/night cycle) and in draw ``slot`` (each online with its
        availability, drawn from a generator seeded by ``(seed, slot)``: a synchronous round's index, or an
        asynchronous server's dispatch count), sorted."""
        p = self.devices
        n = len(p)
        clients = range(n)
        if p.cycle:
            clients = [c for c in clients if cycle_online(time_s, p.day_s, p.online_fraction, p.phase[c])]
        if any(a < 1 for a in p.availability):
            g = torch.Generator().manual_seed(derive_seed(self.setup.seed, ONLINE_STREAM, slot))
            up = bernoulli(p.availability, g)
            clients = [c for c in clients if up[c]]
        return list(clients)

    def next_online_s(self, time_s: float) -> float:
        """The first time at or after ``time_s`` at which some client's cycle has it online (``time_s``
        without a day/night cycle)."""
        p = self.devices
        if not p.cycle:
            return time_s
        return min(next_online(time_s, p.day_s, p.online_fraction, ph) for ph in p.phase)

    def dropouts(self, slot: int, clients: list[int]) -> list[int]:
        """The ``clients`` that drop out in the middle of their work in draw ``slot`` (each with its dropout
        probability, from a generator seeded by ``(seed, slot)``), sorted."""
        p = self.devices
        if not clients or all(p.dropout[c] == 0 for c in clients):
            return []
        g = torch.Generator().manual_seed(derive_seed(self.setup.seed, DROPOUT_STREAM, slot))
        drop = bernoulli([p.dropout[c] for c in clients], g)
        return sorted(c for c, d in zip(clients, drop, strict=True) if d)

    def sample_count(self, count: int, online: int) -> int:
        """Clients a round samples to keep ``count``: ``ceil((1 + r) count)`` with over-selection, at most the
        clients online."""
        r = self.round_policy.over_selection
        wanted = over_selected(count, r) if r > 0 else count
        return min(wanted, online)

    # ------------------------------------------------------------------------------ a round
    def plan(self, round: int, sampled: list[int], cohort: int) -> RoundPlan:
        """Decide round ``round`` of the ``sampled`` clients (``cohort`` = ``K``, the clients a round keeps).

        Dropouts (drawn for the round) fail; every other client's full work is timed; past the deadline a
        client is dropped or cut (``round_policy.policy``); with over-selection the first ``cohort`` to
        finish stay.
        """
        s, policy = self.setup, self.round_policy
        dropped = self.dropouts(round, sampled)
        out = set(dropped)
        steps = {c: s.full_steps[c] for c in sampled if c not in out}
        finish = {c: self.client_seconds(c, n) for c, n in steps.items()}
        late: list[int] = []
        partial: list[int] = []
        deadline = policy.deadline_s
        if deadline is not None:
            for c in sorted(steps):
                if finish[c] <= deadline:
                    continue
                fit = min(self.steps_within(c, deadline), steps[c]) if policy.policy == "partial" else 0
                if fit >= 1:
                    steps[c], finish[c] = fit, self.client_seconds(c, fit)
                    partial.append(c)
                else:
                    late.append(c)
                    del steps[c], finish[c]
        discarded: list[int] = []
        if policy.over_selection > 0 and len(steps) >= cohort:
            kept = set(first_to_finish(finish, cohort))
            discarded = sorted(c for c in steps if c not in kept)
            steps = {c: n for c, n in steps.items() if c in kept}
            finish = {c: t for c, t in finish.items() if c in kept}
            partial = [c for c in partial if c in kept]
            duration = max(finish.values())
        elif late and deadline is not None:
            duration = deadline  # the server waited for the late clients until the deadline
        else:
            duration = max(finish.values(), default=0.0)
        return RoundPlan(
            sampled=list(sampled),
            steps=dict(sorted(steps.items())),
            finish_s=dict(sorted(finish.items())),
            dropped_out=dropped,
            late=late,
            partial=partial,
            discarded=discarded,
            duration_s=duration,
        )

    # ------------------------------------------------------------------------------ reading
    def describe(self) -> str:
        """One line on the devices (spread of speed and bandwidth) for the run's log."""
        p = self.devices

        def spread(values: tuple[float, ...], unit: str) -> str:
            ordered = sorted(values)
            n = len(ordered)
            lo, mid, hi = ordered[n // 10], ordered[n // 2], ordered[-1 - n // 10]
            return f"{mid:.3g} {unit} (10%-90%: {lo:.3g}-{hi:.3g})"

        parts = [
            f"speed {spread(p.speed, 'samples/s')}",
            f"download {spread(p.download_mbps, 'Mbit/s')}",
            f"upload {spread(p.upload_mbps, 'Mbit/s')}",
        ]
        if any(a < 1 for a in p.availability):
            parts.append(f"online with probability {sum(p.availability) / len(p):.3g} on average")
        if p.cycle:
            parts.append(f"online {p.online_fraction:.0%} of every {p.day_s:g} s")
        if any(d > 0 for d in p.dropout):
            parts.append(f"dropout {sum(p.dropout) / len(p):.3g} on average")
        policy = self.round_policy
        if policy.deadline_s is not None:
            parts.append(f"deadline {policy.deadline_s:g} s ({policy.policy})")
        if policy.over_selection > 0:
            parts.append(f"over-selection {policy.over_selection:g}")
        return f"{type(self).__name__}: " + ", ".join(parts)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.round_policy!r})"


def check_probability(value: object, field: str) -> None:
    """A probability in [0, 1], or one ``ConfigError`` line naming ``field``."""
    check_number(value, field, low=0, high=1, hint="(a probability)")


class Instant(SystemModel):
    """The null system model, a run without ``model.system``: every client online, its work instantaneous
    (infinitely fast, no transfer time), no dropout, no deadline; the rounds run the same sequence as with a
    system model, and the clock stays at 0."""

    clocked = False

    def bind(self, setup: Setup, round_policy: RoundPolicy | None = None) -> None:
        """As :meth:`SystemModel.bind`; a round policy that needs a clock (any field set) is refused."""
        super().bind(setup, round_policy)
        given = self.round_policy.given()
        if given:
            raise ConfigError(
                f"{given[0]} needs a simulated clock, which a run without model.system has not; set "
                "model.system (e.g. --model.system=Devices), or unset it"
            )

    def profiles(self, num_clients: int, seed: int) -> Profiles:
        inf = (math.inf,) * num_clients
        return Profiles(
            speed=inf,
            download_mbps=inf,
            upload_mbps=inf,
            availability=(1.0,) * num_clients,
            dropout=(0.0,) * num_clients,
        )

    def describe(self) -> str:
        return "Instant: every client online, its work instantaneous"


__all__ = ["DEVICE_STREAM", "DROPOUT_STREAM", "ONLINE_STREAM", "Instant", "SystemModel", "check_probability"]
