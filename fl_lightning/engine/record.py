"""The round record: what a round (or an asynchronous server step) did, typed.

The engine produces one :class:`RoundRecord` per round (:attr:`Engine.history
<fl_lightning.engine.round.Engine.history>`); the Lightning module logs its :meth:`~RoundRecord.scalars`
(the TensorBoard tags), evaluation fills its :attr:`~RoundRecord.metrics`, the summary totals the history
(:func:`totals`: the ``summary.json`` keys taken from the rounds) and a checkpoint keeps
:meth:`~RoundRecord.to_dict` of each (plain values, loadable with ``weights_only=True``);
:meth:`~RoundRecord.from_dict` also reads the flat dicts of checkpoints written before this class existed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: TensorBoard tag of each :class:`SimulatedTime` field (logged per round when set).
SIMULATED_TAGS = {
    "round_s": "round/sim_time_s",
    "time_s": "sim/time_s",
    "online": "round/online_clients",
    "late": "round/late_clients",
    "partial": "round/partial_clients",
    "discarded": "round/discarded_clients",
    "dropped_out": "round/dropped_out",
    "staleness_mean": "round/staleness_mean",
    "staleness_max": "round/staleness_max",
    "dispatched": "round/dispatched",
    "in_flight": "round/in_flight",
}

#: The key of each :class:`SimulatedTime` field in the flat records of older checkpoints.
_OLD_SIM_KEYS = {
    "round_s": "sim_round_s",
    "time_s": "sim_time_s",
    "online": "online_clients",
    "late": "late_clients",
    "partial": "partial_clients",
    "discarded": "discarded_clients",
    "dropped_out": "dropped_out",
    "staleness_mean": "staleness_mean",
    "staleness_max": "staleness_max",
    "dispatched": "dispatched",
    "in_flight": "in_flight",
}


@dataclass
class SimulatedTime:
    """A round on the simulated clock (``model.system``, or an asynchronous strategy's server step).

    Attributes:
        round_s: The round's simulated seconds (a wait for a client to come online included).
        time_s: The clock at the round's end (the run's simulated time so far).
        online: Clients online when the round sampled (None: an asynchronous step, which dispatches).
        late: Sampled clients that missed the deadline (``model.round_policy.deadline_s``).
        partial: Late clients whose partial work was used (``policy: partial``).
        discarded: Clients whose work was not used (late under ``policy: drop``, over-selection's extras).
        dropped_out: Clients that dropped out mid-round (counted as failed too).
        staleness_mean: Mean staleness ``t - tau_k`` of a server step's arrivals (None: synchronous).
        staleness_max: Their largest staleness.
        dispatched: Clients dispatched during the server step.
        in_flight: Clients in flight after it.
    """

    round_s: float
    time_s: float
    online: int | None = None
    late: int = 0
    partial: int = 0
    discarded: int = 0
    dropped_out: int = 0
    staleness_mean: float | None = None
    staleness_max: int | None = None
    dispatched: int | None = None
    in_flight: int | None = None

    def scalars(self) -> dict[str, float]:
        """The set fields as their TensorBoard tags (:data:`SIMULATED_TAGS`)."""
        values = dataclasses.asdict(self)
        return {tag: float(values[k]) for k, tag in SIMULATED_TAGS.items() if values[k] is not None}


@dataclass
class RoundRecord:
    """One round (0-based) or asynchronous server step, as the engine ran it.

    Attributes:
        round: The round (an asynchronous strategy: the server step), 0-based.
        clients: Clients sampled (an asynchronous step: the arrivals it consumed).
        failed: Clients excluded as failed (an error, a non-finite upload, a mid-round dropout).
        bytes_down: Bytes the server sent in the round.
        bytes_up: Bytes the clients uploaded.
        time_s: The round's wall-clock seconds.
        client_lr: The clients' learning rate in the round (after ``model.lr_decay``).
        skipped: No upload was aggregated (the global model is unchanged).
        aggregated: Clients whose upload was aggregated.
        sampled: The sampled clients' ids (empty in records read from checkpoints that did not keep them).
        failed_ids: The failed clients' ids (likewise).
        late_ids, partial_ids, dropped_ids: With a system model, the ids of the clients that were late (their
            work dropped), ran partial work, dropped out mid-round (the per-client table's counts).
        client_steps: The local steps each aggregated client ran (``{client: steps}``).
        train: The clients' training metrics of the round, merged by state (``train_loss``, ``train_acc``).
        sim: The simulated clock's view of the round (None: no simulated clock).
        strategy: The strategy's scalars after the round (``round_metrics``, e.g. ``privacy/epsilon``).
        vectorize: How ``model.runtime.vectorize`` ran (``vectorize/*`` scalars).
        vectorised_clients: Clients that trained in a vectorised group (None: ``model.runtime.vectorize``
            off).
        peak_memory_gb: Peak device memory of the round (CUDA only).
        metrics: Evaluations after the round, filled in by whoever ran them: ``global/<m>`` (and per group
            ``global/group<g>/<m>``), ``global_train/<m>``, ``personal/<m>``.
        client_held_state: The clients' state stayed on their (Flower) nodes, not in this process's store.
        this_run: Done by this invocation (False: restored from the checkpoint resumed from).
    """

    round: int
    clients: int
    failed: int
    bytes_down: int
    bytes_up: int
    time_s: float
    client_lr: float = 0.0
    skipped: bool = False
    aggregated: int = 0
    sampled: list[int] = field(default_factory=list)
    failed_ids: list[int] = field(default_factory=list)
    late_ids: list[int] = field(default_factory=list)
    partial_ids: list[int] = field(default_factory=list)
    dropped_ids: list[int] = field(default_factory=list)
    client_steps: dict[int, int] = field(default_factory=dict)
    train: dict[str, float] = field(default_factory=dict)
    sim: SimulatedTime | None = None
    strategy: dict[str, float] = field(default_factory=dict)
    vectorize: dict[str, float] = field(default_factory=dict)
    vectorised_clients: int | None = None
    peak_memory_gb: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    client_held_state: bool = False
    this_run: bool = True

    def scalars(self) -> dict[str, float]:
        """The round's TensorBoard scalars (logged at step = rounds done): ``round/*``, ``sim/time_s``, the
        strategy's and ``vectorize/*`` scalars and ``train/*`` (not :attr:`metrics`, which their evaluations
        log themselves)."""
        out = {
            "round/time_s": float(self.time_s),
            "round/bytes_down": float(self.bytes_down),
            "round/bytes_up": float(self.bytes_up),
            "round/clients": float(self.clients),
            "round/failed_clients": float(self.failed),
            "round/client_lr": float(self.client_lr),
        }
        if self.peak_memory_gb is not None:
            out["round/peak_memory_gb"] = float(self.peak_memory_gb)
        if self.vectorised_clients is not None:
            out["round/vectorised_clients"] = float(self.vectorised_clients)
        out.update(self.vectorize)
        if self.sim is not None:
            out.update(self.sim.scalars())
            if self.client_steps:
                out["round/local_steps"] = sum(self.client_steps.values()) / len(self.client_steps)
        out.update(self.strategy)
        out.update({f"train/{k.removeprefix('train_')}": float(v) for k, v in self.train.items()})
        return out

    def to_dict(self) -> dict[str, Any]:
        """Plain values for a checkpoint (:meth:`from_dict` reads them back)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RoundRecord:
        """A record from :meth:`to_dict`, or from the flat dict of a checkpoint written before this class
        (``sim_time_s``, ``train_loss``, ``global/acc``, ... as top-level keys)."""
        if "train" in data and "metrics" in data:
            values = dict(data)
            sim = values.pop("sim", None)
            names = {f.name for f in dataclasses.fields(cls)}
            kept = {k: v for k, v in values.items() if k in names}
            return cls(**kept, sim=None if sim is None else SimulatedTime(**sim))
        return _from_flat(cls, data)


def _from_flat(cls: type[RoundRecord], data: Mapping[str, Any]) -> RoundRecord:
    """A record from an older checkpoint's flat dict."""
    sim = None
    if "sim_time_s" in data:
        sim_values = {k: data[old] for k, old in _OLD_SIM_KEYS.items() if old in data}
        sim = SimulatedTime(**sim_values)
    known = {"round", "clients", "failed", "bytes_down", "bytes_up", "time_s", "client_lr", "skipped"}
    known |= {"strategy", "vectorize", "vectorised_clients", "peak_memory_gb", "client_steps"}
    known |= {"client_held_state", "this_run"} | set(_OLD_SIM_KEYS.values())
    train = {k: float(v) for k, v in data.items() if k.startswith("train_")}
    metrics = {k: float(v) for k, v in data.items() if k not in known and k not in train and "/" in k}
    steps = {int(c): int(s) for c, s in (data.get("client_steps") or {}).items()}
    return cls(
        round=int(data["round"]),
        clients=int(data["clients"]),
        failed=int(data.get("failed", 0)),
        bytes_down=int(data["bytes_down"]),
        bytes_up=int(data["bytes_up"]),
        time_s=float(data["time_s"]),
        client_lr=float(data.get("client_lr", 0.0)),
        skipped=bool(data.get("skipped", False)),
        aggregated=0 if data.get("skipped") else int(data["clients"]) - int(data.get("failed", 0)),
        client_steps=steps,
        train=train,
        sim=sim,
        strategy=dict(data.get("strategy") or {}),
        vectorize=dict(data.get("vectorize") or {}),
        vectorised_clients=data.get("vectorised_clients"),
        peak_memory_gb=data.get("peak_memory_gb"),
        metrics=metrics,
        client_held_state=bool(data.get("client_held_state", False)),
        this_run=bool(data.get("this_run", True)),
    )


def totals(history: Iterable[RoundRecord]) -> dict[str, Any]:
    """What ``summary.json`` takes from the rounds: their count (and this invocation's), the mean wall
    seconds per round, the bytes down/up/total, the failed clients, and with a simulated clock the simulated
    time and the late, partial, discarded and dropped-out clients over all rounds."""
    rounds = list(history)
    out: dict[str, Any] = {
        "rounds": len(rounds),
        "rounds_this_run": sum(1 for r in rounds if r.this_run),
        "mean_round_s": sum(r.time_s for r in rounds) / len(rounds) if rounds else 0.0,
        "bytes_down": sum(r.bytes_down for r in rounds),
        "bytes_up": sum(r.bytes_up for r in rounds),
        "failed_clients": sum(r.failed for r in rounds),
    }
    out["bytes_total"] = out["bytes_down"] + out["bytes_up"]
    clocked = [r.sim for r in rounds if r.sim is not None]
    if clocked:
        out["sim_time_s"] = clocked[-1].time_s
        for key in ("late", "partial", "discarded"):
            out[f"{key}_clients"] = sum(getattr(s, key) for s in clocked)
        out["dropped_out"] = sum(s.dropped_out for s in clocked)
    return out


__all__ = ["SIMULATED_TAGS", "RoundRecord", "SimulatedTime", "totals"]
