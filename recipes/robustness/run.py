"""FedAvg and the robust aggregators, without and under attack, on the embedded digits: one markdown table.

Each cell is one ``python -m fl_lightning fit`` run of ``configs/robustness/digits.yaml`` composed with a
strategy file (``configs/robustness/strategies/``) and an attack file (``configs/robustness/attacks/``),
same split, same seed, same local work; the script reads every run's ``summary.json`` and prints the
final global test accuracy per (aggregator, attack).

    python recipes/robustness/run.py                                    # the full grid (18 runs)
    python recipes/robustness/run.py --strategies fedavg median --attacks none sign_flip
    python recipes/robustness/run.py --extra --seed_everything=1        # any further CLI arguments
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

from fl_lightning.runs import last_scalars, latest_run, read_summary

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs" / "robustness"

STRATEGIES = {
    "fedavg": "FedAvg",
    "median": "Median",
    "trimmed_mean": "TrimmedMean (beta 0.3)",
    "krum": "Krum (f 3)",
    "multi_krum": "Multi-Krum (f 3, m 5)",
    "norm_bounded": "NormBounded (C 1.0)",
}
ATTACKS = {
    "none": "no attack",
    "sign_flip": "sign flip, 30%, s=4",
    "scale": "scale, 30%, s=10",
}


def run_cell(strategy: str, attack: str, out: Path, extra: list[str]) -> dict:
    """One ``fit`` run; returns its summary.json, or for a run stopped by a diverged model (every client
    non-finite for ``model.max_failed_rounds`` rounds) the last logged ``global/acc`` and that round."""
    root = out / f"{strategy}__{attack}"
    cmd = [
        sys.executable,
        "-m",
        "fl_lightning",
        "fit",
        "--config",
        str(CONFIGS / "digits.yaml"),
        "--config",
        str(CONFIGS / "strategies" / f"{strategy}.yaml"),
        "--config",
        str(CONFIGS / "attacks" / f"{attack}.yaml"),
        f"--trainer.default_root_dir={root}",
        *extra,
    ]
    shown = ["python", *(c.replace(f"{ROOT}{os.sep}", "") for c in cmd[1:])]
    print("$", " ".join(shown), flush=True)
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "stderr.log", "w") as err:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
    if proc.returncode == 0:
        return read_summary(latest_run(root, with_summary=True))
    text = (root / "stderr.log").read_text()
    stopped = re.search(r"error: round (\d+): every sampled client failed", text)
    if stopped is None:
        raise RuntimeError(f"{' '.join(shown)} failed; see {root / 'stderr.log'}")
    acc = last_scalars(latest_run(root), ["global/acc"])["global/acc"]
    return {"final_global_acc": acc, "diverged": int(stopped.group(1))}


def table(results: dict[tuple[str, str], dict], strategies: list[str], attacks: list[str]) -> str:
    head = "| aggregator | " + " | ".join(ATTACKS[a] for a in attacks) + " |"
    lines = [head, "|---" * (len(attacks) + 1) + "|"]
    for s in strategies:
        cells = []
        for a in attacks:
            r = results.get((s, a))
            if r is None:
                cells.append("-")
            elif "diverged" in r:  # the global model went non-finite: the run stopped
                cells.append(f"{100 * r['final_global_acc']:.1f} (diverged, round {r['diverged']})")
            else:
                cells.append(f"{100 * r['final_global_acc']:.1f}")
        lines.append(f"| {STRATEGIES[s]} | " + " | ".join(cells) + " |")
    mean_s = [r["mean_round_s"] for r in results.values() if r.get("mean_round_s")]
    if mean_s:
        mean = sum(mean_s) / len(mean_s)
        lines += ["", f"Final global test accuracy (%); mean {mean:.2f} s per round over the finished runs."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=list(STRATEGIES))
    parser.add_argument("--attacks", nargs="+", default=list(ATTACKS), choices=list(ATTACKS))
    parser.add_argument("--out", type=Path, default=ROOT / "lightning_logs" / "robustness")
    parser.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="further fit arguments")
    args = parser.parse_args()
    results = {}
    for strategy in args.strategies:
        for attack in args.attacks:
            results[(strategy, attack)] = run_cell(strategy, attack, args.out, args.extra)
    text = table(results, args.strategies, args.attacks)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
