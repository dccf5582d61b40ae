"""fl_lightning on one device against a hand-written PyTorch loop doing the same work; ratios from one run.

Work (defaults): ResNet-18-GN, 10 clients x 50 local steps, batch 50, SGD (lr 0.1, weight decay 1e-3),
on synthetic CIFAR-10-shaped data generated here (class-dependent means plus noise, IID split, no
download). Measured, each as the median time of the rounds after a warm-up round (which pays
allocation and compilation):

- ``hand``: FedAvg written by hand (benchmarks/common.py), fp32, eager;
- fl_lightning FedAvg fp32, FedSMOO fp32 (rho 0.1, beta 10, clip 10), FedAvg bf16-mixed, all eager;
- fl_lightning FedAvg fp32 with ``model.runtime.compile=true`` (CUDA graphs on a GPU), unless
  ``--no-compile``.

Validation and client evaluation are off on both sides; every round is timed between device syncs.
Printed ratios and their targets: FedAvg / hand <= 1.05, FedSMOO / FedAvg <= 2.1, bf16 / fp32 <= 1.0,
eager / compiled >= 2 (on a GPU).

    python benchmarks/gpu.py                                   # a GPU, the default sizes
    python benchmarks/gpu.py --device cpu --model small --clients 4 --local-steps 10 --batch-size 32
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from common import bare_trainer, hand_written_fedavg, sync
from lightning.pytorch import Callback, Trainer

from fl_lightning import Runtime
from fl_lightning.api.client import ClientModule
from fl_lightning.data import IID, DatasetSplits, FederatedDataModule, register_dataset
from fl_lightning.lightning.module import FederatedModule
from fl_lightning.models import SmallCNN
from fl_lightning.models.resnet import ResNet18GN
from fl_lightning.strategies import FedAvg, FedSMOO, Strategy

DATASET = "benchmark_gpu_synthetic"
CLASSES = 10


def synthetic_splits(args: argparse.Namespace) -> DatasetSplits:
    """CIFAR-10-shaped data: ``x = mean_y + noise`` with one random mean image per class (learnable)."""
    g = torch.Generator().manual_seed(0)
    shape = (3, args.image_size, args.image_size)
    means = torch.randn(CLASSES, *shape, generator=g)

    def draw(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.randint(0, CLASSES, (n,), generator=g)
        return means[y] + 2.0 * torch.randn(n, *shape, generator=g), y

    train_x, train_y = draw(args.clients * args.samples_per_client)
    test_x, test_y = draw(max(args.batch_size, 100))
    return DatasetSplits(DATASET, "multiclass", CLASSES, train_x, train_y, test_x, test_y)


def make_net(args: argparse.Namespace) -> torch.nn.Module:
    torch.manual_seed(0)
    if args.model == "resnet18_gn":
        return ResNet18GN(num_classes=CLASSES, in_channels=3)
    return SmallCNN(in_channels=3, num_classes=CLASSES, width=args.width)


def make_data(args: argparse.Namespace) -> FederatedDataModule:
    splits = synthetic_splits(args)
    register_dataset(DATASET)(lambda root, download: splits)
    dm = FederatedDataModule(
        DATASET,
        num_clients=args.clients,
        partition=IID(),
        batch_size=args.batch_size,
        local_test_fraction=0.0,
    )
    dm.setup("fit")
    return dm


class RoundTimer(Callback):
    """Wall-clock seconds of every round (one training step), between device syncs."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.times, self._t0 = device, [], 0.0

    def on_train_batch_start(self, trainer: Trainer, module: Any, batch: Any, batch_idx: int) -> None:
        sync(self.device)
        self._t0 = time.perf_counter()

    def on_train_batch_end(
        self, trainer: Trainer, module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        sync(self.device)
        self.times.append(time.perf_counter() - self._t0)


def framework(
    args: argparse.Namespace, dm: FederatedDataModule, strategy: Strategy, precision: str, compile: bool
) -> list[float]:
    """Per-round seconds of ``strategy`` through FederatedModule and a Lightning Trainer."""
    device = torch.device(args.device)
    client = ClientModule(make_net(args), lr=args.lr, momentum=0.0, weight_decay=args.weight_decay)
    runtime = Runtime(compile=compile)
    module = FederatedModule(
        client, strategy, local_steps=args.local_steps, eval_clients_every=0, runtime=runtime
    )
    timer = RoundTimer(device)
    trainer = bare_trainer(
        args.rounds, device, precision=precision, callbacks=[timer], default_root_dir=str(Path(args.root))
    )
    trainer.fit(module, datamodule=dm)
    return timer.times


def hand(args: argparse.Namespace, dm: FederatedDataModule) -> list[float]:
    device = torch.device(args.device)
    _, times, _ = hand_written_fedavg(
        make_net(args).to(device),
        dm.clients,
        args.rounds,
        args.local_steps,
        args.batch_size,
        args.lr,
        weight_decay=args.weight_decay,
        device=device,
    )
    return times


def steady(times: list[float]) -> float:
    """Median seconds per round after the first (warm-up) round."""
    return statistics.median(times[1:] if len(times) > 1 else times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--model", choices=["resnet18_gn", "small"], default="resnet18_gn")
    p.add_argument("--width", type=int, default=32, help="SmallCNN width (--model small)")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--local-steps", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=50)
    p.add_argument("--samples-per-client", type=int, default=500)
    p.add_argument("--rounds", type=int, default=3, help="rounds per measurement (the first is warm-up)")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--weight-decay", type=float, default=1e-3)
    p.add_argument("--no-compile", action="store_true", help="skip the compiled run")
    p.add_argument("--threads", type=int, default=None, help="CPU intra-op threads (default: torch's)")
    p.add_argument("--root", default="/tmp/fl_lightning_gpu_benchmark")
    args = p.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("lightning.fabric").setLevel(logging.ERROR)
    device = torch.device(args.device)
    dm = make_data(args)
    if device.type == "cuda":
        dm.to(device)  # the hand-written loop reads the same device-resident tensors

    runs: dict[str, list[float]] = {"hand FedAvg fp32": hand(args, dm)}
    runs["FedAvg fp32"] = framework(args, dm, FedAvg(), "32-true", False)
    runs["FedSMOO fp32"] = framework(args, dm, FedSMOO(beta=10.0, rho=0.1, clip_norm=10.0), "32-true", False)
    runs["FedAvg bf16-mixed"] = framework(args, dm, FedAvg(), "bf16-mixed", False)
    if not args.no_compile:
        runs["FedAvg fp32 compiled"] = framework(args, dm, FedAvg(), "32-true", True)
    sec = {k: steady(v) for k, v in runs.items()}

    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"CPU, {torch.get_num_threads()} threads"
    print(
        f"device: {name}; torch {torch.__version__}\n"
        f"work per round: {args.clients} clients x {args.local_steps} local steps, "
        f"batch {args.batch_size}, {args.model}, {args.image_size}x{args.image_size}x3 synthetic data; "
        f"median of rounds 2..{args.rounds}"
    )
    for k, v in sec.items():
        print(f"  {k:22s} {v:8.3f} s/round")
    ratios = [
        (
            "fl_lightning FedAvg / hand-written FedAvg",
            sec["FedAvg fp32"] / sec["hand FedAvg fp32"],
            "<= 1.05",
        ),
        ("FedSMOO / FedAvg", sec["FedSMOO fp32"] / sec["FedAvg fp32"], "<= 2.1"),
        ("bf16-mixed / fp32 (FedAvg)", sec["FedAvg bf16-mixed"] / sec["FedAvg fp32"], "<= 1.0"),
    ]
    if "FedAvg fp32 compiled" in sec:
        eager_over_compiled = sec["FedAvg fp32"] / sec["FedAvg fp32 compiled"]
        ratios.append(("eager / compiled (FedAvg fp32)", eager_over_compiled, ">= 2 on a GPU"))
    print("ratios (target):")
    for label, value, target in ratios:
        print(f"  {label:42s} {value:6.3f}  ({target})")


if __name__ == "__main__":
    main()
