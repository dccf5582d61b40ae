"""Shared fixtures: tiny federations on the embedded digits data and fast Trainers."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch import Trainer

from fl_lightning.api.client import ClientModule
from fl_lightning.data import IID, Dirichlet, FederatedDataModule
from fl_lightning.engine import Engine, EngineConfig, LocalConfig, default_executor
from fl_lightning.engine.runtime import Runtime
from fl_lightning.lightning.module import FederatedModule
from fl_lightning.lightning.trainer import ROUND_DEFAULTS
from fl_lightning.models import SmallCNN
from fl_lightning.runs import run_number
from fl_lightning.strategies import FedAvg, Strategy

torch.set_num_threads(1)


#: How the tests' two-process runs start their processes: Lightning's fork launcher forks both ranks from the
#: one process that imported fl_lightning already, where the default ``ddp`` launcher starts a second Python
#: that imports torch, Lightning and fl_lightning again (about 9 s of CPU on the 2-core machine, per run).
#: The engine's processes do the same work either way; ``tests/engine/test_distributed.py`` keeps the
#: default launcher (FedAvg, failing clients) so that both launchers are tested.
FORK = "--trainer.strategy=ddp_fork"

#: With ``--dist loadgroup`` (the README's ``python -m pytest -n auto --dist loadgroup``) the tests of this
#: group run on one worker, one after the other: they start Ray or a SuperLink with SuperNodes (several
#: processes each, minutes of wall time), so two of them at once would only share the cores and ports.
FLOWER_PROCESSES = "flower_processes"
#: Test files whose ``slow`` tests take longest (``python -m pytest --durations=40``), started right after
#: that group so that no long test starts last and keeps one worker busy while the others are done.
LONGEST = (
    "tests/sweep/test_runner.py",
    "tests/engine/test_policies.py",
    "tests/strategies/test_cfl.py",
    "tests/engine/test_distributed.py",
)


def _run_order(item: pytest.Item) -> int:
    """0: the Flower processes' group, 1: the longest files' slow tests, 2: other slow tests, 3: the rest."""
    if any(m.args[:1] == (FLOWER_PROCESSES,) for m in item.iter_markers("xdist_group")):
        return 0
    if item.get_closest_marker("slow") is None:
        return 3
    return 1 if item.nodeid.split("::")[0] in LONGEST else 2


@pytest.hookimpl(trylast=True)  # after pytest's own ordering by fixtures, which it keeps within each rank
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``cuda`` (the GPU lane, ``python -m pytest -m cuda``) skip without a CUDA device; under
    pytest-xdist the longest tests go first (:func:`_run_order`; a stable sort, the same on every worker,
    whose collection is what the scheduler hands out in order)."""
    if hasattr(config, "workerinput"):  # an xdist worker
        items.sort(key=_run_order)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


def make_data(**kw: Any) -> FederatedDataModule:
    args: dict[str, Any] = {
        "num_clients": 4,
        "partition": Dirichlet(alpha=0.5, min_size=10),
        "batch_size": 32,
    }
    args.update(kw)
    return FederatedDataModule(**args)


def make_module(
    strategy: Strategy | None = None,
    width: int = 4,
    client_kw: dict | None = None,
    runtime: dict | None = None,
    **kw: Any,
) -> FederatedModule:
    """A module of a SmallCNN client, 2 local steps; ``runtime``: fields of its :class:`Runtime`."""
    torch.manual_seed(0)
    client = ClientModule(
        SmallCNN(in_channels=1, num_classes=10, width=width, hidden=16),
        lr=0.1,
        **{"momentum": 0.0, **(client_kw or {})},
    )
    kw.setdefault("local_steps", 2)
    # model.runtime.vectorize's groups train batched, not as measured
    kw["runtime"] = Runtime(**{"vectorize_cpu": "batched", **(runtime or {})})
    return FederatedModule(client=client, strategy=strategy or FedAvg(), **kw)


def make_trainer(tmp_path, rounds: int = 2, **kw: Any) -> Trainer:
    args = {
        **ROUND_DEFAULTS,
        "max_steps": rounds,
        "default_root_dir": str(tmp_path),
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "accelerator": "cpu",
        "devices": 1,
    }
    args.update(kw)
    return Trainer(**args)


def run_folder(root: str | Path, n: int = 0) -> Path:
    """The run folder number ``n`` under ``<root>/lightning_logs``: ``version_<n>``, or labelled
    ``version_<n>-<label>`` (a run's ``--name``; by default its strategy and split, ``version_0-fedavg-iid``).

    Fails the test unless exactly one folder has that number.
    """
    logs = Path(root, "lightning_logs")
    found = [p for p in logs.iterdir() if run_number(p) == n] if logs.is_dir() else []
    names = sorted(p.name for p in logs.iterdir()) if logs.is_dir() else []
    assert len(found) == 1, f"run folder number {n} under {logs}: found {names}"
    return found[0]


def run_numbers(root: str | Path) -> list[int]:
    """The numbers of the run folders under ``<root>/lightning_logs`` (labelled or not), sorted."""
    logs = Path(root, "lightning_logs")
    return sorted(n for p in logs.iterdir() if (n := run_number(p)) is not None) if logs.is_dir() else []


def global_weights(module: FederatedModule) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.client.state_dict().items()}


@pytest.fixture
def fit(tmp_path):
    """Run ``rounds`` rounds of ``module`` on ``data``; returns the trainer.

    A client whose local work raised or uploaded non-finite values is excluded from its round and the run
    goes on (``model.tolerate_client_failures``), so a broken feature could pass a test that only compares
    weights; the fixture therefore fails the test when a client failed, unless ``allow_failed_clients``.
    """

    def run(
        module: FederatedModule,
        data: FederatedDataModule | None = None,
        rounds: int = 2,
        allow_failed_clients: bool = False,
        **trainer_kw: Any,
    ):
        trainer = make_trainer(tmp_path, rounds=rounds, **trainer_kw)
        trainer.fit(module, datamodule=data or make_data())
        failed = [(r.round, r.failed) for r in module.history if r.failed]
        assert allow_failed_clients or not failed, f"clients failed (round, count): {failed}"
        return trainer

    return run


def make_engine(
    strategy: Strategy | None = None,
    num_clients: int = 4,
    seed: int = 0,
    local_steps: int = 2,
    batch_size: int = 8,
    width: int = 4,
    **config: Any,
) -> Engine:
    """An engine (no Lightning) over ``num_clients`` IID digits clients, set up and ready for rounds."""
    data = make_data(num_clients=num_clients, partition=IID(), batch_size=batch_size, local_test_fraction=0.0)
    data.setup("fit")
    torch.manual_seed(0)
    client = ClientModule(
        SmallCNN(in_channels=1, num_classes=10, width=width, hidden=16), lr=0.1, momentum=0.0
    )
    local = LocalConfig(batch_size=batch_size, local_steps=local_steps, seed=seed)
    engine = Engine(client, strategy or FedAvg(), EngineConfig(local, **config))
    engine.setup(data.clients, data.task, data.num_classes, executor=default_executor(local))
    return engine


@pytest.fixture(autouse=True)
def _no_global_seed_across_tests(monkeypatch):
    """``seed=None`` follows the last ``seed_everything`` of the process (``PL_GLOBAL_SEED``): a test that
    seeds (the command line always does) must not change the seed of the modules the next test builds."""
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)


#: The checkout's top-level entries when the session started (tests never write into the checkout).
_CHECKOUT = Path(__file__).resolve().parents[1]
_TOP_LEVEL_BEFORE: set[str] = set()


def pytest_sessionstart(session: pytest.Session) -> None:
    _TOP_LEVEL_BEFORE.update(p.name for p in _CHECKOUT.iterdir())


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the session when a test left a file or folder at the checkout's top level (a run without a
    ``default_root_dir`` writes its ``lightning_logs`` or its summary to the working directory)."""
    if not _TOP_LEVEL_BEFORE:
        return
    new = sorted(p.name for p in _CHECKOUT.iterdir() if p.name not in _TOP_LEVEL_BEFORE and p.name[0] != ".")
    if new:
        sys.stderr.write(f"\nerror: tests wrote into the checkout: {', '.join(new)} (give them a tmp_path)\n")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
