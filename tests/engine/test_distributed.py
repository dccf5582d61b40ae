"""Parallel clients over processes: assignment, and 2-process runs against the 1-process run."""

import os
import subprocess
from pathlib import Path

import pytest
import torch

from fl_lightning.cli import main
from fl_lightning.engine.distributed import assign_clients
from fl_lightning.engine.record import RoundRecord

from conftest import FORK, run_folder
from programs import PROGRAM, run_program

TESTS = Path(__file__).resolve().parents[1]
# Two processes sum their clients' weighted uploads before the all-reduce, one process sums them all
# in sequence: the global weights agree up to float32 summation order, ~1e-7 relative per round.
ATOL = 1e-5


def test_lpt_assignment_balances_sample_counts():
    sizes = {0: 100, 1: 90, 2: 50, 3: 40, 4: 10, 5: 10}
    parts = assign_clients(list(sizes), sizes, 2)
    assert parts == [[0, 3, 4], [1, 2, 5]]  # loads 150 and 150
    assert sorted(c for p in parts for c in p) == list(sizes)
    assert assign_clients([3, 1], {1: 5, 3: 5}, 4) == [[1], [3], [], []]  # ties: smaller id, lower rank
    assert assign_clients([0, 1, 2], sizes, 1) == [[0, 1, 2]]


COMMON = [
    "--trainer.accelerator=cpu",
    "--trainer.max_steps=3",
    "--trainer.enable_progress_bar=false",
    "--data.num_clients=6",
    "--model.participation=0.5",
    "--model.local_steps=3",
    "--model.eval_clients_every=0",
]


def _run(tmp: Path, devices: int, *extra: str, fork: bool = True) -> dict:
    """The last checkpoint of ``fit`` in ``devices`` processes: forked (:data:`conftest.FORK`), or with
    ``fork=False`` started by Lightning's default launcher (a second Python running the command again)."""
    tmp.mkdir(parents=True, exist_ok=True)
    args = ["fit", *COMMON, *extra, f"--trainer.default_root_dir={tmp}"]
    if devices == 1:
        main(args)
    else:
        env = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        if fork:  # the ranks fork from one process: that process may be forked too (tests/programs.py)
            proc = run_program([*args, f"--trainer.devices={devices}", FORK], cwd=tmp, env=env, timeout=300)
        else:  # Lightning's launcher starts `python -m fl_lightning ...` again: a real program start
            cmd = [*PROGRAM, *args, f"--trainer.devices={devices}"]
            proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    ckpt = next((run_folder(tmp) / "checkpoints").glob("*.ckpt"))
    return torch.load(ckpt, weights_only=False)


def _assert_same_run(one: dict, two: dict) -> None:
    w1, w2 = one["state_dict"], two["state_dict"]
    assert w1.keys() == w2.keys()
    for k in w1:
        torch.testing.assert_close(w1[k], w2[k], rtol=0, atol=ATOL)
    s1, s2 = one["fl_lightning"]["client_state"], two["fl_lightning"]["client_state"]
    assert s1.keys() == s2.keys()
    for cid in s1:
        for k in s1[cid]:
            torch.testing.assert_close(s1[cid][k], s2[cid][k], rtol=1e-4, atol=ATOL)
    h1, h2 = ([RoundRecord.from_dict(r) for r in c["fl_lightning"]["history"]] for c in (one, two))
    assert [(r.clients, r.bytes_up, r.failed) for r in h1] == [(r.clients, r.bytes_up, r.failed) for r in h2]
    # the round's train metrics merge every client's metric state, whichever process trained it
    for key in ("train_loss", "train_acc"):
        assert [r.train[key] for r in h1] == pytest.approx([r.train[key] for r in h2], rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy", ["FedAvg", "fl_test_strategies.Stateful", "fl_test_strategies.MedianFedAvg"]
)
def test_two_processes_match_one_process(tmp_path, strategy, monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    extra = [f"--model.strategy={strategy}"]
    one = _run(tmp_path / "one", 1, *extra)
    two = _run(tmp_path / "two", 2, *extra, fork=strategy != "FedAvg")  # FedAvg: the default launcher
    _assert_same_run(one, two)
    if "Stateful" in strategy:  # per-client state exists and followed its client across processes
        assert one["fl_lightning"]["client_state"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy",
    [
        ["--model.strategy=Median"],
        ["--model.strategy=TrimmedMean", "--model.strategy.beta=0.2"],
        ["--model.strategy=Krum", "--model.strategy.f=1", "--model.strategy.m=2"],
        ["--model.strategy=NormBounded", "--model.strategy.max_norm=0.5"],
    ],
    ids=lambda a: a[0].split("=")[1],
)
def test_robust_aggregation_under_attack_two_processes_match_one_process(tmp_path, strategy):
    """Median/Krum need every upload, not a sum: the processes all-gather them in client-id order.

    Every client trains each round (6 clients, 3 per process), 2 of them send sign-flipped updates
    (model.attack, drawn from the run seed on each process alike), and the robust reduction on each
    process sees the same 6 uploads in the same order as the 1-process run.
    """
    extra = [*strategy, "--model.participation=1.0", "--model.attack.fraction=0.34", "--model.attack.scale=3"]
    one = _run(tmp_path / "one", 1, *extra)
    two = _run(tmp_path / "two", 2, *extra)
    _assert_same_run(one, two)
    assert one["fl_lightning"]["hparams"]["model.attack.fraction"] == 0.34


@pytest.mark.slow
def test_failing_clients_are_excluded_on_any_process(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    extra = [
        "--model.strategy=fl_test_strategies.FailOn",
        "--model.strategy.raise_on=[0,1]",
        "--model.strategy.nan_on=[2,3]",
        "--model.participation=1.0",
    ]
    two = _run(tmp_path / "two", 2, *extra)
    assert [r["failed"] for r in two["fl_lightning"]["history"]] == [4, 4, 4]
    assert all(torch.isfinite(v).all() for v in two["state_dict"].values())


@pytest.mark.slow
def test_two_processes_with_vectorised_clients_match_one_sequential_process(tmp_path, monkeypatch):
    """Each process vectorises its own share of the round (here 2 of 3 clients on one, 1 on the other)."""
    monkeypatch.syspath_prepend(str(TESTS))
    one = _run(tmp_path / "one", 1, "--model.strategy=Scaffold")
    two = _run(
        tmp_path / "two",
        2,
        "--model.strategy=Scaffold",
        "--model.runtime.vectorize=4",
        "--model.runtime.vectorize_cpu=batched",
    )
    _assert_same_run(one, two)
    # the process with 2 of the round's 3 clients trained them as one group, every round
    assert [r["vectorised_clients"] for r in two["fl_lightning"]["history"]] == [2, 2, 2]
