"""The figures, drawn from the runs' own files (matplotlib, Agg backend)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fl_lightning.report.discover import RunFiles

METRIC_NAMES = {"acc": "accuracy", "o_f1": "O-F1"}


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample std (0 for one value)."""
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return mean, std


def band_by_round(runs: Sequence[RunFiles], tag: str) -> tuple[list[float], list[float], list[float]]:
    """Rounds where every seed evaluated ``tag``, with the mean and sample std of its cells there."""
    per = [{r["round"]: r[tag] for r in run.curves if tag in r and "round" in r} for run in runs]
    per = [p for p in per if p]
    if not per:
        return [], [], []
    rounds = sorted(set.intersection(*(set(p) for p in per)))
    stats = [mean_std([p[x] for p in per]) for x in rounds]
    return rounds, [m for m, _ in stats], [s for _, s in stats]


def value_at(points: Sequence[tuple[float, float]], t: float) -> float | None:
    """The last value at or before ``t`` of time-ordered ``points`` (None before the first)."""
    out = None
    for x, v in points:
        if x > t:
            break
        out = v
    return out


def band_by_time(
    runs: Sequence[RunFiles], tag: str, clock: str = "sim_time_s"
) -> tuple[list[float], list[float], list[float]]:
    """At the times every seed evaluated ``tag`` (up to the shortest seed's end), the mean and sample std of
    each seed's last value at or before that time."""
    per = [sorted((r[clock], r[tag]) for r in run.curves if tag in r and clock in r) for run in runs]
    per = [p for p in per if p]
    if not per:
        return [], [], []
    start, end = max(p[0][0] for p in per), min(p[-1][0] for p in per)
    times = sorted({x for p in per for x, _ in p if start <= x <= end})
    xs, means, stds = [], [], []
    for t in times:
        vals = [value_at(p, t) for p in per]
        if all(v is not None for v in vals):
            m, s = mean_std([float(v) for v in vals])  # type: ignore[arg-type]
            xs.append(t)
            means.append(m)
            stds.append(s)
    return xs, means, stds


def save(fig: Any, out: Path, name: str) -> list[Path]:
    """``fig`` as ``<name>.png`` and ``<name>.svg`` in ``out``."""
    paths = [out / f"{name}.png", out / f"{name}.svg"]
    fig.tight_layout()
    for p in paths:
        fig.savefig(p, dpi=110 if p.suffix == ".png" else None)
    pyplot().close(fig)
    return paths


def in_percent(tag: str) -> bool:
    """Whether curves.csv's ``tag`` is a fraction drawn in % (an accuracy-like metric; not a loss)."""
    return tag.rsplit("/", 1)[-1] in METRIC_NAMES


def panels_of(rows: dict[str, list[RunFiles]], facet: bool) -> dict[str, dict[str, list[RunFiles]]]:
    """The rows by panel: one panel of every row, or (``facet``) one per first segment of the row names
    (``s50/fedavg`` is line ``fedavg`` of panel ``s50``)."""
    if not facet:
        return {"": rows}
    out: dict[str, dict[str, list[RunFiles]]] = {}
    for row, runs in rows.items():
        panel, _, line = row.partition("/")
        out.setdefault(panel if line else "", {})[line or row] = runs
    return out


def curves_figure(
    rows: dict[str, list[RunFiles]],
    tag: str,
    clock: str,
    out: Path,
    name: str,
    title: str,
    facet: bool = False,
) -> list[Path]:
    """``tag`` against rounds (``clock="round"``) or simulated time, one line per row, mean ± std bands; an
    accuracy-like tag in %, others (a loss) as they are; with ``facet`` one panel per first row segment."""
    plt = pyplot()
    pct = in_percent(tag)
    scale = 100.0 if pct else 1.0
    panels = panels_of(rows, facet)
    fig, axes = plt.subplots(
        1, len(panels), figsize=(max(7, 4.6 * len(panels)), 4.2), squeeze=False, sharey=True
    )
    drawn = 0
    for ax, (panel, lines) in zip(axes[0], panels.items(), strict=True):
        for row, runs in lines.items():
            xs, m, s = band_by_round(runs, tag) if clock == "round" else band_by_time(runs, tag, clock)
            if not xs:
                continue
            n = len(runs)
            (line,) = ax.plot(
                xs, [scale * v for v in m], label=f"{row} (n={n})", marker="." if len(xs) < 30 else None
            )
            if n > 1:
                lo = [scale * (a - b) for a, b in zip(m, s, strict=True)]
                hi = [scale * (a + b) for a, b in zip(m, s, strict=True)]
                ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
            drawn += 1
        if clock == "round":
            from matplotlib.ticker import MaxNLocator

            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("round (server steps)" if clock == "round" else "simulated time (s)")
        ax.grid(alpha=0.3)
        if panel:
            ax.set_title(panel)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(title="row (seeds): mean ± std", fontsize=8)
    if not drawn:
        plt.close(fig)
        return []
    axes[0][0].set_ylabel(f"{tag} (%)" if pct else tag)
    if len(panels) > 1:
        fig.suptitle(title)
    else:
        axes[0][0].set_title(title)
    return save(fig, out, name)


def final_metric_column(runs: Sequence[RunFiles], metric: str) -> str | None:
    """The clients.csv column of the deployed model's final metric (personalised, else global)."""
    for col in (f"personal_{metric}", f"global_{metric}"):
        if any(col in c for r in runs for c in r.clients):
            return col
    return None


def clients_figure(rows: dict[str, list[RunFiles]], metric: str, out: Path) -> list[Path]:
    """Each row's final per-client metric over its seeds' participating clients: a box plot with the points,
    the worst decile's mean marked."""
    plt = pyplot()
    data, labels, deciles, cols = [], [], [], set()
    for row, runs in rows.items():
        col = final_metric_column(runs, metric)
        if col is None:
            continue
        vals = sorted(100 * c[col] for r in runs for c in r.clients if col in c and not c.get("unseen"))
        if not vals:
            continue
        k = max(1, math.ceil(0.1 * len(vals) - 1e-9))
        data.append(vals)
        labels.append(row)
        deciles.append(sum(vals[:k]) / k)
        cols.add(col.split("_")[0])
    if not data:
        return []
    fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(data) + 2), 4.2))
    ax.boxplot(data, showmeans=False)
    ax.set_xticks(range(1, len(labels) + 1), labels, rotation=20 if len(labels) > 4 else 0)
    for i, vals in enumerate(data, 1):
        ax.scatter([i] * len(vals), vals, s=8, alpha=0.4, color="gray", zorder=3)
        ax.scatter(
            [i],
            [deciles[i - 1]],
            marker="v",
            s=60,
            color="crimson",
            zorder=4,
            label="mean of the worst 10% of clients" if i == 1 else None,
        )
    which = " / ".join(sorted(cols))
    ax.set_ylabel(f"final client {METRIC_NAMES.get(metric, metric)} (%)")
    ax.set_xlabel("row (participating clients of every seed)")
    ax.set_title(f"Per-client final {METRIC_NAMES.get(metric, metric)}, {which} model")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    return save(fig, out, "clients_final")


def group_tags(runs: Sequence[RunFiles], metric: str) -> list[str]:
    tags = {
        k
        for r in runs
        for c in r.curves
        for k in c
        if k.startswith("global/group") and k.endswith(f"/{metric}")
    }
    return sorted(tags, key=lambda t: int(t[len("global/group") : -len(metric) - 1]))


def groups_figure(rows: dict[str, list[RunFiles]], metric: str, out: Path) -> list[Path]:
    """Per row, each transform group's global curve against rounds (mean ± std over seeds)."""
    grouped = {row: group_tags(runs, metric) for row, runs in rows.items()}
    grouped = {row: tags for row, tags in grouped.items() if tags}
    if not grouped:
        return []
    plt = pyplot()
    fig, axes = plt.subplots(1, len(grouped), figsize=(5.5 * len(grouped), 4), squeeze=False)
    for ax, (row, tags) in zip(axes[0], grouped.items(), strict=True):
        for tag in tags:
            xs, m, s = band_by_round(rows[row], tag)
            (line,) = ax.plot(xs, [100 * v for v in m], label=tag.split("/")[1])
            ax.fill_between(
                xs,
                [100 * (a - b) for a, b in zip(m, s, strict=True)],
                [100 * (a + b) for a, b in zip(m, s, strict=True)],
                color=line.get_color(),
                alpha=0.15,
            )
        xs, m, _ = band_by_round(rows[row], f"global/{metric}")
        ax.plot(xs, [100 * v for v in m], color="black", linestyle="--", label=f"global/{metric} (union)")
        ax.set_title(row)
        ax.set_xlabel("round (server steps)")
        ax.set_ylabel(f"global {METRIC_NAMES.get(metric, metric)} per group (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return save(fig, out, "groups")


def to_target(run: RunFiles, tag: str, target: float, clock: str) -> float | None:
    """``clock``'s value in curves.csv at the first round whose ``tag`` reached ``target``."""
    hit = next((r for r in run.curves if r.get(tag, -math.inf) >= target), None)
    return None if hit is None else hit.get(clock)


def target_figure(rows: dict[str, list[RunFiles]], metric: str, target: float, out: Path) -> list[Path]:
    """Bars per row: simulated time and MiB until ``global/<m>`` first reached ``target`` (mean ± std over
    the seeds that reached it; the count on the bar)."""
    tag = f"global/{metric}"
    panels = [
        ("sim_time_s", "simulated time to target (s)", 1.0),
        ("bytes_total", "MiB to target", 1 / 2**20),
    ]
    panels = [p for p in panels if any(p[0] in c for runs in rows.values() for r in runs for c in r.curves)]
    if not panels:
        return []
    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, (clock, label, scale) in zip(axes[0], panels, strict=True):
        names, means, stds, notes = [], [], [], []
        for row, runs in rows.items():
            names.append(row)
            if not any(clock in c for r in runs for c in r.curves):
                means.append(0.0)
                stds.append(0.0)
                notes.append("no clock")
                continue
            hits = [to_target(r, tag, target, clock) for r in runs]
            got = [scale * h for h in hits if h is not None]
            m, s = mean_std(got) if got else (0.0, 0.0)
            means.append(m)
            stds.append(s)
            notes.append(f"{len(got)}/{len(runs)}")
        bars = ax.bar(names, means, yerr=stds, capsize=4, color="tab:blue", alpha=0.8)
        for bar, note, err in zip(bars, notes, stds, strict=True):
            ax.annotate(
                note,
                (bar.get_x() + bar.get_width() / 2, bar.get_height() + err),
                ha="center",
                va="bottom",
                fontsize=8,
                xytext=(0, 3),
                textcoords="offset points",
            )
        ax.margins(y=0.15)
        ax.set_ylabel(label)
        ax.set_xlabel("row (seeds that reached it / seeds)")
        ax.set_title(f"until {tag} >= {target:g}")
        ax.grid(alpha=0.3, axis="y")
    return save(fig, out, "to_target")


def scatter_figure(run: RunFiles, metric: str, out: Path) -> list[Path]:
    """One run's final per-client metric against each heterogeneity the clients.csv has: samples, group or
    noise std, device speed, times sampled (unseen clients as open circles)."""
    col = final_metric_column([run], metric)
    if col is None:
        return []
    axes_of = [
        ("samples", "training samples"),
        ("group", "transform group"),
        ("noise_std", "noise std"),
        ("speed", "device speed (samples/s)"),
        ("sampled", "rounds sampled"),
    ]
    present = [(k, lab) for k, lab in axes_of if any(k in c for c in run.clients)]
    plt = pyplot()
    fig, axes = plt.subplots(1, len(present), figsize=(4 * len(present), 3.6), squeeze=False)
    for ax, (key, label) in zip(axes[0], present, strict=True):
        for unseen, style in (
            (False, {"color": "tab:blue"}),
            (True, {"facecolors": "none", "edgecolors": "tab:red"}),
        ):
            pts = [
                (c[key], 100 * c[col])
                for c in run.clients
                if key in c and col in c and bool(c.get("unseen")) == unseen
            ]
            if pts:
                ax.scatter(
                    [p[0] for p in pts],
                    [p[1] for p in pts],
                    s=18,
                    label="unseen" if unseen else "participating",
                    **style,
                )
        ax.set_xlabel(label)
        ax.set_ylabel(f"final {col.replace('_', ' ')} (%)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"{run.row}: per-client final {METRIC_NAMES.get(metric, metric)}")
    return save(fig, out, "clients_scatter")
