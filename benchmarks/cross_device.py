"""Issue 33's check through the CLI: ``model.runtime.vectorize=100`` against ``=1``, alternating.

Each run is exactly the command below (``python -m fl_lightning fit``, a fresh process), with
``--model.runtime.vectorize=1`` then ``--model.runtime.vectorize=100``, ``--runs`` times each, alternating;
the CLI's defaults otherwise (validation and every client's evaluation after each round, a local test split
of 20% of each client's 60 samples: 48 to train on, 5 local steps, and the local evaluation of each trained
client). Printed per run: the seconds per round of the run's summary (``mean_round_s``: its training
rounds, the first round's measurement included), the steady round (median of rounds 2..R of
``round/time_s``), the run's wall time, its peak RSS and, for ``vectorize=100``, its ``vectorize/*``
record; then the fastest of the runs of each value and their ratios (target >= 2x per round).

    python benchmarks/cross_device.py                  # 2 runs each, 4 rounds
    python benchmarks/cross_device.py --runs 3 --rounds 6

The command (the 2NN is ``fl_lightning.models.MLP`` with ``in_features=784``; the bare name ``MLP`` is
ambiguous to the CLI, which also knows ``torchvision.ops.MLP``):

    python -m fl_lightning fit --data.dataset=fashion_mnist --data.num_clients=1000 --data.partition=IID \\
        --model.clients_per_round=100 --model.local_epochs=1 --data.batch_size=10 \\
        --model.client.net=fl_lightning.models.MLP --model.client.net.in_features=784 \\
        --model.client.net.hidden=[200,200] --model.client.lr=0.05 --model.client.momentum=0 \\
        --model.runtime.threads_per_process=1 --trainer.max_steps=4 --model.runtime.vectorize=100
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from fl_lightning.runs import latest_run, read_scalars

WORKLOAD = [
    "--data.dataset=fashion_mnist",
    "--data.num_clients=1000",
    "--data.partition=IID",
    "--model.clients_per_round=100",
    "--model.local_epochs=1",
    "--data.batch_size=10",
    "--model.client.net=fl_lightning.models.MLP",
    "--model.client.net.in_features=784",
    "--model.client.net.hidden=[200,200]",
    "--model.client.lr=0.05",
    "--model.client.momentum=0",
    "--model.runtime.threads_per_process=1",
]


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def run(vectorize: int, rounds: int, root: Path) -> dict:
    """One CLI run in a fresh process: its summary, steady round, wall time and peak RSS."""
    folder = root / f"vectorize{vectorize}"
    shutil.rmtree(folder, ignore_errors=True)
    cmd = [sys.executable, "-m", "fl_lightning", "fit", *WORKLOAD]
    cmd += [
        f"--trainer.max_steps={rounds}",
        f"--model.runtime.vectorize={vectorize}",
        f"--trainer.default_root_dir={folder}",
    ]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own resource usage (its peak RSS)
    wall = time.perf_counter() - start
    err = proc.stderr.read() if proc.stderr else ""
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"vectorize={vectorize} failed:\n{err[-3000:]}")
    folder_run = latest_run(folder)
    summary = json.loads((folder_run / "summary.json").read_text())
    times = [v for _, v in read_scalars(folder_run)["round/time_s"]]
    return {
        "round": summary["mean_round_s"],
        "steady": statistics.median(times[1:] or times),
        "wall": wall,
        "rss": usage.ru_maxrss / 1024,
        "facts": {k: v for k, v in summary.items() if k.startswith("vectorize/")},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=2, help="runs of each value, alternating")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--vectorize", type=int, default=100)
    p.add_argument("--root", default="/tmp/fl_lightning_cross_device_benchmark")
    args = p.parse_args()
    root = Path(args.root)
    print(f"load average before: {load()}", flush=True)
    results: dict[int, list[dict]] = {1: [], args.vectorize: []}
    for i in range(args.runs):
        for vectorize in results:
            r = run(vectorize, args.rounds, root)
            results[vectorize].append(r)
            facts = ", ".join(f"{k.removeprefix('vectorize/')}={v:.3g}" for k, v in r["facts"].items())
            print(
                f"  run {i + 1} vectorize={vectorize:<4d} {r['round']:.3f} s/round "
                f"(steady {r['steady']:.3f}), wall {r['wall']:.1f} s, peak RSS {r['rss']:.0f} MiB"
                f"{'; ' + facts if facts else ''} [load {load()}]",
                flush=True,
            )
    one, ours = results[1], results[args.vectorize]
    for key, what in (("round", "s/round (summary)"), ("steady", "steady s/round"), ("wall", "wall s")):
        a, b = min(r[key] for r in one), min(r[key] for r in ours)
        print(f"fastest {what}: vectorize=1 {a:.3f}, vectorize={args.vectorize} {b:.3f}: {a / b:.2f}x")
    print(
        f"peak RSS: vectorize=1 {max(r['rss'] for r in one):.0f} MiB, "
        f"vectorize={args.vectorize} {max(r['rss'] for r in ours):.0f} MiB"
    )
    print(f"load average after: {load()}")


if __name__ == "__main__":
    main()
