"""FedCOG's plug-and-play study (Table 3): method X after a warm-up, one more round of X vs of X+FedCOG.

For each setup of ``configs/fedcog/table3_*.yaml`` and each base method X, three ``python -m fl_lightning
fit`` runs:

1. **warm-up**: the setup with X as FedCOG's base for ``start_round`` rounds (FedCOG is not active yet,
   so this is X exactly; the clients keep their last local models for step 2), checkpointed;
2. **X + FedCOG**: resumed from that checkpoint (``--ckpt_path``) for the setup's remaining rounds,
   in which every sampled client generates and distils;
3. **X**: resumed from the same checkpoint with ``start_round`` past the end, so FedCOG never runs
   (bit-identical to X; the checkpoint's fingerprint names the strategy class, which is FedCOG in all
   three runs).

The script reads the final global metrics of runs 2 and 3 (accuracy; O-F1 and C-F1 on FLAIR) from their
TensorBoard logs and writes a markdown table beside the paper's Table 3.

    python recipes/fedcog/run.py                                    # CPU size: digits, NIID-1 and NIID-2
    python recipes/fedcog/run.py --setups table3_cifar10_niid1 table3_cifar10_niid2 table3_flair  # GPU
    python recipes/fedcog/run.py --bases fedavg moon --extra_rounds 3
    python recipes/fedcog/run.py --seeds 0 1 2                      # mean ± std over three seeds
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import yaml

from fl_lightning.runs import last_scalars, latest_run

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs" / "fedcog"
NAMES = {
    "fedavg": "FedAvg",
    "fedavgm": "FedAvgM",
    "fedprox": "FedProx",
    "scaffold": "SCAFFOLD",
    "moon": "MOON",
}

# FedCOG paper (Ye et al., ICLR 2024), Table 3: (X alone, X + FedCOG) after 50 (FLAIR: 400) rounds of X,
# 1 extra round on CIFAR-10 (accuracy %), 3 on FLAIR (O-F1 / C-F1 %).
PAPER = {
    "cifar10_niid1": {
        "acc": {
            "fedavg": (63.34, 64.47),
            "fedavgm": (61.71, 64.63),
            "fedprox": (64.15, 64.87),
            "scaffold": (63.67, 65.36),
            "moon": (62.56, 63.24),
        }
    },
    "cifar10_niid2": {
        "acc": {
            "fedavg": (49.30, 49.50),
            "fedavgm": (44.73, 45.14),
            "fedprox": (50.35, 50.89),
            "scaffold": (46.47, 51.26),
            "moon": (49.64, 50.72),
        }
    },
    "flair": {
        "o_f1": {
            "fedavg": (47.91, 51.35),
            "fedavgm": (48.77, 51.60),
            "fedprox": (45.71, 54.57),
            "scaffold": (42.50, 45.22),
            "moon": (44.99, 52.78),
        },
        "c_f1": {
            "fedavg": (20.63, 20.89),
            "fedavgm": (20.11, 21.98),
            "fedprox": (18.66, 19.08),
            "scaffold": (16.74, 18.96),
            "moon": (18.83, 19.92),
        },
    },
}


def fit(args: argparse.Namespace, setup: str, base: str, root: Path, *overrides: str) -> Path:
    """One ``fit`` run with its logs and checkpoints under ``root``; returns its log folder."""
    cmd = [sys.executable, "-m", "fl_lightning", "fit", "--config", str(CONFIGS / f"{setup}.yaml")]
    if base != "fedavg":
        cmd += ["--config", str(CONFIGS / "strategies" / f"fedcog_on_{base}.yaml")]
    cmd += [
        f"--trainer.default_root_dir={root}",
        "--trainer.enable_progress_bar=false",
        *overrides,
        *args.extra,
    ]
    print("$", " ".join(os.path.relpath(c, ROOT) if c.startswith(str(ROOT)) else c for c in cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)
    return latest_run(root)


def final_scalars(log_dir: Path, keys: list[str]) -> dict[str, float | None]:
    """The last logged value of each ``global/<key>`` scalar of a run folder."""
    values = last_scalars(log_dir, [f"global/{k}" for k in keys])
    return {k: values[f"global/{k}"] for k in keys}


def _stat(values: list[float], sign: bool = False) -> str:
    """``mean`` (one value) or ``mean ± std`` (several), in points."""
    mean = sum(values) / len(values)
    text = f"{mean:+.2f}" if sign else f"{mean:.2f}"
    if len(values) > 1:
        std = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5
        text += f" ± {std:.2f}"
    return text


def run_setup(args: argparse.Namespace, setup: str) -> str:
    config = yaml.safe_load((CONFIGS / f"{setup}.yaml").read_text())
    warm = (
        args.warmup
        if args.warmup is not None
        else int(config["model"]["strategy"]["init_args"]["start_round"])
    )
    total = warm + args.extra_rounds if args.extra_rounds is not None else int(config["trainer"]["max_steps"])
    column = setup.removeprefix("table3_").removesuffix("_cpu")
    keys = ["o_f1", "c_f1"] if column == "flair" else ["acc"]
    rows = []
    for base in args.bases:
        without, with_ = [], []
        for seed in args.seeds:
            out = args.out / setup / base if args.seeds == [0] else args.out / setup / f"seed{seed}" / base
            seeded = [f"--seed_everything={seed}"]  # also model.seed (linked) and data.seed (null)
            start = f"--model.strategy.init_args.start_round={warm}"
            warm_dir = fit(args, setup, base, out / "warmup", f"--trainer.max_steps={warm}", start, *seeded)
            ckpt = str(warm_dir / "checkpoints" / "last.ckpt")
            plain = fit(
                args,
                setup,
                base,
                out / "base",
                f"--trainer.max_steps={total}",
                f"--ckpt_path={ckpt}",
                f"--model.strategy.init_args.start_round={total}",
                *seeded,
            )
            plug = fit(
                args,
                setup,
                base,
                out / "fedcog",
                f"--trainer.max_steps={total}",
                f"--ckpt_path={ckpt}",
                start,
                *seeded,
            )
            without.append(final_scalars(plain, keys))
            with_.append(final_scalars(plug, keys))
        rows.append((base, without, with_))
    paper = PAPER[column]
    head = " | ".join(f"{k} X | {k} X+FedCOG | Δ" for k in keys)
    paper_head = " | ".join(f"paper {k} X | paper {k} X+FedCOG" for k in keys)
    lines = [
        f"Setup `{setup}`: {warm} warm-up rounds of X, then {total - warm} round(s) of X or of X+FedCOG "
        f"from the same checkpoint; final global metrics (%). Paper: Table 3, row(s) {column}"
        + (
            " (CIFAR-10 / FLAIR: not comparable in absolute terms to a CPU run on digits)."
            if "_cpu" in setup
            else "."
        ),
        "",
        f"| X | {head} | {paper_head} |",
        "|---|" + "---|" * (3 * len(keys) + 2 * len(keys)),
    ]
    for base, without, with_ in rows:
        ours = " | ".join(
            f"{_stat([100 * r[k] for r in without])} | {_stat([100 * r[k] for r in with_])} "
            f"| {_stat([100 * (b[k] - a[k]) for a, b in zip(without, with_)], sign=True)}"
            for k in keys
        )
        theirs = " | ".join(f"{paper[k][base][0]:.2f} | {paper[k][base][1]:.2f}" for k in keys)
        lines.append(f"| {NAMES[base]} | {ours} | {theirs} |")
    if len(args.seeds) > 1:
        lines += [
            "",
            f"Mean ± standard deviation over seeds {args.seeds} (split, initialisation, sampling); "
            "Δ paired per seed.",
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--setups",
        nargs="+",
        default=["table3_cifar10_niid1_cpu", "table3_cifar10_niid2_cpu"],
        help="configs/fedcog/<setup>.yaml files whose strategy is FedCOG",
    )
    parser.add_argument("--bases", nargs="+", default=list(NAMES), choices=list(NAMES))
    parser.add_argument("--warmup", type=int, default=None, help="warm-up rounds (default: start_round)")
    parser.add_argument(
        "--extra_rounds", type=int, default=None, help="rounds after the warm-up (default: setup)"
    )
    parser.add_argument(
        "--seeds",
        nargs="+",
        type=int,
        default=[0],
        help="seeds (split, init, sampling); >1 reports mean ± std",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "lightning_logs" / "recipes" / "fedcog")
    parser.add_argument("extra", nargs="*", help="further CLI overrides passed to every run (after --)")
    args = parser.parse_args()
    for setup in args.setups:
        if not (CONFIGS / f"{setup}.yaml").exists():
            parser.error(f"--setups {setup}: no configs/fedcog/{setup}.yaml")
    text = "\n".join(run_setup(args, setup) for setup in args.setups)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.md").write_text(text)
    print(text)
    print(f"written to {args.out / 'results.md'}")


if __name__ == "__main__":
    main()
