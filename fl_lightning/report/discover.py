"""Finding the finished runs of a run folder or a sweep output, grouped by row."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fl_lightning.runs import read_clients, read_curves, run_number


@dataclass
class RunFiles:
    """A finished run: its folder, row, seed and the three files figures read."""

    folder: Path
    row: str
    seed: int | None
    summary: dict[str, Any]
    curves: list[dict[str, Any]]
    clients: list[dict[str, Any]]

    @property
    def metric(self) -> str:
        return str(self.summary.get("metric", "acc"))

    @property
    def clocked(self) -> bool:
        """A simulated clock ran (``sim_time_s`` in curves.csv)."""
        return any("sim_time_s" in r for r in self.curves)

    def config_text(self) -> str:
        path = self.folder / "config.yaml"
        return path.read_text() if path.is_file() else ""


@dataclass
class Collection:
    """What a folder holds: the runs by row (in order), whether it is a sweep, one line per problem, and a
    sweep's ``name:`` (:func:`sweep_name`; empty for a run)."""

    root: Path
    sweep: bool
    rows: dict[str, list[RunFiles]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    name: str = ""

    @property
    def title(self) -> str:
        """What the page is about: a sweep's ``name:``, a run's folder (``version_3-fedbuff-devices``)."""
        if self.name:
            return self.name
        if not self.sweep and len(self.rows) == 1:
            return next(iter(self.rows))
        return self.root.name or str(self.root)

    @property
    def runs(self) -> list[RunFiles]:
        return [r for runs in self.rows.values() for r in runs]


def _json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _versions(folder: Path) -> list[Path]:
    """The run folders ``version_N[-<label>]`` of ``folder/lightning_logs``, by ``N``."""
    found = [v for v in (folder / "lightning_logs").glob("version_*") if run_number(v) is not None]
    return sorted(found, key=lambda v: run_number(v) or 0)


def _load(folder: Path, row: str, seed: int | None) -> RunFiles | None:
    summary = _json(folder / "summary.json")
    if summary is None:
        return None
    return RunFiles(folder, row, seed, summary, read_curves(folder), read_clients(folder))


def _finished(seed_folder: Path) -> tuple[Path | None, str | None]:
    """The version of a sweep's run folder to draw (its marker's, else the newest with a summary that was
    not interrupted) and, if there is none, why."""
    marker = _json(seed_folder / "sweep.json") or {}
    versions = _versions(seed_folder)
    named = seed_folder / "lightning_logs" / str(marker.get("version", ""))
    if marker.get("returncode") == 0 and (named / "summary.json").is_file():
        return named, None
    for v in reversed(versions):
        s = _json(v / "summary.json")
        if s is not None and not s.get("interrupted"):
            return v, None
    if marker.get("returncode") not in (None, 0):
        return None, str(marker.get("error") or f"exit status {marker.get('returncode')}")
    if versions:
        s = _json(versions[-1] / "summary.json")
        return None, f"interrupted: {s.get('reason')}" if s else "no summary.json (it did not finish)"
    return None, "it has no run folder"


def discover(path: Path) -> Collection:
    """The runs under ``path``: one run folder (it has ``summary.json``), a ``fit`` root (its newest finished
    ``lightning_logs/version_N``), or a sweep output (``<row>/seed<N>/...``: every row and seed)."""
    path = Path(path)
    if (path / "summary.json").is_file():
        run = _load(path, path.name, None)
        return Collection(path, False, {path.name: [run]} if run else {})
    if (path / "lightning_logs").is_dir():
        col = Collection(path, False)
        for v in reversed(_versions(path)):
            run = _load(v, v.name, None)
            if run is not None:
                col.rows[v.name] = [run]
                break
        return col
    col = Collection(path, True, name=sweep_name(path))
    seed_dirs = [
        p
        for p in (path.rglob("seed*") if path.is_dir() else [])
        if p.is_dir() and p.name[4:].isdigit() and "lightning_logs" not in p.relative_to(path).parts
    ]
    order = _row_order(path)
    by_row: dict[str, list[Path]] = {}
    for seed_dir in seed_dirs:
        by_row.setdefault(seed_dir.parent.relative_to(path).as_posix(), []).append(seed_dir)
    for row in sorted(by_row, key=lambda r: (order.get(r, len(order)), r)):
        for seed_dir in sorted(by_row[row], key=lambda p: int(p.name[4:])):
            version, why = _finished(seed_dir)
            run = _load(version, row, int(seed_dir.name[4:])) if version is not None else None
            if run is None:
                col.problems.append(
                    f"{row} seed {seed_dir.name[4:]}: failed ({why}); left out of the figures"
                )
                continue
            col.rows.setdefault(row, []).append(run)
    return col


def sweep_name(path: Path) -> str:
    """A sweep output's ``name:`` (the heading of its ``results.md``, ``# <name>``); empty without one."""
    try:
        with open(path / "results.md") as f:
            first = f.readline().strip()
    except OSError:
        return ""
    return first[2:].strip() if first.startswith("# ") else ""


def _row_order(path: Path) -> dict[str, int]:
    """The rows' order in a sweep's ``results.csv`` (the sweep file's order), empty without one."""
    import csv

    try:
        with open(path / "results.csv", newline="") as f:
            names = [r.get("row", "") for r in csv.DictReader(f)]
    except OSError:
        return {}
    return {name: i for i, name in enumerate(names)}
