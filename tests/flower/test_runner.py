"""The ClientApp runner's asks for tasks (``fl_lightning.flower.runner``); its tasks run in the federation
tests (``test_secure_deployment.py``)."""

from __future__ import annotations

import threading

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
    """A stop event whose waits are recorded instead of slept; set once the script is used up."""

    def __init__(self, runtime: _Runtime) -> None:
        super().__init__()
        self.runtime = runtime
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(round(timeout, 4))
        if not self.runtime.script:
            self.set()
        return self.is_set()


def test_an_idle_runner_asks_less_and_less_often_and_quickly_again_after_a_task(monkeypatch):
    runtime = _Runtime(["", "", "", "", "", "", "", "", "", "t1", "", "", "t2", ""])
    ran: list[str] = []
    monkeypatch.setattr(runner_module, "runtime_tls", lambda *args: (True, None))
    monkeypatch.setattr(ClientAppRunner, "_client", lambda self, *interceptors: runtime)
    monkeypatch.setattr(ClientAppRunner, "run_task", lambda self, token: ran.append(token))
    stop = _Stop(runtime)
    ClientAppRunner("127.0.0.1:9094").serve(stop)
    assert ran == ["t1", "t2"]
    idle = [0.05, 0.075, 0.1125, 0.1688, 0.2531, 0.3797, 0.5695, 0.8543, 1.0]  # x1.5 up to 1 s (Flower's)
    assert stop.waits == [*idle, 0.05, 0.075, 0.05]
