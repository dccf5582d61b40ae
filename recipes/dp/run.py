"""Accuracy against epsilon of client-level DP-FedAvg on the digits (configs/dp/dp_fedavg_digits.yaml).

One ``python -m fl_lightning fit`` run per row (noise multiplier ``z``, clipping); each run's
``summary.json`` gives the final and best global accuracy (validation split) and ``privacy/epsilon``;
the script prints a markdown table (and writes it to ``--out``).

    OMP_NUM_THREADS=1 python recipes/dp/run.py              # every row, 1-2 min each on 2 CPU cores
    OMP_NUM_THREADS=1 python recipes/dp/run.py --rows z1 z1_adaptive
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "dp" / "dp_fedavg_digits.yaml"
S = "--model.strategy.init_args."
N50 = "--model.clients_per_round=50"

#: name -> (label, overrides of the config)
ROWS: dict[str, tuple[str, list[str]]] = {
    "nodp": ("no DP (z = 0, no clipping)", [f"{S}noise_multiplier=0", f"{S}clip_norm=1e6"]),
    "clip": (
        "clipping only (z = 0, adaptive C from 0.1, median)",
        [f"{S}noise_multiplier=0", f"{S}clip_norm=0.1", f"{S}clipping=adaptive"],
    ),
    "z0.5": ("DP, z = 0.5, C = 1", [f"{S}noise_multiplier=0.5"]),
    "z1": ("DP, z = 1, C = 1", [f"{S}noise_multiplier=1.0"]),
    "z2": ("DP, z = 2, C = 1", [f"{S}noise_multiplier=2.0"]),
    "z1_adaptive": (
        "DP, z = 1, adaptive C (from 0.1, median)",
        [f"{S}noise_multiplier=1.0", f"{S}clip_norm=0.1", f"{S}clipping=adaptive"],
    ),
    # 50 clients per round (q = 0.5, sigma_b = 2.5): z = 2 spends about the epsilon of z = 1 at 20 per round
    "z2_n50": ("DP, z = 2, C = 1, 50 clients/round", [f"{S}noise_multiplier=2.0", f"{N50}"]),
    "z2_adaptive_n50": (
        "DP, z = 2, adaptive C (from 0.1, median), 50 clients/round",
        [f"{S}noise_multiplier=2.0", f"{S}clip_norm=0.1", f"{S}clipping=adaptive", f"{N50}"],
    ),
    "z1_adaptive_n50": (
        "DP, z = 1, adaptive C (from 0.1, median), 50 clients/round",
        [f"{S}noise_multiplier=1.0", f"{S}clip_norm=0.1", f"{S}clipping=adaptive", f"{N50}"],
    ),
}


def run(name: str, out_dir: Path, extra: list[str]) -> dict:
    root = out_dir / name
    cmd = [
        sys.executable,
        "-m",
        "fl_lightning",
        "fit",
        f"--config={CONFIG}",
        *ROWS[name][1],
        *extra,
        "--trainer.enable_progress_bar=false",
        f"--trainer.default_root_dir={root}",
    ]
    print(" ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)
    versions = sorted((root / "lightning_logs").glob("version_*"), key=lambda p: int(p.name.split("_")[1]))
    return json.loads((versions[-1] / "summary.json").read_text())


def main() -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=fmt)
    parser.add_argument("--rows", nargs="*", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--out_dir", type=Path, default=ROOT / "lightning_logs" / "dp_recipe")
    parser.add_argument("--out", type=Path, default=None, help="also write the table to this file")
    parser.add_argument("extra", nargs="*", help="more overrides for every run, e.g. --trainer.max_steps=10")
    args, unknown = parser.parse_known_args()
    extra = [*args.extra, *unknown]
    lines = [
        "| run | ε (δ = 100^-1.1) | final acc | best acc | wall time |",
        "|---|---|---|---|---|",
    ]
    for name in args.rows:
        s = run(name, args.out_dir, extra)
        eps = s.get("privacy/epsilon")
        lines.append(
            f"| {ROWS[name][0]} | {'∞' if eps is None else f'{eps:.2f}'} | "
            f"{100 * s['final_global_acc']:.1f}% | {100 * s['best_global_acc']:.1f}% | "
            f"{s['wall_time_s']:.0f} s |"
        )
        print("\n".join(lines), flush=True)
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.write_text(table + "\n")


if __name__ == "__main__":
    main()
