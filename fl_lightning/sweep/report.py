"""The table: mean ± sample std over seeds per row, as markdown and CSV."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fl_lightning.runs import machine_text
from fl_lightning.sweep.columns import Column, RunData, client_mean
from fl_lightning.sweep.runner import run_state
from fl_lightning.sweep.spec import Row, Run, Sweep


@dataclass
class RowResult:
    """A row's runs: the finished ones' data, and the failed and missing seeds."""

    row: Row
    data: list[RunData]
    failed: list[tuple[int, str]]
    missing: list[int]


def collect(sweep: Sweep, runs: list[Run], outcome: dict[Run, str] | None = None) -> list[RowResult]:
    """Read every run folder of the selected rows (``outcome``: what this start saw fail)."""
    outcome = outcome or {}
    results: dict[str, RowResult] = {}
    for run in runs:
        res = results.setdefault(run.row.name, RowResult(run.row, [], [], []))
        state = run_state(run)
        said = outcome.get(run, "")
        if state.kind == "finished" and state.version is not None:
            res.data.append(RunData(state.version, state.summary or {}, sweep.target))
        elif said.startswith("failed: "):
            res.failed.append((run.seed, said.removeprefix("failed: ")))
        elif state.error:  # its last start failed (a start removes the previous record)
            res.failed.append((run.seed, state.error))
        else:
            res.missing.append(run.seed)
    return list(results.values())


def machines(results: list[RowResult]) -> str:
    """The machines the runs computed on (summary.json's ``machine``), ``; ``-joined; empty if unrecorded."""
    seen = {machine_text(d.summary.get("machine")) for r in results for d in r.data}
    return "; ".join(sorted(seen - {""}))


def _mean_std(values: list[float]) -> tuple[float, float | None]:
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


@dataclass
class Cell:
    """A column's value for a row: mean, std (None for one value) and how many runs had it."""

    mean: float | None
    std: float | None
    n: int
    of: int

    def text(self, digits: int) -> str:
        if self.mean is None:
            return "-"
        s = f"{self.mean:.{digits}f}"
        if self.std is not None:
            s += f" ± {self.std:.{digits}f}"
        if self.n < self.of:
            s += f" ({self.n} of {self.of})"
        return s


def cells(sweep: Sweep, result: RowResult) -> dict[str, Cell]:
    out = {}
    for col in sweep.columns:
        values = [v for v in (col.read(d) for d in result.data) if v is not None]
        mean, std = _mean_std(values) if values else (None, None)
        out[col.key] = Cell(mean, std, len(values), len(result.data))
    return out


def _shown_columns(sweep: Sweep, results: list[RowResult]) -> list[Column]:
    if not sweep.auto_client:
        return sweep.columns
    has_client = any(client_mean(d) is not None for r in results for d in r.data)
    return [c for c in sweep.columns if c.key != "client" or has_client]


def _paper_labels(results: list[RowResult]) -> list[str]:
    labels: list[str] = []
    for r in results:
        for k in r.row.paper:
            if k not in labels:
                labels.append(k)
    return labels


def _paper_text(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def runs_text(r: RowResult) -> str:
    text = str(len(r.data))
    notes = [f"{len(r.failed)} failed"] * bool(r.failed) + [f"{len(r.missing)} missing"] * bool(r.missing)
    return text + (f" ({', '.join(notes)})" if notes else "")


def _metric(results: list[RowResult]) -> str:
    metrics = {d.metric for r in results for d in r.data}
    if len(metrics) == 1:
        return {"acc": "acc", "o_f1": "O-F1"}.get(next(iter(metrics)), next(iter(metrics)))
    return "metric"


def _header(col: Column, sweep: Sweep, metric: str) -> str:
    target = "-" if sweep.target is None else f"{sweep.target[1]:g}"
    return col.label.format(m=metric, target=target)


def markdown(sweep: Sweep, results: list[RowResult]) -> str:
    """The results table in Markdown, with a legend, the failed runs and the sweep's notes."""
    columns = _shown_columns(sweep, results)
    papers = _paper_labels(results)
    metric = _metric(results)
    head = [*sweep.axes, "seeds", *(_header(c, sweep, metric) for c in columns)]
    head += [f"paper {p}".strip() for p in papers]
    lines = [f"# {sweep.name}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        row_cells = cells(sweep, r)
        values = [*r.row.keys, runs_text(r), *(row_cells[c.key].text(c.digits) for c in columns)]
        values += [_paper_text(r.row.paper.get(p)) for p in papers]
        lines.append("| " + " | ".join(values) + " |")
    tag = (sweep.target[0] if sweep.target else None) or f"global/{metric}"
    lines += ["", f"Mean ± sample standard deviation over seeds {list(sweep.seeds)}."]
    computed_on = machines(results)
    if computed_on:
        lines[-1] += f" Computed with {computed_on}."
    lines.append("")
    lines.append("- seeds: the row's finished runs")
    lines += [
        f"- {_header(c, sweep, metric)}: {c.legend.format(m=metric, tag=tag)}" for c in columns if c.legend
    ]
    failed = [(r.row.name, seed, line) for r in results for seed, line in r.failed]
    if failed:
        lines += ["", "Failed runs:", ""] + [f"- {name} seed {seed}: {line}" for name, seed, line in failed]
    if sweep.notes:
        lines += ["", sweep.notes]
    return "\n".join(lines) + "\n"


def csv_rows(sweep: Sweep, results: list[RowResult]) -> tuple[list[str], list[dict[str, Any]]]:
    """The CSV's header and rows: row, axes, run counts, mean/std/n per column, the paper's values."""
    papers = _paper_labels(results)
    axes = [] if sweep.axes == ("row",) else list(sweep.axes)
    header = ["row", *axes, "seeds", "failed", "missing"]
    for c in sweep.columns:
        header += [f"{c.key}_mean", f"{c.key}_std", f"{c.key}_n"]
    header += [f"paper_{p}" if p else "paper" for p in papers]
    header.append("machine")
    rows = []
    for r in results:
        entry: dict[str, Any] = {"row": r.row.name, "seeds": len(r.data), "failed": len(r.failed)}
        entry["missing"] = len(r.missing)
        entry.update(zip(axes, r.row.keys, strict=False))
        for key, cell in cells(sweep, r).items():
            entry[f"{key}_mean"] = "" if cell.mean is None else repr(cell.mean)
            entry[f"{key}_std"] = "" if cell.std is None else repr(cell.std)
            entry[f"{key}_n"] = cell.n
        for p in papers:
            entry[f"paper_{p}" if p else "paper"] = r.row.paper.get(p, "")
        entry["machine"] = machines([r])
        rows.append(entry)
    return header, rows


def write_tables(sweep: Sweep, results: list[RowResult], out: Path) -> str:
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(sweep, results)
    (out / "results.md").write_text(text)
    header, rows = csv_rows(sweep, results)
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header)
        writer.writeheader()
        writer.writerows(rows)
    return text
