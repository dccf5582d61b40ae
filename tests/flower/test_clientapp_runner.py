"""The ClientApp runner's asks for tasks (``fl_lightning.flower.runner``; ``test_runner.py`` is the
sweep's, and pytest needs test files named apart); its tasks run in the federation tests
(``test_secure_deployment.py``)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from fl_lightning.flower import runner as runner_module
from fl_lightning.flower.runner import ClientAppRunner


class _Reply:
    def __init__(self, token: str) -> None:
        self.token = token

    def HasField(self, name: str) -> bool:  # noqa: N802 (protobuf's name)
        return bool(self.token)


class _Runtime:
    """A SuperNode's Runtime API whose asks return the tokens of ``script`` in turn ("": no task)."""

    def __init__(self, script: list[str]) -> None:
        self.script = list(script)

    def AcquireTask(self, request: object) -> _Reply:  # noqa: N802 (Flower's name)
        return _Reply(self.script.pop(0))

    def close(self) -> None:
        pass


class _Stop(threading.Event):
    """A stop event whose waits are recorded and passed on a fake clock (a task takes 1 s of it) instead of
    slept; set once the script is used up."""

    def __init__(self, runtime: _Runtime) -> None:
        super().__init__()
        self.runtime = runtime
        self.waits: list[float] = []
        self.now = 0.0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        self.now += timeout
        if not self.runtime.script:
            self.set()
        return self.is_set()


def test_an_idle_runner_asks_less_and_less_often_and_quickly_again_after_a_task(monkeypatch):
    """The wait between two asks is a twentieth of the time since the last task, from 0.05 s up to 1 s."""
    runtime = _Runtime(["", "", "", "t1", *[""] * 120, "t2", ""])
    ran: list[str] = []
    stop = _Stop(runtime)

    def run_task(self, token: str) -> None:
        ran.append(token)
        stop.now += 1.0

    monkeypatch.setattr(runner_module, "runtime_tls", lambda *args: (True, None))
    monkeypatch.setattr(runner_module, "time", SimpleNamespace(monotonic=lambda: stop.now))
    monkeypatch.setattr(ClientAppRunner, "_client", lambda self, *interceptors: runtime)
    monkeypatch.setattr(ClientAppRunner, "run_task", run_task)
    ClientAppRunner("127.0.0.1:9094").serve(stop)
    assert ran == ["t1", "t2"]
    assert stop.waits[:3] == [0.05, 0.05, 0.05]  # idle since the start: 0, 0.05, 0.1 s
    idle = stop.waits[3:-1]  # after t1
    assert idle[0] == 0.05 and idle[-1] == 1.0 and idle == sorted(idle)
    waited = [sum(idle[:i]) for i in range(len(idle))]
    assert idle == pytest.approx([max(0.05, min(1.0, t / 20)) for t in waited])
    assert stop.waits[-1] == 0.05  # right after t2: quickly again
