"""What a run leaves beside ``summary.json``: its per-round history as ``curves.csv`` and its per-client table
as ``clients.csv`` (DESIGN.md, "What a run gives back").

The engine's round records are read in one place, :func:`read_history`; every table and summary number
built here starts from its plain rows, so a change of the record's form is one edit.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fl_lightning.engine.record import RoundRecord
from fl_lightning.functional.outcomes import SPREAD_KEYS, client_spread

CURVES_FILE = "curves.csv"
CLIENTS_FILE = "clients.csv"

#: The first columns of ``curves.csv``, in order; metric columns (``global/acc``, ``personal/acc``,
#: ``clients/global_acc_p10``, ``train/loss``, ...) follow, sorted.
CURVE_CLOCK = (
    "round",
    "sim_time_s",
    "wall_time_s",
    "bytes_down",
    "bytes_up",
    "bytes_total",
)

#: The per-client counts of ``clients.csv`` from the rounds' fates.
FATES = ("sampled", "trained", "steps", "failed", "late", "partial", "dropped")


@dataclass
class RoundRow:
    """One round of the history as plain values.

    Attributes:
        round: Rounds done after it (the server step; the x-axis of every logged scalar).
        time_s: Its wall time in seconds.
        bytes_down, bytes_up: Its bytes to and from the clients.
        sim_time_s: The simulated clock at its end (None: no clock ran).
        metrics: Its scalars by TensorBoard tag (``global/acc``, ``personal/acc``, ``clients/...``,
            ``train/loss``).
        fates: Per client id what happened to it (``sampled``, ``steps``, ``failed``, ``late``, ``partial``,
            ``dropped``; empty when the record has none, e.g. an asynchronous server step).
    """

    round: int
    time_s: float
    bytes_down: int
    bytes_up: int
    sim_time_s: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    fates: dict[str, Any] = field(default_factory=dict)


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def read_history(history: Iterable[RoundRecord]) -> list[RoundRow]:
    """The engine's round records (``FederatedModule.history``) as :class:`RoundRow` (the one reader)."""
    rows = []
    for r in history:
        metrics = {k: float(v) for k, v in r.metrics.items() if _number(v)}
        metrics.update(
            {f"train/{k.removeprefix('train_')}": float(v) for k, v in r.train.items() if _number(v)}
        )
        metrics.update({k: float(v) for k, v in r.strategy.items() if _number(v)})
        fates: dict[str, Any] = {"sampled": list(r.sampled), "steps": dict(r.client_steps)}
        fates.update(failed=list(r.failed_ids), late=list(r.late_ids), partial=list(r.partial_ids))
        fates["dropped"] = list(r.dropped_ids)
        rows.append(
            RoundRow(
                round=int(r.round) + 1,
                time_s=float(r.time_s),
                bytes_down=int(r.bytes_down),
                bytes_up=int(r.bytes_up),
                sim_time_s=None if r.sim is None else float(r.sim.time_s),
                metrics=metrics,
                fates=fates,
            )
        )
    return rows


def curves(rows: Sequence[RoundRow]) -> tuple[list[str], list[dict[str, Any]]]:
    """``curves.csv``'s header and rows: per round the clocks (rounds done, simulated and cumulative wall
    time in seconds), the cumulative bytes and every metric of the round ("" where not evaluated)."""
    names = sorted({k for r in rows for k in r.metrics})
    out, wall, down, up = [], 0.0, 0, 0
    for r in rows:
        wall += r.time_s
        down += r.bytes_down
        up += r.bytes_up
        row: dict[str, Any] = {
            "round": r.round,
            "sim_time_s": "" if r.sim_time_s is None else r.sim_time_s,
            "wall_time_s": wall,
            "bytes_down": down,
            "bytes_up": up,
            "bytes_total": down + up,
        }
        row.update({k: r.metrics.get(k, "") for k in names})
        out.append(row)
    return [*CURVE_CLOCK, *names], out


def ledger(rows: Sequence[RoundRow], num_clients: int) -> dict[int, dict[str, int]]:
    """Per client the rounds it was sampled in, trained in (its work aggregated or held), the local steps
    it ran in all, and the rounds it failed in, was late in (its work dropped), ran partial work in, dropped
    out of."""
    out = {c: dict.fromkeys(FATES, 0) for c in range(num_clients)}
    for r in rows:
        f = r.fates
        for key, name in (
            ("sampled", "sampled"),
            ("failed", "failed"),
            ("late", "late"),
            ("partial", "partial"),
        ):
            for c in f.get(key, ()):
                out[int(c)][name] += 1
        for c in f.get("dropped", ()):
            out[int(c)]["dropped"] += 1
        for c, steps in (f.get("steps") or {}).items():
            out[int(c)]["trained"] += 1
            out[int(c)]["steps"] += int(steps)
    return out


def spread_scalars(
    prefix: str, per: Mapping[int, Mapping[str, float]], metric: str, weights: Mapping[int, float]
) -> dict[str, float]:
    """``{prefix}<metric>_<stat>`` for the :func:`~fl_lightning.functional.outcomes.client_spread` of
    ``metric`` over the clients of ``per`` (empty when none has it); ``weights``: each client's samples."""
    ids = [c for c in sorted(per) if metric in per[c]]
    if not ids:
        return {}
    spread = client_spread([per[c][metric] for c in ids], [weights.get(c, 0.0) for c in ids])
    return {f"{prefix}{metric}_{k}": v for k, v in spread.items()}


def spread_dict(scalars: Mapping[str, float], prefix: str) -> dict[str, float]:
    """The ``{stat: value}`` of :func:`spread_scalars`'s output under ``prefix`` (``n`` as an int)."""
    out = {k: scalars[f"{prefix}_{k}"] for k in SPREAD_KEYS if f"{prefix}_{k}" in scalars}
    if "n" in out:
        out["n"] = int(out["n"])
    return out


def client_mean(per: Mapping[int, Mapping[str, float]], metric: str, ids: Iterable[int]) -> float | None:
    """The uniform mean of ``metric`` over ``ids`` (None: none of them has it)."""
    vals = [per[c][metric] for c in ids if c in per and metric in per[c]]
    return sum(vals) / len(vals) if vals else None


def write_csv(path: Path, header: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> None:
    """``rows`` as a CSV file with ``header`` (floats written in full; NaN as empty)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(header), extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow(
                {k: ("" if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
            )


def outcome_fields(
    metric: str,
    global_per: Mapping[int, Mapping[str, float]],
    personal_per: Mapping[int, Mapping[str, float]] | None,
    train_per: Mapping[int, Mapping[str, float]],
    unseen: Iterable[int],
    weights: Mapping[int, float],
) -> dict[str, Any]:
    """The summary's per-client fields at the end of fit.

    ``client_global_<m>``: the spread over the participating clients of the global model on their local
    test splits; ``client_personal_<m>``: of the deployed model (``personal_per``, a personalised
    strategy); ``client_<m>``: the deployed model's (the personalised one, else the global one). With unseen
    clients: ``unseen_clients``, ``unseen_global_<m>`` (and ``unseen_personal_<m>``: after the strategy's
    own adaptation), the means over clients ``participating_train_<m>`` (the global model on their
    training data), ``participating_test_<m>``, and Yuan et al.'s ``out_of_sample_gap`` (train - test of
    the participating clients) and ``participation_gap`` (participating - unseen, test data;
    ``participation_gap_personal`` for the deployed models).
    """
    from fl_lightning.functional.outcomes import generalization_gaps

    hidden = set(unseen)

    def seen(per: Mapping[int, Mapping[str, float]], inside: bool) -> dict[int, Mapping[str, float]]:
        return {c: m for c, m in per.items() if (c not in hidden) == inside}

    out: dict[str, Any] = {}
    g = spread_dict(spread_scalars("", seen(global_per, True), metric, weights), metric)
    if g:
        out[f"client_global_{metric}"] = g
    deployed = g
    if personal_per is not None:
        p = spread_dict(spread_scalars("", seen(personal_per, True), metric, weights), metric)
        if p:
            out[f"client_personal_{metric}"] = deployed = p
    if deployed:
        out[f"client_{metric}"] = deployed
    if not hidden:
        return out
    ids = sorted(hidden)
    participating = [c for c in global_per if c not in hidden]
    out["unseen_clients"] = len(ids)
    test = client_mean(global_per, metric, participating)
    unseen_test = client_mean(global_per, metric, ids)
    train = client_mean(train_per, metric, participating)
    out[f"participating_train_{metric}"] = train
    out[f"participating_test_{metric}"] = test
    out[f"unseen_global_{metric}"] = unseen_test
    out.update(generalization_gaps(train, test, unseen_test))
    if personal_per is not None:
        p_test = client_mean(personal_per, metric, participating)
        p_unseen = client_mean(personal_per, metric, ids)
        out[f"unseen_personal_{metric}"] = p_unseen
        gap = generalization_gaps(None, p_test, p_unseen).get("participation_gap")
        if gap is not None:
            out["participation_gap_personal"] = gap
    return out


def clients_table(
    module: Any,
    rows: Sequence[RoundRow],
    metric: str,
    global_per: Mapping[int, Mapping[str, float]],
    personal_per: Mapping[int, Mapping[str, float]] | None,
) -> tuple[list[str], list[dict[str, Any]]]:
    """``clients.csv``'s header and rows: per client its data (training and test samples, labels present),
    its heterogeneity (transform group, noise std, device speed where they apply), its final cluster under a
    clustered strategy (``cluster``: ``Strategy.cluster_ids``; empty otherwise, or for a client never
    assigned), whether it was held out (``unseen``), its participation (:func:`ledger`) and the final metric
    of the global model and of the deployed (personalised) one.

    Args:
        module: The finished :class:`~fl_lightning.lightning.module.FederatedModule` (duck-typed: its
            ``engine`` and its trainer's data module).
    """
    engine = module.engine
    clients = engine.clients
    dm = getattr(getattr(module, "_trainer", None), "datamodule", None)
    transform = getattr(dm, "client_transform", None)
    system = engine.system
    speeds = getattr(getattr(system, "devices", None), "speed", None) if system is not None else None
    counts = ledger(rows, len(clients))
    strategy = getattr(engine, "strategy", None)
    clusters = strategy.cluster_ids() if strategy is not None else None
    header = ["client", "samples", "test_samples", "labels"]
    grouped = transform is not None and transform.num_groups < len(clients)
    noisy = transform is not None and callable(getattr(transform, "std", None))
    header += ["group"] if grouped else []
    header += ["noise_std"] if noisy else []
    header += ["transform"] if transform is not None else []
    header += ["speed"] if speeds is not None else []
    header += ["cluster", "unseen", *FATES, f"global_{metric}"]
    header += [f"personal_{metric}"] if personal_per is not None else []
    out = []
    for c in clients:
        cid = c.client_id
        labels = c.train_labels()
        present = int((labels.sum(0) > 0).sum()) if labels.dim() > 1 else int(labels.unique().numel())
        row: dict[str, Any] = {
            "client": cid,
            "samples": c.num_samples,
            "test_samples": int(c.test_idx.numel()),
            "labels": present,
            "cluster": "" if clusters is None else clusters.get(cid, ""),
            "unseen": int(cid in engine.unseen),
            **counts[cid],
            f"global_{metric}": global_per.get(cid, {}).get(metric, ""),
        }
        if grouped:
            row["group"] = transform.group_of(cid)
        if noisy:
            row["noise_std"] = transform.std(cid)
        if transform is not None:
            row["transform"] = transform.describe(cid)
        if speeds is not None:
            row["speed"] = float(speeds[cid])
        if personal_per is not None:
            row[f"personal_{metric}"] = personal_per.get(cid, {}).get(metric, "")
        out.append(row)
    return header, out


def cluster_text(round: int, clusters: Mapping[int, int]) -> str:
    """A clustered strategy's assignment after ``round`` (rounds done) in words, for TensorBoard's text tab:
    ``round 3: cluster 0: clients 0, 2, 5; cluster 1: clients 1, 3``."""
    members: dict[int, list[int]] = {}
    for client, cluster in sorted(clusters.items()):
        members.setdefault(int(cluster), []).append(int(client))
    if not members:
        return f"round {round}: no client assigned yet"
    parts = [f"cluster {k}: clients {', '.join(map(str, ids))}" for k, ids in sorted(members.items())]
    return f"round {round}: " + "; ".join(parts)


def group_fields(rows: Sequence[RoundRow], metric: str) -> dict[str, Any]:
    """``group_global_<m>``: each transform group's global metric in the last round that has them
    (``global/group<g>/<m>``), keyed by group, and ``global_is_union_of_groups`` (``global/*`` evaluates
    the union of the groups' test passes); empty without groups."""
    prefix, suffix = "global/group", f"/{metric}"
    for r in reversed(rows):
        groups = {
            k[len(prefix) : -len(suffix)]: v
            for k, v in r.metrics.items()
            if k.startswith(prefix) and k.endswith(suffix)
        }
        if groups:
            ordered = dict(sorted(groups.items(), key=lambda kv: int(kv[0])))
            return {f"group_global_{metric}": ordered, "global_is_union_of_groups": True}
    return {}


__all__ = [
    "CLIENTS_FILE",
    "CURVES_FILE",
    "CURVE_CLOCK",
    "FATES",
    "RoundRow",
    "client_mean",
    "clients_table",
    "cluster_text",
    "curves",
    "group_fields",
    "ledger",
    "outcome_fields",
    "read_history",
    "spread_dict",
    "spread_scalars",
    "write_csv",
]
