"""Running a sweep: each run's ``fit`` arguments resolved before anything starts, N ``fit`` processes at a
time, their outcomes, Ctrl-C, and the commands of the runs still to do."""

from __future__ import annotations

import contextlib
import copy
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fl_lightning.errors import ConfigError
from fl_lightning.sweep.folders import (
    RunState,
    config_digest,
    inspect_run,
    read_json,
    run_versions,
    write_marker,
)
from fl_lightning.sweep.spec import Expected, Run, Sweep, shown


def error_line(stderr: str, returncode: int) -> str:
    """The one line that says why a ``fit`` failed: its ``error:`` line, else the last line of stderr."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("error:"):
            return line
    return lines[-1] if lines else f"exit status {returncode}, nothing on stderr"


def machine_cores() -> int:
    """CPU cores this process may use (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def run_name(run: Run) -> str:
    """A sweep run's folder label: its row's name (``/`` as ``-``) and seed, ``fedprox-dir0.1-seed1``."""
    return f"{run.row.name.replace('/', '-')}-seed{run.seed}"


def fit_command(
    sweep: Sweep, run: Run, threads: int | None, ckpt: Path | None, extra: list[str], python: str
) -> list[str]:
    """The ``fit`` command line of a run (paths relative to ``root``, where it runs); its run folder and
    TensorBoard run are named by the row and seed, ``version_N-<row>-seed<k>`` (:func:`run_name`; an
    argument of the sweep or row that sets ``--name`` comes later and wins)."""
    cmd = [python, "-m", "fl_lightning", "fit"]
    for f in (*sweep.base, *run.row.configs):
        cmd.append(f"--config={f}")
    cmd += [f"--name={run_name(run)}", "--trainer.enable_progress_bar=false"]
    cmd += [*sweep.args, *run.row.args, *extra]
    if threads is not None:
        cmd.append(f"--model.runtime.threads_per_process={threads}")
    cmd += [f"--seed_everything={run.seed}", f"--trainer.default_root_dir={shown(run.folder, sweep.root)}"]
    if ckpt is not None:
        cmd.append(f"--ckpt_path={shown(ckpt, sweep.root)}")
    return cmd


def expect(sweep: Sweep, runs: list[Run], extra: list[str], build: bool = True) -> list[Run]:
    """``runs`` with what each resolves to now, parsed as ``fit`` parses them (before anything starts).

    A row whose arguments ``fit`` would refuse (an unknown option, a value out of range, a config file
    that does not parse) stops the sweep here with ``fit``'s one line, naming the row. With ``build``, the
    model and data module of each row's first run are built too (their own checks; a pretrained network
    is fetched as ``fit`` would fetch it).
    """
    resolve = resolver(sweep.root)
    out: list[Run] = []
    resolved: dict[str, dict[str, Any]] = {}  # per row: its runs differ only in the seed (and folder)
    for run in runs:
        if run.row.name not in resolved:
            args = fit_command(sweep, run, None, None, extra, "python")[4:]
            try:
                resolved[run.row.name] = resolve(args, build)
            except ConfigError as err:
                raise ConfigError(f"{sweep.path}: row {run.row.name} (seed {run.seed}): {err}") from None
        config = {**copy.deepcopy(resolved[run.row.name]), "seed_everything": run.seed}
        steps = (config.get("trainer") or {}).get("max_steps")
        if not isinstance(steps, int) or steps < 1:
            raise ConfigError(
                f"{sweep.path}: row {run.row.name}: trainer.max_steps={steps!r}; a sweep's runs need rounds"
            )
        out.append(replace(run, expected=Expected(config_digest(config), steps, config)))
    return out


def resolver(root: Path) -> Callable[[list[str], bool], dict[str, Any]]:
    """``fit``'s parser, built once, as a function of a run's arguments (relative paths from ``root``)."""
    from fl_lightning.config import resolver as fit_resolver

    with _in_folder(root):
        resolve = fit_resolver()

    def in_root(args: list[str], check: bool) -> dict[str, Any]:
        with _in_folder(root):
            return resolve(args, check)

    return in_root


@contextlib.contextmanager
def _in_folder(folder: Path) -> Iterator[None]:
    before = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def run_state(run: Run) -> RunState:
    """:func:`inspect_run` of a run against what it resolves to (:func:`expect` first)."""
    assert run.expected is not None, "expect() the runs first"
    return inspect_run(run.folder, run.expected)


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _final_text(summary: dict[str, Any]) -> str:
    m = str(summary.get("metric", "acc"))
    name = {"acc": "acc", "o_f1": "O-F1"}.get(m, m)
    final, best = summary.get(f"final_global_{m}"), summary.get(f"best_global_{m}")
    if final is None:
        return "no global metric"
    split = (
        "val" if f"best_val_global_{m}" in summary else "test"
    )  # summaries before the split was named: test
    return f"final {name} {100 * final:.2f}%" + (
        "" if best is None else f" (best on {split} {100 * best:.2f}%)"
    )


@dataclass
class _Active:
    run: Run
    index: int
    proc: subprocess.Popen
    start: float
    err_path: Path
    err_offset: int
    command: list[str]


class _StopError(Exception):
    """SIGTERM while runs are active: stop them as on Ctrl-C."""


def execute(
    sweep: Sweep, runs: list[Run], jobs: int, threads: int, extra: list[str]
) -> tuple[dict[Run, str], bool]:
    """Run what is not finished, ``jobs`` at a time; returns the outcomes and whether it was interrupted.

    Outcomes: ``skipped``, ``done``, ``failed: <line>``. Ctrl-C (or SIGTERM) stops the active runs (they
    resume from their last checkpoint on the next start).
    """
    outcome: dict[Run, str] = {}
    pending = list(enumerate(runs, 1))
    active: list[_Active] = []
    width = len(str(len(runs)))
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: Any) -> None:
        raise _StopError

    signal.signal(signal.SIGTERM, on_term)
    try:
        while pending or active:
            while pending and len(active) < jobs:
                index, run = pending.pop(0)
                tag = f"[{index:>{width}}/{len(runs)}]"
                state = run_state(run)
                if state.kind == "finished":
                    outcome[run] = "skipped"
                    say(f"{tag} skipped {run.label} (finished: {_final_text(state.summary or {})})")
                    continue
                active.append(_launch(sweep, run, index, state, threads, extra, env, tag))
            time.sleep(0.05)
            for a in [a for a in active if a.proc.poll() is not None]:
                active.remove(a)
                outcome[a.run] = _finish(sweep, a, width, len(runs))
    except (KeyboardInterrupt, _StopError):
        _stop(active)
        return outcome, True
    except BaseException:
        _stop(active)  # no run outlives the sweep
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    return outcome, False


def _launch(
    sweep: Sweep, run: Run, index: int, state: RunState, threads: int, extra: list[str], env: dict, tag: str
) -> _Active:
    run.folder.mkdir(parents=True, exist_ok=True)
    assert run.expected is not None
    # the record of this start (the previous start's goes): what it runs, the digest of its config
    write_marker(run.folder, {"config_digest": run.expected.digest, "max_steps": run.expected.max_steps})
    cmd = fit_command(sweep, run, threads, state.ckpt, extra, sys.executable)
    command_line = shlex.join(["python", *cmd[1:]])
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    out_path, err_path = run.folder / "fit.log", run.folder / "fit.err"
    with open(out_path, "a") as f:
        f.write(f"# {stamp} sweep: (cd {sweep.root} && {command_line})\n")
    offset = err_path.stat().st_size if err_path.exists() else 0
    stdout, stderr = open(out_path, "a"), open(err_path, "a")  # noqa: SIM115 (the child holds them)
    try:
        proc = subprocess.Popen(
            cmd, cwd=sweep.root, env=env, stdout=stdout, stderr=stderr, preexec_fn=_sigint_as_default
        )
    finally:
        stdout.close()
        stderr.close()
    if state.kind == "resume" and state.ckpt is not None:
        say(f"{tag} resume  {run.label} from {shown(state.ckpt, run.folder)} ({state.why})")
    elif state.kind == "rerun":
        say(f"{tag} rerun   {run.label} ({state.why}; the run there is kept)")
    else:
        say(f"{tag} start   {run.label}")
    return _Active(run, index, proc, time.monotonic(), err_path, offset, cmd)


def _sigint_as_default() -> None:
    """In a run's process before it starts: SIGINT stops it (:func:`_stop`'s graceful stop) even where the
    sweep ignores SIGINT (started with ``&`` from a script, under ``nohup``, or after Lightning's handling
    of a Ctrl-C), which a new process would otherwise inherit. The sweep starts its runs from one thread."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _finish(sweep: Sweep, a: _Active, width: int, total: int) -> str:
    tag = f"[{a.index:>{width}}/{total}]"
    rc = a.proc.returncode
    seconds = time.monotonic() - a.start
    with open(a.err_path) as f:
        f.seek(a.err_offset)
        stderr = f.read()
    marker: dict[str, Any] = {
        "command": a.command[1:],
        "returncode": rc,
        "seconds": round(seconds, 1),
        **({} if a.run.expected is None else {"config_digest": a.run.expected.digest}),
    }
    if rc == 0:
        versions = [v for v in run_versions(a.run.folder) if (v / "summary.json").is_file()]
        summary = read_json(versions[-1] / "summary.json") if versions else None
        if summary is None:
            rc = marker["returncode"] = 1
            stderr = (
                "error: fit exited 0 but wrote no summary.json under "
                f"{shown(a.run.folder, sweep.root)}/lightning_logs (does a config set trainer.logger?)"
            )
        else:
            marker["version"] = versions[-1].name
            write_marker(a.run.folder, marker)
            say(f"{tag} done    {a.run.label}: {_final_text(summary)}, {seconds:.0f} s")
            return "done"
    line = error_line(stderr, rc)
    marker["error"] = line
    write_marker(a.run.folder, marker)
    say(f"{tag} failed  {a.run.label}: {line} (log: {shown(a.err_path, sweep.root)})")
    return f"failed: {line}"


def _stop(active: list[_Active]) -> None:
    """Stop the active runs: SIGINT (Lightning stops after the round), then SIGTERM, then SIGKILL."""
    for a in active:
        if a.proc.poll() is None:
            a.proc.send_signal(signal.SIGINT)
    deadline = time.monotonic() + 20
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for a in active:
            try:
                a.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                a.proc.send_signal(sig)
        deadline = time.monotonic() + 10
    for a in active:
        a.proc.wait()
    say(f"interrupted: {len(active)} run(s) stopped; start the sweep again to resume them from last.ckpt")


def print_commands(sweep: Sweep, runs: list[Run], threads: int | None, extra: list[str]) -> int:
    todo = 0
    prefix = "" if Path.cwd().resolve() == sweep.root else f"cd {shlex.quote(str(sweep.root))} && "
    env = f"OMP_NUM_THREADS={threads} " if threads is not None else ""
    for run in runs:
        state = run_state(run)
        if state.kind == "finished":
            continue
        todo += 1
        say(prefix + env + shlex.join(fit_command(sweep, run, threads, state.ckpt, extra, "python")))
    sys.stderr.write(
        f"# {todo} of {len(runs)} runs to do; then: python -m fl_lightning sweep {sweep.path} --report\n"
    )
    return 0
