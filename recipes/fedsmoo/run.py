"""FedAvg, FedDyn, FedSAM and FedSMOO side by side on one partition, next to the FedSMOO paper's Table 1.

Each method is one ``python -m fl_lightning fit`` run of a setup file of ``configs/fedsmoo/`` composed with
the method's strategy file (same split, same seed, same local work); the script reads every run's
``summary.json`` and writes a markdown table of final/best global test accuracy, communicated bytes and
mean round time (also relative to FedAvg) beside the paper's number for that Table 1 column.

    python recipes/fedsmoo/run.py                                   # CPU size: digits, Dirichlet-0.1
    python recipes/fedsmoo/run.py --setup cifar10_dir0.1            # full size (GPU), Table 1 column
    python recipes/fedsmoo/run.py --setup cifar10_path3 --clients200 --methods fedavg scaffold fedsmoo
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from fl_lightning.runs import latest_run, read_summary

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs" / "fedsmoo"

COLUMNS = [
    "cifar10_dir0.6",
    "cifar10_dir0.1",
    "cifar10_path6",
    "cifar10_path3",
    "cifar100_dir0.6",
    "cifar100_dir0.1",
    "cifar100_path20",
    "cifar100_path10",
]

# FedSMOO paper (Sun et al., ICML 2023), Table 1: test accuracy (%) after 800 rounds, mean of 2 runs.
TABLE1_10_OF_100 = {
    "fedavg": [79.52, 76.00, 79.91, 74.08, 46.35, 42.64, 44.15, 40.23],
    "fedadam": [77.08, 73.41, 77.05, 72.44, 48.35, 40.77, 41.26, 32.58],
    "scaffold": [81.81, 78.57, 83.07, 77.02, 51.98, 44.41, 46.06, 41.08],
    "fedcm": [82.97, 77.82, 83.44, 77.82, 51.56, 43.03, 44.94, 38.35],
    "feddyn": [83.22, 78.08, 83.18, 77.63, 50.82, 42.50, 44.19, 38.68],
    "fedsam": [80.10, 76.86, 80.80, 75.51, 47.51, 43.43, 45.46, 40.44],
    "mofedsam": [84.13, 78.71, 84.92, 79.57, 54.38, 44.85, 47.42, 41.17],
    "fedsmoo": [84.55, 80.82, 85.39, 81.58, 53.92, 46.48, 48.87, 44.10],
}
TABLE1_5_OF_200 = {
    "fedavg": [75.90, 72.93, 77.47, 71.86, 44.70, 40.41, 38.22, 36.79],
    "fedadam": [75.55, 69.70, 75.24, 70.49, 44.33, 38.04, 35.14, 30.28],
    "scaffold": [79.00, 76.15, 80.69, 74.05, 50.70, 41.83, 39.63, 37.98],
    "fedcm": [80.52, 77.28, 81.76, 76.72, 50.93, 42.33, 42.01, 38.35],
    "feddyn": [80.69, 76.82, 82.21, 74.93, 47.32, 41.74, 41.55, 38.09],
    "fedsam": [76.32, 73.44, 78.16, 72.41, 45.98, 40.22, 38.71, 36.90],
    "mofedsam": [82.58, 78.43, 84.46, 79.93, 53.51, 42.22, 42.77, 39.81],
    "fedsmoo": [82.94, 79.76, 84.82, 81.01, 53.45, 45.83, 44.70, 43.41],
}
# Per-round communication of each method relative to FedAvg (paper Table 3 accounting, spec P10).
PAPER_COMM = {"scaffold": 2, "fedcm": 2, "mofedsam": 2, "fedgamma": 2, "fedsmoo": 2}

NAMES = {
    "fedavg": "FedAvg",
    "fedavgm": "FedAvgM",
    "fedadam": "FedAdam",
    "scaffold": "SCAFFOLD",
    "feddyn": "FedDyn",
    "feddc": "FedDC",
    "fedcm": "FedCM",
    "fedsam": "FedSAM",
    "mofedsam": "MoFedSAM",
    "fedspeed": "FedSpeed",
    "fedgamma": "FedGamma",
    "fedsmoo": "FedSMOO",
}


def strategy_file(method: str, setup: str) -> Path:
    """The method's strategy file; CIFAR-100 setups take its ``_c100`` variant (beta = 100) if any."""
    if setup.startswith("cifar100"):
        c100 = CONFIGS / "strategies" / f"{method}_c100.yaml"
        if c100.exists():
            return c100
    return CONFIGS / "strategies" / f"{method}.yaml"


def run_method(method: str, args: argparse.Namespace, out: Path) -> dict:
    """One ``fit`` run; returns its summary.json."""
    root = out / method
    cmd = [
        sys.executable,
        "-m",
        "fl_lightning",
        "fit",
        "--config",
        str(CONFIGS / f"{args.setup}.yaml"),
        "--config",
        str(strategy_file(method, args.setup)),
    ]
    if args.clients200:
        cpu = "_cpu" if args.setup.endswith("_cpu") else ""
        cmd += ["--config", str(CONFIGS / f"clients200{cpu}.yaml")]
    cmd += [f"--trainer.default_root_dir={root}", "--trainer.enable_progress_bar=false"]
    if args.rounds is not None:
        cmd.append(f"--trainer.max_steps={args.rounds}")
    threads = args.threads if args.threads is not None else (1 if args.setup.endswith("_cpu") else None)
    if threads is not None:  # one intra-op thread by default on CPU: comparable times on a shared machine
        cmd.append(f"--model.threads_per_process={threads}")
    cmd += args.extra
    shown = ["python", *(c.replace(f"{ROOT}{os.sep}", "") for c in cmd[1:])]
    print("$", " ".join(shown), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)
    return read_summary(latest_run(root))


def paper_value(method: str, setup: str, clients200: bool) -> str:
    column = setup.removesuffix("_cpu")
    table = TABLE1_5_OF_200 if clients200 else TABLE1_10_OF_100
    if method not in table or column not in COLUMNS:
        return "-"
    return f"{table[method][COLUMNS.index(column)]:.2f}"


def table(results: dict[str, dict], args: argparse.Namespace) -> str:
    base = results.get("fedavg")
    part = "5%-200" if args.clients200 else "10%-100"
    column = args.setup.removesuffix("_cpu")
    caveat = (
        " (CIFAR, ResNet-18-GN, 800 rounds: not comparable to a CPU run)"
        if args.setup.endswith("_cpu")
        else ""
    )
    lines = [
        f"Setup `{args.setup}`{' + clients200' if args.clients200 else ''}; paper: Table 1, column "
        f"`{column}`, {part}{caveat}.",
        "",
        "| method | final acc (%) | best acc (%) | MiB down | MiB up | bytes vs FedAvg (paper) "
        "| s/round | time vs FedAvg | paper acc (%) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for method, s in results.items():
        total = s["bytes_down"] + s["bytes_up"]
        ratio = f"{total / (base['bytes_down'] + base['bytes_up']):.2f}x" if base else "-"
        speed = f"{s['mean_round_s'] / base['mean_round_s']:.2f}x" if base else "-"
        lines.append(
            f"| {NAMES.get(method, method)} | {100 * s['final_global_acc']:.2f} "
            f"| {100 * s['best_global_acc']:.2f} "
            f"| {s['bytes_down'] / 2**20:.2f} | {s['bytes_up'] / 2**20:.2f} "
            f"| {ratio} ({PAPER_COMM.get(method, 1)}x) | {s['mean_round_s']:.3f} | {speed} "
            f"| {paper_value(method, args.setup, args.clients200)} |"
        )
    lines.append("")
    lines.append(
        f"Rounds: {next(iter(results.values()))['rounds']}; accuracy of the global model on the global "
        "test set; best = max over rounds (the simulator's report), final = last round."
    )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--setup", default="cifar10_dir0.1_cpu", help="configs/fedsmoo/<setup>.yaml")
    parser.add_argument(
        "--methods", nargs="+", default=["fedavg", "feddyn", "fedsam", "fedsmoo"], choices=NAMES
    )
    parser.add_argument("--clients200", action="store_true", help="the 5%%-200 setting (Table 1 lower part)")
    parser.add_argument("--rounds", type=int, default=None, help="override trainer.max_steps")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads per run (default: 1 for *_cpu setups)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "lightning_logs" / "recipes" / "fedsmoo")
    parser.add_argument("extra", nargs="*", help="further CLI overrides passed to every run (after --)")
    args = parser.parse_args()
    if not (CONFIGS / f"{args.setup}.yaml").exists():
        parser.error(f"--setup {args.setup}: no configs/fedsmoo/{args.setup}.yaml")
    out = args.out / (args.setup + ("_clients200" if args.clients200 else ""))
    methods = sorted(args.methods, key=lambda m: m != "fedavg")  # FedAvg first: the reference row
    results = {m: run_method(m, args, out) for m in methods}
    text = table(results, args)
    (out / "results.md").write_text(text)
    print(text)
    print(f"written to {out / 'results.md'}")


if __name__ == "__main__":
    main()
