"""``--check``: a fresh run of the rows compared with a stored table."""

from __future__ import annotations

import csv
from pathlib import Path

from fl_lightning.errors import ConfigError
from fl_lightning.sweep.report import RowResult, cells, machines, runs_text
from fl_lightning.sweep.spec import Sweep


def compare(sweep: Sweep, results: list[RowResult], stored: Path) -> list[tuple[str, bool, str]]:
    """Each row against the stored CSV: ``(row, match, detail)``.

    A value matches when it prints the same (the column's digits) or differs by at most
    ``check.tolerance``; means, standard deviations and the number of runs are compared. A row whose
    stored runs had failed matches only if as many fail again (a run that diverges reproducibly is part of
    the result). A mismatch on another machine than the stored table's (its ``machine`` column: torch,
    CPU kernels or GPU, threads) says so: the same config and seed need not give the same floats there.
    """
    try:
        with open(stored, newline="") as f:
            table = {r["row"]: r for r in csv.DictReader(f)}
    except (OSError, KeyError, csv.Error) as err:
        raise ConfigError(f"check.table {stored}: cannot read it as a results.csv ({err})") from None
    names = sweep.check_columns or tuple(c.key for c in sweep.columns if c.checked)
    columns = [c for c in sweep.columns if c.key in names]
    out = []
    for r in results:
        old = table.get(r.row.name)
        if old is None:
            out.append((r.row.name, False, "no such row in the stored table"))
            continue
        problems = []
        if r.missing or str(len(r.failed)) != old.get("failed", "0"):
            # a run that failed in the stored table too (a divergence) is part of the result it reproduces
            problems.append(f"runs {runs_text(r)} (stored {old.get('seeds')}, {old.get('failed')} failed)")
        now = cells(sweep, r)
        for col in columns:
            if f"{col.key}_mean" not in old:
                problems.append(f"{col.key}: not in the stored table")
                continue
            cell = now[col.key]
            if str(cell.n) != old.get(f"{col.key}_n", str(cell.n)):
                problems.append(f"{col.key}: {cell.n} runs have it (stored {old[f'{col.key}_n']})")
            for part, value in (("mean", cell.mean), ("std", cell.std)):
                text = old.get(f"{col.key}_{part}", "")
                before = float(text) if text else None
                if not _same(value, before, col.digits, sweep.tolerance):
                    problems.append(
                        f"{col.key} {part} {_num(value, col.digits)} (stored {_num(before, col.digits)})"
                    )
        stored_on, now_on = old.get("machine") or "", machines([r])
        if problems and stored_on and now_on and stored_on != now_on:
            problems.append(f"stored on {stored_on}, run on {now_on}: float results differ across machines")
        out.append((r.row.name, not problems, "; ".join(problems)))
    return out


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _same(a: float | None, b: float | None, digits: int, tolerance: float) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return _num(a, digits) == _num(b, digits) or abs(a - b) <= tolerance
