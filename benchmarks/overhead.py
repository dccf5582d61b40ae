"""Overhead of fl_lightning against a plain PyTorch FedAvg loop doing the same work.

Both sides train the same SmallCNN from the same initial weights on the same digits partition, with
the same clients, local steps, mini-batches (the same per-client RNG streams) and SGD settings, and
average the same way; validation is off on both sides. The plain loop is what one would write by
hand: load the global weights, SGD over shuffled index batches, weighted average.

    python benchmarks/overhead.py                  # prints the ratio fl_lightning / plain
    python benchmarks/overhead.py --rounds 30 --local-steps 40 --threads 1

The end-to-end ratio includes building and tearing down the Lightning Trainer (once per run); the
per-round ratio compares the rounds only. The final weights of both sides are compared to show that
the work is the same (they agree to float rounding: the server step is w - (w - mean)).
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
from common import bare_trainer, hand_written_fedavg

from fl_lightning.api.client import ClientModule
from fl_lightning.data import Dirichlet, FederatedDataModule
from fl_lightning.lightning.module import FederatedModule
from fl_lightning.models import SmallCNN
from fl_lightning.strategies import FedAvg


def make_data(args: argparse.Namespace) -> FederatedDataModule:
    dm = FederatedDataModule(
        "digits",
        num_clients=args.clients,
        partition=Dirichlet(0.5),
        batch_size=args.batch_size,
        local_test_fraction=0.0,
    )
    dm.setup("fit")
    return dm


def initial_net(args: argparse.Namespace) -> SmallCNN:
    torch.manual_seed(0)
    return SmallCNN(1, 10, width=args.width)


def plain(args: argparse.Namespace, dm: FederatedDataModule) -> tuple[float, list[float], SmallCNN]:
    """FedAvg written by hand; returns (total seconds, per-round seconds, final model)."""
    start = time.perf_counter()
    _, rounds, net = hand_written_fedavg(
        initial_net(args), dm.clients, args.rounds, args.local_steps, args.batch_size, args.lr, args.momentum
    )
    return time.perf_counter() - start, rounds, net


def framework(args: argparse.Namespace, dm: FederatedDataModule) -> tuple[float, list[float], SmallCNN]:
    """The same work through FederatedModule and a Lightning Trainer."""
    start = time.perf_counter()
    client = ClientModule(initial_net(args), lr=args.lr, momentum=args.momentum)
    module = FederatedModule(client, FedAvg(), local_steps=args.local_steps, eval_clients_every=0)
    trainer = bare_trainer(args.rounds, torch.device("cpu"))
    trainer.fit(module, datamodule=dm)
    return time.perf_counter() - start, [r.time_s for r in module.history], module.client.net


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--local-steps", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    dm = make_data(args)
    plain(args, dm)  # warm-up (allocator, kernels)
    results: dict[str, list[tuple[float, float]]] = {"plain": [], "fl_lightning": []}
    for _ in range(args.repeats):
        for name, fn in (("plain", plain), ("fl_lightning", framework)):
            total, rounds, net = fn(args, dm)
            results[name].append((total, sum(rounds)))
            if name == "plain":
                plain_net = net
            else:
                diff = max(
                    (a - b).abs().max().item()
                    for a, b in zip(plain_net.state_dict().values(), net.state_dict().values())
                )
    med = {
        k: (statistics.median(t for t, _ in v), statistics.median(r for _, r in v))
        for k, v in results.items()
    }
    steps = args.rounds * args.clients * args.local_steps
    print(
        f"work: {args.rounds} rounds x {args.clients} clients x {args.local_steps} local steps "
        f"(batch {args.batch_size}), "
        f"SmallCNN(width={args.width}), {args.threads} thread(s), median of {args.repeats}"
    )
    for name, (total, rounds) in med.items():
        print(
            f"  {name:13s} total {total:7.3f} s   rounds {rounds:7.3f} s"
            f"   ({1e3 * rounds / steps:.3f} ms/local step)"
        )
    print(f"  max |w_plain - w_fl| after training: {diff:.2e}")
    print(f"ratio fl_lightning/plain, end to end: {med['fl_lightning'][0] / med['plain'][0]:.3f}")
    print(f"ratio fl_lightning/plain, rounds only: {med['fl_lightning'][1] / med['plain'][1]:.3f}")


if __name__ == "__main__":
    main()
