"""``python -m fl_lightning sweep``: its options, and the order of things (load, select, resolve, run,
tabulate, check)."""

from __future__ import annotations

import argparse
import fnmatch
import sys
import tempfile
from pathlib import Path
from typing import NoReturn

from fl_lightning.errors import ConfigError
from fl_lightning.sweep.check import compare
from fl_lightning.sweep.report import collect, write_tables
from fl_lightning.sweep.runner import execute, expect, machine_cores, print_commands, say
from fl_lightning.sweep.spec import Run, Sweep, fit_args, load_sweep, runs_of, shown


class _Parser(argparse.ArgumentParser):
    """Option errors are one ``error:`` line (no usage block), like every other bad input."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"sweep: {message} (python -m fl_lightning sweep --help)")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m fl_lightning sweep",
        description="A grid of fit runs over seeds from one YAML file, N at a time, with a results table. "
        "The sweep file's schema: python -c 'import fl_lightning.sweep as s; help(s)' or README, 'Sweeps'.",
        usage="%(prog)s SWEEP.yaml [options] [-- FIT ARGUMENTS]",
    )
    parser.add_argument("sweep", help="the sweep file (YAML)")
    parser.add_argument("--jobs", type=int, default=None, help="runs at a time (default: jobs: or the cores)")
    parser.add_argument(
        "--threads", type=int, default=None, help="threads per run (default: threads: or cores // jobs, >= 1)"
    )
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: out: of the file)")
    parser.add_argument(
        "--rows", nargs="+", default=None, metavar="PATTERN", help="rows to run (shell patterns)"
    )
    parser.add_argument(
        "--seeds", nargs="+", type=int, default=None, help="seeds (default: seeds: of the file)"
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--report", action="store_true", help="run nothing; write the table of what is there")
    mode.add_argument(
        "--print-commands", action="store_true", help="print one fit command per run still to do; run nothing"
    )
    mode.add_argument(
        "--check",
        action="store_true",
        help="re-run the rows into a fresh folder, compare with the stored table",
    )
    return parser


def _select(sweep: Sweep, patterns: list[str] | None) -> None:
    if not patterns:
        return
    for p in patterns:
        if not any(fnmatch.fnmatchcase(r.name, p) for r in sweep.rows):
            names = ", ".join(r.name for r in sweep.rows[:8]) + (", ..." if len(sweep.rows) > 8 else "")
            raise ConfigError(f"--rows {p}: matches no row (rows: {names})")
    sweep.rows = [r for r in sweep.rows if any(fnmatch.fnmatchcase(r.name, p) for p in patterns)]


def run_sweep(argv: list[str]) -> int:
    """``python -m fl_lightning sweep``; returns the exit status (bad input raises :class:`ConfigError`)."""
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    args = _parser().parse_args(argv)
    sweep = load_sweep(args.sweep)
    _select(sweep, args.rows)
    if args.seeds is not None:
        if not args.seeds or min(args.seeds) < 0 or len(set(args.seeds)) != len(args.seeds):
            raise ConfigError(f"--seeds {args.seeds}: give distinct integers >= 0")
        sweep.seeds = tuple(args.seeds)
    for flag, value in (("--jobs", args.jobs), ("--threads", args.threads)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag}={value} must be >= 1")
    fit_args(extra, "arguments after --")
    if args.out is not None:
        sweep.out = args.out.resolve()
    elif args.check:
        sweep.out = Path(tempfile.mkdtemp(prefix=f"fl_lightning-check-{sweep.name}-"))
    if args.check and (sweep.check_table is None or not sweep.check_table.is_file()):
        raise ConfigError(
            f"{sweep.path}: no stored table {sweep.check_table} to check against; run the sweep and copy its "
            "results.csv there (or set check.table)"
        )
    runs = expect(sweep, runs_of(sweep), extra)
    explicit_threads = args.threads or sweep.threads
    if args.print_commands:
        return print_commands(sweep, runs, explicit_threads, extra)
    outcome: dict[Run, str] = {}
    interrupted = False
    if not args.report:
        cores = machine_cores()
        jobs = args.jobs or sweep.jobs or cores
        threads = explicit_threads or max(1, cores // jobs)
        note = " (more threads than cores: oversubscribed)" if jobs * threads > cores else ""
        say(
            f"sweep {sweep.name}: {len(sweep.rows)} rows x {len(sweep.seeds)} seeds = {len(runs)} runs in "
            f"{shown(sweep.out, Path.cwd().resolve())}, {jobs} at a time, {threads} thread(s) each on "
            f"{cores} cores{note}"
        )
        outcome, interrupted = execute(sweep, runs, jobs, threads, extra)
    results = collect(sweep, runs, outcome)
    text = write_tables(sweep, results, sweep.out)
    say("\n" + text)
    say(f"written to {shown(sweep.out / 'results.md', Path.cwd().resolve())} and results.csv")
    if interrupted:
        return 130
    status = 1 if any(r.failed or r.missing for r in results) else 0
    if args.check:
        assert sweep.check_table is not None
        mismatches = 0
        for name, ok, detail in compare(sweep, results, sweep.check_table):
            mismatches += not ok
            say(f"{'match   ' if ok else 'MISMATCH'} {name}" + (f": {detail}" if detail else ""))
        say(f"check against {sweep.check_table}: {len(results) - mismatches} of {len(results)} rows match")
        status = 1 if mismatches else 0  # failed runs the stored table has too are a match
    return status


def main(argv: list[str]) -> None:
    """Entry point of ``python -m fl_lightning sweep``: bad input is one ``error:`` line (exit 2)."""
    try:
        status = run_sweep(argv)
    except ConfigError as err:
        sys.stderr.write(f"error: {err}\n")
        raise SystemExit(2) from None
    raise SystemExit(status)
