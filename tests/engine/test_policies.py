"""Every policy on every path: the same stop round and the same global weights.

Each policy — a DP budget that stops the run (``privacy/*`` reported), ``model.attack``, failure tolerance
on and off, ``max_failed_rounds``, resume, and the client system model (FedProx's stragglers with partial
work; devices with availability, mid-round dropout, a deadline cutting work and over-selection; FedBuff's
asynchronous schedule, resumed with clients in flight) — runs under one process, vectorised clients, two
processes (DDP, gloo) and Flower's grid (in-process nodes running the ClientApp). The engine owns every
policy, so each path must end at the same round with the same global model (within 1e-5: two processes sum
their clients' uploads in another order) and the same simulated clock as the one-process run. The
two-process column is ``slow``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from fl_lightning.cli import FederatedCLI
from fl_lightning.engine.record import RoundRecord
from fl_lightning.errors import RunError
from fl_lightning.runs import latest_run

from conftest import FORK
from programs import run_program

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
ATOL = 1e-5

COMMON = [
    "--trainer.accelerator=cpu",
    "--trainer.enable_progress_bar=false",
    "--data.num_clients=6",
    "--model.participation=0.5",
    "--model.local_steps=3",
    "--model.eval_clients_every=0",
]
FAIL_ON = "--model.strategy=fl_test_strategies.FailOn"

#: policy -> (the run's arguments, the rounds it asks for, a resume of it to this many rounds or None)
POLICIES: dict[str, tuple[list[str], int, int | None]] = {
    "dp_budget": (
        [
            "--config=configs/dp/dp_fedavg_digits.yaml",
            "--trainer.enable_progress_bar=false",
            "--data.num_clients=10",
            "--model.clients_per_round=5",
            "--model.local_epochs=1",
            "--model.strategy.init_args.target_epsilon=2",
        ],
        4,
        None,
    ),
    "attack": (
        [*COMMON, "--model.attack.kind=scale", "--model.attack.fraction=0.34", "--model.attack.scale=3"],
        3,
        None,
    ),
    "tolerated_failures": (
        [*COMMON, FAIL_ON, "--model.strategy.raise_on=[0,1]", "--model.strategy.nan_on=[2,3]"],
        3,
        None,
    ),
    "failures_not_tolerated": (
        [*COMMON, FAIL_ON, "--model.strategy.raise_on=[5]", "--model.tolerate_client_failures=false"],
        4,
        None,
    ),
    "max_failed_rounds": (
        [*COMMON, FAIL_ON, "--model.strategy.nan_on=[0,1,2,3,4,5]", "--model.max_failed_rounds=2"],
        4,
        None,
    ),
    # a strategy whose clients keep no state: a Flower node keeps its client's state in the Flower run's
    # context, which a resumed (new) Flower run does not have (test_executor.py: refused with one line)
    "resume": ([*COMMON, "--model.strategy=FedAvgM", "--model.strategy.server_lr=0.5"], 2, 4),
    # the engine decides each client's steps; the executors (Flower's message included) run exactly them
    "stragglers_partial": (
        [
            *COMMON,
            "--model.system=Stragglers",
            "--model.system.fraction=0.5",
            "--model.round_policy.policy=partial",
        ],
        3,
        None,
    ),
    "devices_deadline": (
        [
            *COMMON,
            "--model.strategy=FedNova",
            "--model.system=Devices",
            "--model.round_policy.deadline_s=1.2",
            "--model.round_policy.policy=partial",
            "--model.round_policy.over_selection=0.5",
            "--model.system.availability=0.8",
            "--model.system.dropout=0.2",
        ],
        4,
        None,
    ),
    "fedbuff_resume": (
        [*COMMON, "--model.strategy=FedBuff", "--model.system=Devices", "--model.system.dropout=0.1"],
        2,
        4,
    ),
}


@dataclass
class Outcome:
    """What a run left: its checkpoint's rounds, global weights and history, and its error line."""

    rounds: int
    weights: dict[str, torch.Tensor]
    history: list[RoundRecord]
    error: str


def _outcome(folder: Path, error: str) -> Outcome:
    ckpt = latest_run(folder) / "checkpoints" / "last.ckpt"
    saved = torch.load(ckpt, weights_only=True)
    history = [RoundRecord.from_dict(r) for r in saved["fl_lightning"]["history"]]
    return Outcome(saved["global_step"], saved["state_dict"], history, error)


def _in_process(folder: Path, args: list[str], ckpt: str | None) -> str:
    try:
        FederatedCLI(args=["fit", *args, *([f"--ckpt_path={ckpt}"] if ckpt else [])])
    except RunError as err:
        return str(err)
    return ""


def _two_processes(folder: Path, args: list[str], ckpt: str | None) -> str:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = ["fit", *args, "--trainer.devices=2", FORK, *([f"--ckpt_path={ckpt}"] if ckpt else [])]
    proc = run_program(cmd, cwd=ROOT, env=env, timeout=300)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    assert (proc.returncode == 1) == bool(lines), proc.stderr[-3000:]
    return lines[0].removeprefix("error: ") if lines else ""


def _flower(folder: Path, args: list[str], ckpt: str | None) -> str:
    pytest.importorskip("flwr")
    from flower_helpers import LocalGrid
    from flwr.supercore.task_identity import TaskIdentity

    from fl_lightning.flower import client_app, fit_on_grid

    config = next((a.split("=", 1)[1] for a in args if a.startswith("--config=")), None)
    rest = [a for a in args if not a.startswith("--config=")]
    config = config or str(TESTS / "engine" / "policies.yaml")
    with pytest.MonkeyPatch.context() as mp:  # the ids Flower's runtimes set, here the test's
        for attr, value in (("_run_id", 1), ("_task_id", 1), ("_node_id", 0)):
            mp.setattr(TaskIdentity, attr, value)
        num_clients = next(int(a.split("=")[1]) for a in rest if a.startswith("--data.num_clients="))
        grid = LocalGrid(client_app(ROOT / config, rest), num_clients)
        try:
            fit_on_grid(grid, ROOT / config, rest, ckpt_path=ckpt, wait_for_nodes=1)
        except RunError as err:
            return str(err)
    return ""


PATHS = {
    "one_process": (_in_process, []),
    "vectorised": (_in_process, ["--model.runtime.vectorize=4", "--model.runtime.vectorize_cpu=batched"]),
    "flower": (_flower, []),
    "two_processes": (_two_processes, []),
}


def _run(path: str, policy: str, folder: Path) -> Outcome:
    runner, extra = PATHS[path]
    args, rounds, resume_to = POLICIES[policy]
    args = [*args, *extra, f"--trainer.default_root_dir={folder}"]
    error = runner(folder, [*args, f"--trainer.max_steps={rounds}"], None)
    if resume_to is not None:
        last = latest_run(folder) / "checkpoints" / "last.ckpt"
        error = runner(folder, [*args, f"--trainer.max_steps={resume_to}"], str(last))
    return _outcome(folder, error)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """The one-process outcome of each policy (computed once)."""
    cache: dict[str, Outcome] = {}

    def get(policy: str) -> Outcome:
        if policy not in cache:
            cache[policy] = _run("one_process", policy, tmp_path_factory.mktemp(f"base-{policy}"))
        return cache[policy]

    return get


def _expected(policy: str, base: Outcome) -> None:
    """What the one-process run itself must show for each policy."""
    records = base.history
    if policy == "dp_budget":
        assert base.rounds == 2 and not base.error  # stopped cleanly before the round that overspends
        assert all(0 < r.strategy["privacy/epsilon"] <= 2 for r in records)
    elif policy == "attack":
        assert base.rounds == 3 and not base.error
    elif policy == "tolerated_failures":
        assert [r.failed for r in records] == [sum(c < 4 for c in r_clients) for r_clients in _sampled(3)]
    elif policy == "failures_not_tolerated":
        first = next(t for t, clients in enumerate(_sampled(4)) if 5 in clients)
        assert first > 0 and base.rounds == first and "client 5 failed" in base.error
    elif policy == "max_failed_rounds":
        assert base.rounds == 1 and "every sampled client failed for 2 consecutive rounds" in base.error
    elif policy == "resume":
        assert base.rounds == 4 and [r.this_run for r in records] == [False, False, True, True]
    elif policy == "stragglers_partial":
        assert base.rounds == 3 and all(r.sim.partial == 1 for r in records)  # round(1.5) = 2 active
        assert all(sorted(r.client_steps.values()) in ([1, 3, 3], [2, 3, 3]) for r in records)
    elif policy == "devices_deadline":
        assert base.rounds == 4 and sum(r.sim.partial for r in records) > 0
        assert sum(r.sim.dropped_out for r in records) > 0 and sum(r.sim.discarded for r in records) > 0
        assert [r.failed for r in records] == [r.sim.dropped_out for r in records]
    elif policy == "fedbuff_resume":
        assert base.rounds == 4 and [r.this_run for r in records] == [False, False, True, True]
    if policy in ("stragglers_partial", "devices_deadline", "fedbuff_resume"):
        clock = [r.sim.time_s for r in records]
        assert clock == sorted(clock) and clock[0] > 0


def _sampled(rounds: int) -> list[list[int]]:
    from fl_lightning.functional.sampling import sample_clients

    return [sample_clients(6, 3, 0, r) for r in range(rounds)]


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize(
    "path", ["one_process", "vectorised", "flower", pytest.param("two_processes", marks=pytest.mark.slow)]
)
def test_a_policy_holds_on_every_path(tmp_path, baseline, monkeypatch, policy, path):
    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.syspath_prepend(str(TESTS / "flower"))
    monkeypatch.chdir(ROOT)
    base = baseline(policy)
    if path == "one_process":
        _expected(policy, base)
        if policy in (
            "resume",
            "fedbuff_resume",
        ):  # the resumed run is bit-identical to the uninterrupted one
            args, _, rounds = POLICIES[policy]
            _in_process(
                tmp_path,
                [*args, f"--trainer.default_root_dir={tmp_path}", f"--trainer.max_steps={rounds}"],
                None,
            )
            straight = _outcome(tmp_path, "")
            assert all(torch.equal(straight.weights[k], base.weights[k]) for k in base.weights)
        return
    other = _run(path, policy, tmp_path)
    assert other.rounds == base.rounds, other.error
    assert bool(other.error) == bool(base.error)
    assert base.weights.keys() == other.weights.keys()
    for name in base.weights:
        torch.testing.assert_close(other.weights[name], base.weights[name], rtol=0, atol=ATOL)
    assert [r.failed for r in other.history] == [r.failed for r in base.history]

    def clock(r: RoundRecord) -> tuple:  # the simulated clock and the steps taken
        return (r.sim and r.sim.time_s, r.client_steps, r.sim and r.sim.staleness_max)

    assert [clock(r) for r in other.history] == [clock(r) for r in base.history]
    reported = [r.strategy for r in base.history]  # e.g. privacy/epsilon
    assert [r.strategy.keys() for r in other.history] == [r.keys() for r in reported]
    for mine, theirs in zip(other.history, reported, strict=True):
        assert mine.strategy == pytest.approx(theirs)
