"""FedCOG's Table 1 (accuracy of each method per column): one ``fit`` per (setup, method), a markdown table.

Each row replaces the setup's strategy (FedCOG) with ``configs/fedcog/strategies/<method>.yaml``; the row
``fedcog`` runs the setup as is (50 rounds FedAvg + 20 FedCOG at full size). The script reads the final
``global/acc`` of every run and prints the table beside the paper's numbers.

    python recipes/fedcog/table1.py                                   # CPU size: digits NIID-1 / NIID-2
    python recipes/fedcog/table1.py --methods fedavg fedgen fedreg_cpu vhl --seeds 0 1 2
    python recipes/fedcog/table1.py --setups table1_cifar10_niid1 table1_cifar10_niid2 \\
        --methods fedavg fedgen fedreg vhl fedcog -- --data.download=true   # GPU, full size
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from fl_lightning.runs import last_scalars, latest_run

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs" / "fedcog"

# FedCOG paper (Ye et al., ICLR 2024), Table 1, accuracy %: columns FMNIST-1/2, CIFAR-10-1/2, CIFAR-100-1/2.
COLUMNS = [f"{d}_niid{k}" for d in ("fmnist", "cifar10", "cifar100") for k in (1, 2)]
PAPER = {
    "fedavg": [73.07, 64.11, 64.36, 50.55, 39.07, 30.93],
    "fedavgm": [76.81, 67.73, 64.36, 51.32, 39.21, 30.97],
    "fedprox": [73.35, 64.44, 63.91, 53.51, 38.81, 30.76],
    "scaffold": [77.02, 58.47, 64.36, 48.35, 42.25, 34.27],
    "moon": [73.21, 63.11, 63.65, 51.01, 39.34, 31.17],
    "fedsam": [76.44, 68.14, 61.38, 50.76, 37.97, 30.75],
    "vhl": [73.08, 70.26, 60.81, 51.60, 37.55, 28.41],
    "fedexp": [65.03, 59.49, 48.96, 37.97, 35.14, 22.47],
    "feddecorr": [72.77, 60.70, 63.40, 47.53, 37.68, 27.08],
    "fedreg": [70.75, 69.89, 55.40, 46.64, 30.95, 23.70],
    "fedgen": [72.64, 61.34, 62.45, 49.12, 37.99, 26.93],
    "fedcog": [77.34, 73.68, 64.83, 54.00, 42.88, 34.80],
}


def run(args: argparse.Namespace, setup: str, method: str, seed: int) -> float | None:
    """One ``fit`` run; returns its final global accuracy in %."""
    out = args.out / setup / method / f"seed{seed}"
    cmd = [sys.executable, "-m", "fl_lightning", "fit", "--config", str(CONFIGS / f"{setup}.yaml")]
    if method != "fedcog":
        cmd += ["--config", str(CONFIGS / "strategies" / f"{method}.yaml")]
    cmd += [
        f"--trainer.default_root_dir={out}",
        "--trainer.enable_progress_bar=false",
        f"--seed_everything={seed}",
        *args.extra,
    ]
    print("$", " ".join(os.path.relpath(c, ROOT) if c.startswith(str(ROOT)) else c for c in cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)
    value = last_scalars(latest_run(out), ["global/acc"])["global/acc"]
    return None if value is None else 100.0 * value


def _stat(values: list[float]) -> str:
    mean = sum(values) / len(values)
    if len(values) == 1:
        return f"{mean:.2f}"
    std = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5
    return f"{mean:.2f} ± {std:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    cpu = ["table1_cifar10_niid1_cpu", "table1_cifar10_niid2_cpu"]
    parser.add_argument("--setups", nargs="+", default=cpu)
    parser.add_argument("--methods", nargs="+", default=["fedavg", "fedgen", "fedreg_cpu", "vhl", "fedcog"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--out", type=Path, default=ROOT / "lightning_logs" / "fedcog_table1")
    parser.add_argument("extra", nargs="*", help="arguments passed to every fit (after --)")
    args = parser.parse_args()
    header = "| method | " + " | ".join(f"{s} (ours) | paper" for s in args.setups) + " |"
    lines = [header, "|---|" + "---|---|" * len(args.setups)]
    for method in args.methods:
        cells = []
        for setup in args.setups:
            accs = [a for a in (run(args, setup, method, seed) for seed in args.seeds) if a is not None]
            column = setup.removeprefix("table1_").removesuffix("_cpu")
            paper = PAPER.get(method.removesuffix("_cpu"))
            ref = f"{paper[COLUMNS.index(column)]:.2f}" if paper and column in COLUMNS else "-"
            cells.append(f"{_stat(accs) if accs else '-'} | {ref}")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
