"""Filter decomposition (Chen & Qiu, ICML 2025): base methods with and without decomposition on one split.

Every row is one ``python -m fl_lightning fit`` run of a setup file of ``configs/filter_decomposition/``
composed with a strategy file (and, for the rows without decomposition, a ``dense/`` file that replaces the
``Decomposed`` wrapper by the bare network): same split, same seed, same local work. The script reads every
run's ``summary.json`` (and ``target.json``) and writes a markdown table beside the paper's numbers.

    python recipes/filter_decomposition/run.py                                         # CPU: Table 1 rows
    python recipes/filter_decomposition/run.py --setup global_cifar10_100_2            # full size (GPU)
    python recipes/filter_decomposition/run.py --setup personal_cifar10_100_2_cpu      # Table 2 rows
    python recipes/filter_decomposition/run.py --setup personal_cifar10_100_2_cpu --rows ditto fedrep
    python recipes/filter_decomposition/run.py --setup personal_cifar10_100_2_cpu --ablation   # Table 3
    python recipes/filter_decomposition/run.py --setup communication_cifar100_100_20_cpu      # Sec. 6.4
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from fl_lightning.runs import latest_run, read_summary

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs" / "filter_decomposition"

COLUMNS = ["cifar10_100_2", "cifar10_100_5", "cifar100_100_5", "cifar100_100_20", "tiny_20_20", "tiny_20_50"]
# Paper [000] Table 1: global test accuracy (%), mean of 3 seeds: (base, + Decomposition) per column.
TABLE1 = {
    "fedavg": ([75.57, 79.44, 39.72, 42.14, 33.47, 38.67], [77.67, 81.05, 42.54, 44.47, 34.91, 41.05]),
    "fedprox": ([75.83, 79.35, 39.74, 41.97, 34.29, 39.81], [76.98, 80.93, 41.77, 44.13, 36.17, 42.0]),
    "scaffold": ([74.96, 81.74, 42.48, 47.49, 37.27, 42.98], [77.11, 83.3, 45.31, 50.83, 39.64, 44.22]),
    "feddyn": ([77.04, 81.81, 43.48, 48.8, 36.77, 41.98], [77.88, 82.82, 43.57, 51.05, 36.7, 43.56]),
    "feddc": ([77.2, 82.49, 43.95, 50.54, 36.1, 41.53], [77.89, 83.45, 43.9, 52.32, 37.74, 43.2]),
}
# Paper Table 2 (personalised FL; Tiny-ImageNet columns are (1000,20) and (1000,50) there).
TABLE2 = {
    "local": [88.00, 76.00, 76.10, 41.90, 12.89, 6.13],
    "fedavg_ft": [93.53, 86.85, 85.29, 64.10, 30.77, 14.6],
    "fedprox_ft": [92.46, 85.31, 80.28, 59.07, 28.69, 14.96],
    "ditto": [93.67, 85.75, 80.37, 62.56, 21.93, 9.64],
    "fedper": [92.60, 83.30, 76.00, 37.70, 14.20, 6.15],
    "fedrep": [89.34, 79.25, 78.53, 57.89, 13.90, 6.14],
    "fedpac": [91.20, 85.30, 80.90, 61.64, 13.90, 6.15],
    "lg_fedavg": [88.50, 72.80, 73.00, 41.10, 12.44, 5.99],
    "ours": [94.14, 87.49, 84.28, 63.28, 41.57, 24.32],
}
# Table 2 rows without decomposition: strategies/<key>.yaml on the setup's dense network.
TABLE2_BASELINES = ["local", "fedavg_ft", "fedprox_ft", "ditto", "fedper", "fedrep", "fedpac", "lg_fedavg"]
# Paper Table 3 (m_a ablation, personalised setting).
TABLE3 = {
    12: [94.25, 87.08, 84.66, 63.67, 42.25, 23.81],
    9: [94.14, 87.49, 84.28, 63.28, 41.57, 24.32],
    6: [94.29, 85.92, 83.38, 62.71, 39.4, 21.5],
    3: [91.98, 81.66, 80.27, 57.68, 38.51, 20.91],
}
NAMES = {
    "fedavg": "FedAvg",
    "fedprox": "FedProx",
    "scaffold": "SCAFFOLD",
    "feddyn": "FedDyn",
    "feddc": "FedDC",
    "local": "Local",
    "fedavg_ft": "FedAvg + FT",
    "fedprox_ft": "FedProx + FT",
    "ditto": "Ditto (lambda = 0.75)",
    "fedper": "FedPer",
    "fedrep": "FedRep (10 head + 1 body epochs)",
    "fedpac": "FedPAC (1 head + 10 body epochs, lambda = 1)",
    "lg_fedavg": "LG-FedAvg",
    "ours": "Ours (local atoms)",
    "global": "FedAvg + Decomposition, global model (no personalisation)",
}


def column_of(setup: str) -> str:
    return setup.removesuffix("_cpu").split("_", 1)[1]


def dense_file(setup: str) -> Path:
    """The ``dense/`` overlay that removes the decomposition from ``setup``'s network."""
    column = column_of(setup)
    if setup.endswith("_cpu"):
        name = "smallcnn_digits" if column.startswith("tiny") else "lenet_digits"
    elif column.startswith("tiny"):  # Table 1: pre-trained ResNet-18; Tables 2/3: the AlexNet-like CNN
        name = "alexnet_tiny" if setup.startswith("personal") else "resnet18_tiny"
    else:
        name = {"cifar10": "lenet_cifar10", "cifar100": "lenet_cifar100"}[column.split("_")[0]]
    return CONFIGS / "dense" / f"{name}.yaml"


def strategy_file(setup: str, key: str) -> Path:
    """``strategies/<key>.yaml`` (the paper's setting), or its ``<key>_cpu.yaml`` sibling for a CPU setup."""
    cpu = CONFIGS / "strategies" / f"{key}_cpu.yaml"
    return cpu if setup.endswith("_cpu") and cpu.exists() else CONFIGS / "strategies" / f"{key}.yaml"


def fedpara_file(setup: str) -> Path:
    """The ``dense/`` overlay that re-parameterises ``setup``'s LeNet with FedPara (communication setups)."""
    return (
        CONFIGS
        / "dense"
        / ("fedpara_lenet_digits.yaml" if setup.endswith("_cpu") else "fedpara_lenet_cifar100.yaml")
    )


def fit(name: str, files: list[Path], overrides: list[str], args: argparse.Namespace) -> dict:
    """One ``fit`` run in ``<out>/<name>``; returns its summary (with ``target`` when written)."""
    root = args.out_dir / name
    if args.skip_existing and list(root.glob("lightning_logs/version_*/summary.json")):
        print(f"reusing {root} (--skip-existing)", flush=True)
        return _summary(root)
    cmd = [sys.executable, "-m", "fl_lightning", "fit"]
    for f in [CONFIGS / f"{args.setup}.yaml", *files]:
        cmd += ["--config", str(f)]
    cmd += [f"--trainer.default_root_dir={root}", "--trainer.enable_progress_bar=false", *overrides]
    if args.rounds is not None:
        cmd.append(f"--trainer.max_steps={args.rounds}")
    if args.setup.endswith("_cpu"):  # one intra-op thread: comparable times on a shared CPU
        cmd.append("--model.threads_per_process=1")
    cmd += args.extra
    print("$", "python", *(c.replace(f"{ROOT}{os.sep}", "") for c in cmd[1:]), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)
    return _summary(root)


def _summary(root: Path) -> dict:
    """The newest run's ``summary.json`` under ``root`` (with ``target`` when written)."""
    run = latest_run(root, with_summary=True)
    summary = read_summary(run)
    target = run / "target.json"
    if target.exists():
        summary["target"] = json.loads(target.read_text())
    return summary


def pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}"


def paper(values: list[float] | None, column: str) -> str:
    column = {"tiny_1000_20": "tiny_20_20", "tiny_1000_50": "tiny_20_50"}.get(column, column)  # Tables 2/3
    return "-" if values is None or column not in COLUMNS else f"{values[COLUMNS.index(column)]:.2f}"


def mib_per_round(s: dict) -> str:
    return f"{(s['bytes_down'] + s['bytes_up']) / s['rounds'] / 2**20:.3f}"


def table1(args: argparse.Namespace) -> str:
    column = column_of(args.setup)
    rows = [
        "| method | acc (%) | + Decomposition acc (%) | delta (pts) | paper | paper + Dec. "
        "| MiB/round | + Dec. MiB/round |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in args.methods:
        strategy = strategy_file(args.setup, m)
        dense = fit(f"{m}_dense", [dense_file(args.setup), strategy], [], args)
        dec = fit(f"{m}_decomposed", [strategy], [], args)
        base, plus = TABLE1.get(m, (None, None))
        rows.append(
            f"| {NAMES[m]} | {pct(dense['final_global_acc'])} | {pct(dec['final_global_acc'])} "
            f"| {100 * (dec['final_global_acc'] - dense['final_global_acc']):+.2f} "
            f"| {paper(base, column)} | {paper(plus, column)} "
            f"| {mib_per_round(dense)} | {mib_per_round(dec)} |"
        )
    return "\n".join(rows) + (
        "\n\nGlobal-model accuracy on the full test set after the last round (paper: Table 1, mean of 3 "
        "seeds, final or best not stated)."
    )


def table2(args: argparse.Namespace) -> str:
    column = column_of(args.setup)
    dense = dense_file(args.setup)
    runs = {key: fit(key, [dense, strategy_file(args.setup, key)], [], args) for key in args.rows}
    runs |= {
        "ours": fit("ours", [], [], args),
        # reference: the same decomposed FedAvg run deployed without personalisation
        "global": fit("decomposed_global", [CONFIGS / "strategies" / "fedavg.yaml"], [], args),
    }
    rows = ["| method | personalised acc (%) | global acc (%) | paper |", "|---|---|---|---|"]
    for key, s in runs.items():
        rows.append(
            f"| {NAMES[key]} | {pct(s['client_acc']['mean'])} | {pct(s['final_global_acc'])} "
            f"| {paper(TABLE2.get(key), column)} |"
        )
    return "\n".join(rows) + (
        "\n\nPersonalised accuracy: mean over clients of each client's deployed model on its local test "
        "split (FT: the final global model fine-tuned 10 epochs on the client's training split; Local: the "
        "client's own model; Ditto: its personal model; FedPer / FedRep: global body with its own head; "
        "FedPAC: global body with the head combined for it by the server's quadratic program; "
        "LG-FedAvg: its own representation with the global head; Ours: final global coefficients and head "
        "with the client's local atoms; last row: Ours' global model itself, since the local atoms train on "
        "the same batches without changing the global trajectory). Global acc of Local is the initial "
        "model's; of FedPer / FedRep / FedPAC / LG-FedAvg the global model with the initial personal layers."
    )


def table3(args: argparse.Namespace) -> str:
    column = column_of(args.setup)
    rows = ["| m_a | personalised acc (%) | global acc (%) | paper |", "|---|---|---|---|"]
    for m in (12, 9, 6, 3):
        s = fit(f"atoms{m}", [], [f"--model.client.init_args.net.init_args.num_atoms={m}"], args)
        rows.append(
            f"| {m} | {pct(s['client_acc']['mean'])} | {pct(s['final_global_acc'])} "
            f"| {paper(TABLE3[m], column)} |"
        )
    return "\n".join(rows) + "\n"


def table_comm(args: argparse.Namespace) -> str:
    strategies = CONFIGS / "strategies"
    runs = {
        "FedAvg": fit("fedavg", [dense_file(args.setup), strategies / "fedavg.yaml"], [], args),
        "FedAvg + Decomposition": fit("decomposed", [strategies / "fedavg.yaml"], [], args),
        "FedPara (FedAvg)": fit("fedpara", [fedpara_file(args.setup), strategies / "fedavg.yaml"], [], args),
    }
    for period in (2, 5, 10):  # the setup's protocol: Sec. 6.4, atoms every round, whole model every 1/beta
        runs[f"+ fast/slow (Sec. 6.4), beta = 1/{period}"] = fit(
            f"whole_model_{period}", [], [f"--model.strategy.init_args.period={period}"], args
        )
    runs["+ fast/slow (Algorithm 2: coefficients slow only), beta = 1/5"] = fit(
        "fast_slow_5", [strategies / "fast_slow.yaml"], [], args
    )
    ref = runs["FedAvg"]
    ref_total = ref["bytes_down"] + ref["bytes_up"]
    rows = [
        "| method | final acc (%) | rounds to target | MiB to target | MiB total | total vs FedAvg |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in runs.items():
        t = s.get("target", {})
        to_target = (
            (t["round"], f"{t['bytes_total'] / 2**20:.2f}") if t.get("reached") else ("not reached", "-")
        )
        total = s["bytes_down"] + s["bytes_up"]
        rows.append(
            f"| {name} | {pct(s['final_global_acc'])} | {to_target[0]} | {to_target[1]} "
            f"| {total / 2**20:.2f} | {total / ref_total:.3f} |"
        )
    target = next(iter(runs.values())).get("target", {})
    return "\n".join(rows) + (
        f"\n\nTarget: {target.get('monitor')} >= {target.get('target')}; bytes down + up of all clients. "
        "Paper (Fig. 2(d), CIFAR-100 (100,20), 52%): FedAvg 2,500M parameters, FedPara 1,250M, beta = 1/5 "
        "about 500M."
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--setup", default="global_cifar10_100_2_cpu", help="configs/filter_decomposition/<setup>.yaml"
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        default=["fedavg", "fedprox", "scaffold", "feddyn", "feddc"],
        choices=list(TABLE1),
    )
    parser.add_argument(
        "--ablation", action="store_true", help="Table 3 (m_a) instead of Table 2 (personal setups)"
    )
    parser.add_argument(
        "--rows",
        nargs="+",
        default=TABLE2_BASELINES,
        choices=TABLE2_BASELINES,
        help="Table 2 baseline rows (personal setups; Ours and its global model always run)",
    )
    parser.add_argument("--rounds", type=int, default=None, help="override trainer.max_steps")
    parser.add_argument(
        "--skip-existing",
        action="store_true",
        help="reuse a row's summary.json under --out when there is one (e.g. after an interrupted run)",
    )
    parser.add_argument(
        "--out", type=Path, default=ROOT / "lightning_logs" / "recipes" / "filter_decomposition"
    )
    parser.add_argument("extra", nargs="*", help="further CLI overrides passed to every run (after --)")
    args = parser.parse_args()
    if not (CONFIGS / f"{args.setup}.yaml").exists():
        parser.error(f"--setup {args.setup}: no configs/filter_decomposition/{args.setup}.yaml")
    kind = args.setup.split("_", 1)[0]
    name = args.setup + ("_ablation" if args.ablation else "")
    args.out_dir = args.out / name
    if kind == "global":
        title, body = "Table 1 (global model)", table1(args)
    elif kind == "personal":
        title, body = (
            ("Table 3 (m_a)", table3(args)) if args.ablation else ("Table 2 (personalised)", table2(args))
        )
    else:
        title, body = "Communication to a target accuracy (Sec. 6.4)", table_comm(args)
    caveat = (
        " (digits stand-in on CPU: not comparable with the paper's numbers)"
        if args.setup.endswith("_cpu")
        else ""
    )
    text = f"# {title}, setup `{args.setup}`{caveat}\n\nPaper column: `{column_of(args.setup)}`.\n\n{body}\n"
    (args.out_dir / "results.md").write_text(text)
    print(text)
    print(f"written to {args.out_dir / 'results.md'}")


if __name__ == "__main__":
    main()
