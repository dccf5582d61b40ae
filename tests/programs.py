"""``python -m fl_lightning ...`` for the tests, without paying a Python start each time.

A fresh ``python -m fl_lightning`` spends about 9 s of CPU on the 2-core machine importing torch, Lightning
(which imports torchmetrics, torchvision and ``torch._dynamo``) and fl_lightning before its first line of
work: more than the two-process runs of the policy matrix compute. :func:`run_program` starts the same
command from a process that imported all of that once (Python's ``forkserver``, one per test worker): the
forked child takes the command's arguments, working folder and environment (``PYTHONPATH``'s folders go
first on ``sys.path``, ``OMP_NUM_THREADS`` sets torch's threads as a new process would read it), runs
``fl_lightning``'s ``__main__`` as ``python -m`` does, and gives back its exit status and its stdout and
stderr as :func:`subprocess.run` gives them (``capture_output=True, text=True``). The child leads its own
process group, so a timeout stops the ranks it forked too.

What this does not check is the start of a program itself (the interpreter, the console script, an import
failing in a new process): ``tests/test_cli.py::test_module_entry_point_runs_as_a_program`` and the
README's commands (``tests/test_readme.py``) start real processes, and so do the runs that Lightning's
default ``ddp`` launcher starts (``tests/engine/test_distributed.py``).
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: What the fork server imports once: everything ``python -m fl_lightning fit`` imports before it works.
PRELOAD = ["fl_lightning.cli", "fl_lightning.sweep", "lightning.pytorch.loggers.tensorboard"]

#: The command the helpers below stand in for (its arguments follow).
PROGRAM = [sys.executable, "-m", "fl_lightning"]

#: Python's fork server for this process (started at its first use, then kept); it imports :data:`PRELOAD`.
_SERVER = multiprocessing.get_context("forkserver")
_SERVER.set_forkserver_preload([*PRELOAD, __name__])


def _child(
    args: list[str],
    cwd: str,
    env: dict[str, str],
    out: str,
    err: str,
    append: bool = False,
    fork_programs: bool = False,
    preexec_fn: Callable[[], Any] | None = None,
    prelude: str = "",
) -> None:
    """The forked process: ``python -m fl_lightning *args`` in ``cwd`` with ``env``, its output into the
    files ``out`` and ``err`` (``append``: after what they hold); never returns. ``fork_programs``: the
    ``python -m fl_lightning`` processes it starts (a sweep's runs) are forked from it (:class:`ForkedPopen`).
    """
    os.setsid()
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC))
        os.dup2(target, fd)
        os.close(target)
    if preexec_fn is not None:
        preexec_fn()
    if fork_programs:
        subprocess.Popen = _forking_popen(subprocess.Popen)  # type: ignore[misc]
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.path[:0] = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if env.get("OMP_NUM_THREADS"):
        import torch

        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    sys.argv = ["-m", *args]
    code: int | str | None = 0
    try:
        if prelude:
            exec(compile(prelude, "<prelude>", "exec"), {"__name__": "__prelude__"})
        runpy.run_module("fl_lightning", run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        code = stop.code
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        if isinstance(code, str):  # sys.exit("message"): printed, status 1
            sys.stderr.write(code + "\n")
        status = code if isinstance(code, int) else (0 if code is None else 1)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(status)


def _text(path: Path) -> str:
    """As :func:`subprocess.run` decodes a captured stream with ``text=True`` (universal newlines)."""
    data = path.read_bytes() if path.is_file() else b""  # none: the child failed before it ran
    return data.decode().replace("\r\n", "\n").replace("\r", "\n")


@dataclass
class Program:
    """A started :func:`start_program`: :meth:`finish` waits for it."""

    args: list[str]
    process: multiprocessing.process.BaseProcess
    folder: tempfile.TemporaryDirectory

    def finish(self, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """Its exit status and output, as :func:`subprocess.run` gives them (``TimeoutExpired`` after
        ``timeout`` s, its process group killed)."""
        cmd = [*PROGRAM, *self.args]
        out, err = Path(self.folder.name, "stdout"), Path(self.folder.name, "stderr")
        try:
            self.process.join(timeout)
            if self.process.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.join()
                raise subprocess.TimeoutExpired(cmd, timeout, _text(out), _text(err))
            # exitcode -N: killed by signal N, as Popen says it
            return subprocess.CompletedProcess(cmd, self.process.exitcode, _text(out), _text(err))
        finally:
            self.folder.cleanup()


def start_program(
    args: Sequence[str],
    cwd: str | os.PathLike[str],
    env: Mapping[str, str] | None = None,
    fork_programs: bool = False,
    prelude: str = "",
) -> Program:
    """``subprocess.Popen([sys.executable, "-m", "fl_lightning", *args], cwd=cwd, env=env, ...)`` with
    captured output, forked from the worker's preloaded server. ``fork_programs``: the ``python -m
    fl_lightning`` processes the command starts are forked from it; ``prelude``: Python code the process
    runs first (as ``python -c`` would before calling the program's ``main``), e.g. to wait at a barrier."""
    folder = tempfile.TemporaryDirectory(prefix="fl-program-")
    process = _SERVER.Process(
        target=_child,
        args=(list(args), str(cwd), dict(os.environ if env is None else env)),
        kwargs={
            "out": str(Path(folder.name, "stdout")),
            "err": str(Path(folder.name, "stderr")),
            "fork_programs": fork_programs,
            "prelude": prelude,
        },
        name="MainProcess",
    )
    process.start()
    return Program(list(args), process, folder)


def run_program(
    args: Sequence[str],
    cwd: str | os.PathLike[str],
    env: Mapping[str, str] | None = None,
    timeout: float = 600,
    fork_programs: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([sys.executable, "-m", "fl_lightning", *args], cwd=cwd, env=env,
    capture_output=True, text=True, timeout=timeout)``, forked from the worker's preloaded server
    (:func:`start_program`)."""
    return start_program(args, cwd, env, fork_programs=fork_programs).finish(timeout)


class ForkedPopen:
    """What :class:`subprocess.Popen` gives for ``[sys.executable, "-m", "fl_lightning", ...]`` (with
    ``stdout``/``stderr`` files, as a sweep starts its runs), forked from the calling process: a program
    child (:func:`_child`) that imported everything already and runs no other thread."""

    def __init__(
        self,
        cmd: list[str],
        cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        stdout: Any = None,
        stderr: Any = None,
        preexec_fn: Callable[[], Any] | None = None,
    ) -> None:
        self.args = cmd
        self.returncode: int | None = None
        self._proc = multiprocessing.get_context("fork").Process(
            target=_child,
            args=(cmd[len(PROGRAM) :], str(cwd or os.getcwd()), dict(os.environ if env is None else env)),
            kwargs={"out": stdout.name, "err": stderr.name, "append": True, "preexec_fn": preexec_fn},
            name="MainProcess",
        )
        self._proc.start()
        self.pid = self._proc.pid

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._proc.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._proc.join(timeout)
        code = self.poll()
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)


def _forking_popen(real: type[subprocess.Popen]) -> Callable[..., Any]:
    """``subprocess.Popen`` that forks ``python -m fl_lightning`` commands (:class:`ForkedPopen`)."""

    def popen(cmd: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(cmd, list) and cmd[: len(PROGRAM)] == PROGRAM and not args:
            return ForkedPopen(cmd, **kwargs)
        return real(cmd, *args, **kwargs)

    return popen
