"""Scale-out measurements: rounds/second with 1 and 2 worker processes, peak memory vs clients.

    python benchmarks/scaling.py                 # both parts, prints the ratios
    python benchmarks/scaling.py --part speed    # only rounds/s (1 vs 2 processes, threads per process)
    python benchmarks/scaling.py --part memory   # only peak RSS for 100 vs 1000 stateful clients
    python benchmarks/scaling.py --part small    # small rounds: 1 vs 2 processes, 10 and 100 clients

Speed: the same config (digits, 20 clients, all sampled, SmallCNN, 20 local steps) runs through
``python -m fl_lightning fit`` with ``--trainer.devices 1`` and ``2`` (CPU, gloo); rounds/s is taken
from the rounds' own wall times (summary.json, process start-up excluded). With two
processes on two cores each process gets one intra-op thread (the default); the run with two
threads per process shows why (oversubscription). Targets: >= 1.7x with 2 workers on 2 cores.

Small rounds: what a process group costs per round besides the clients' work. Digits, SmallCNN, half
the clients per round, 5 local steps each, no validation: 10 clients (5 per round, a round of ~0.1 s
on one process) and 100 clients (50 per round); 1 vs 2 processes (one thread each), the rounds' own
mean wall time. Target: >= 1.4x with 2 processes.

Memory: every client keeps a model-size state (its last local model), 100 vs 1000 clients, 10 per
round, 3 visits per client on average (about 95% of the clients end up with a state); peak RSS of
the training process with the state store unbounded and with a memory budget (states beyond it on
disk). The round size is the same in both, so the unbounded store grows with the federation and the
budgeted one should not. Target: flat in the number of clients with a budget.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from fl_lightning.runs import latest_run, read_summary
from fl_lightning.strategies import FedAvg

HERE = Path(__file__).resolve().parent


class KeepLocalModel(FedAvg):
    """FedAvg whose clients keep their last local model as state (model-size state per client)."""

    def upload(self, module, ctx):
        up = super().upload(module, ctx)
        ctx.state.update({f"prev/{k}": v.detach().clone() for k, v in up["weights"].items()})
        return up


def _fit(args: list[str], root: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [
        sys.executable,
        "-m",
        "fl_lightning",
        "fit",
        *args,
        f"--trainer.default_root_dir={root}",
        "--trainer.enable_progress_bar=false",
        "--trainer.accelerator=cpu",
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=root)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    return read_summary(latest_run(root))


def speed(rounds: int) -> None:
    common = [
        f"--trainer.max_steps={rounds}",
        "--data.num_clients=20",
        "--data.partition=IID",
        "--model.local_steps=20",
        "--model.eval_clients_every=0",
        "--trainer.limit_val_batches=0",
    ]
    runs = {
        "1 process, 1 thread": ["--trainer.devices=1", "--model.runtime.threads_per_process=1"],
        "1 process, 2 threads": ["--trainer.devices=1", "--model.runtime.threads_per_process=2"],
        "2 processes, 1 thread each": ["--trainer.devices=2"],
        "2 processes, 2 threads each": ["--trainer.devices=2", "--model.runtime.threads_per_process=2"],
    }
    rate = {}
    for name, extra in runs.items():
        with tempfile.TemporaryDirectory() as tmp:
            rate[name] = 1.0 / _fit(common + extra, Path(tmp))["mean_round_s"]
        print(f"  {name:28s} {rate[name]:6.2f} rounds/s")
    base = rate["1 process, 1 thread"]
    two = rate["2 processes, 1 thread each"]
    print(f"speed-up, 2 processes (1 thread each) vs 1 process (1 thread): {two / base:.2f}x")
    print(
        f"speed-up, 2 processes (1 thread each) vs 1 process (2 threads): "
        f"{rate['2 processes, 1 thread each'] / rate['1 process, 2 threads']:.2f}x"
    )
    print(
        f"2 threads per process instead of 1, with 2 processes: "
        f"{rate['2 processes, 2 threads each'] / rate['2 processes, 1 thread each']:.2f}x"
    )


def small(rounds: int) -> None:
    for clients in (10, 100):
        common = [
            f"--trainer.max_steps={rounds}",
            f"--data.num_clients={clients}",
            "--data.partition=IID",
            "--model.participation=0.5",
            "--model.local_steps=5",
            "--model.eval_clients_every=0",
            "--trainer.limit_val_batches=0",
            "--trainer.enable_checkpointing=false",
        ]
        seconds = {}
        for devices in (1, 2):
            with tempfile.TemporaryDirectory() as tmp:
                seconds[devices] = _fit([*common, f"--trainer.devices={devices}"], Path(tmp))["mean_round_s"]
            print(
                f"  {clients:4d} clients, {devices} process(es): {1000 * seconds[devices]:7.1f} ms per round"
            )
        print(f"  {clients:4d} clients: 2 processes vs 1: {seconds[1] / seconds[2]:.2f}x")


# Runs fit in a fresh process and prints that process's own peak RSS (KiB) as the last line.
_PEAK = (
    "import resource, sys; from fl_lightning.cli import main; main(['fit', *sys.argv[1:]]); "
    "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
)


def memory() -> None:
    peak = {}
    for clients in (100, 1000):
        for budget in (None, 8):
            args = [
                f"--trainer.max_steps={3 * clients // 10}",  # 3 visits per client on average: ~95% trained
                f"--data.num_clients={clients}",
                "--data.partition=IID",
                "--data.local_test_fraction=0",
                "--model.clients_per_round=10",
                "--model.local_steps=1",
                "--model.eval_clients_every=0",
                "--trainer.limit_val_batches=0",
                "--model.strategy=scaling.KeepLocalModel",
                "--trainer.enable_checkpointing=false",
            ]
            if budget is not None:
                args.append(f"--model.runtime.state_memory_mb={budget}")
            with tempfile.TemporaryDirectory() as tmp:
                env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
                cmd = [
                    sys.executable,
                    "-c",
                    _PEAK,
                    *args,
                    f"--trainer.default_root_dir={tmp}",
                    "--trainer.enable_progress_bar=false",
                    "--trainer.accelerator=cpu",
                ]
                out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=tmp).stdout
            peak[(clients, budget)] = float(out.strip().splitlines()[-1]) / 1024  # KiB -> MiB (Linux)
            label = "unbounded" if budget is None else f"budget {budget} MiB"
            print(f"  {clients:5d} clients, store {label:14s} peak RSS {peak[(clients, budget)]:7.1f} MiB")
    print(f"peak RSS 1000/100 clients, unbounded store: {peak[(1000, None)] / peak[(100, None)]:.2f}x")
    print(f"peak RSS 1000/100 clients, 8 MiB budget:    {peak[(1000, 8)] / peak[(100, 8)]:.2f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=["speed", "small", "memory", "all"], default="all")
    p.add_argument("--rounds", type=int, default=8)
    args = p.parse_args()
    if args.part in ("speed", "all"):
        print("rounds/second (digits, 20 clients x 20 local steps, SmallCNN):")
        speed(args.rounds)
    if args.part in ("small", "all"):
        print("small rounds (digits, half the clients per round, 5 local steps, SmallCNN):")
        small(max(args.rounds, 10))
    if args.part in ("memory", "all"):
        print("peak memory, each client keeping a model-size state (SmallCNN, 210 KiB):")
        memory()


if __name__ == "__main__":
    main()
