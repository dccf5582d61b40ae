"""Round time of vectorised clients (``model.vectorize``) against one client at a time; ratios from one run.

Work (defaults): ResNet-18-GN (``resnet18_gn`` in the model registry), every client of the federation
sampled each round, 10, 20 and 50 clients per round, 50 local SGD steps at batch 50, FedAvg and FedSMOO
(rho 0.1, beta 10, clip 10), on ``data.dataset=synthetic:cifar10`` (generated, IID, no download). For each
(strategy, clients) the same data and model run sequentially (``vectorize=1``) and vectorised
(``vectorize=clients``: one group per round, unless the memory budget splits it), each timed as the
fastest of the rounds after a warm-up round (the least disturbed by other jobs on a shared machine),
between device syncs, with the two modes alternating ``--repeats`` times; validation and client evaluation
are off. Printed: seconds per round, the speed-up sequential / vectorised (targets on one GPU: >= 1.8x at
10 clients, >= 3x at 20, >= 5x at 50) and, on CUDA, the peak device memory of a vectorised round. With
``--compile`` each (strategy, clients) adds a row with the vectorised round under ``model.compile=true``
(the vmapped forward compiled; CUDA graphs on a GPU) against the same sequential eager round; its
compilation falls in the warm-up round.

    python benchmarks/vectorized.py                                          # a GPU, the default sizes
    python benchmarks/vectorized.py --compile                                # + vectorised and compiled
    python benchmarks/vectorized.py --device cpu --model small --local-steps 5 --rounds 3 --repeats 2
"""

from __future__ import annotations

import argparse
import logging
import warnings
from pathlib import Path

import torch
from common import bare_trainer
from gpu import RoundTimer

from fl_lightning.api.client import ClientModule
from fl_lightning.data import IID, FederatedDataModule
from fl_lightning.data.datasets import SyntheticData
from fl_lightning.engine import vectorized
from fl_lightning.lightning.module import FederatedModule
from fl_lightning.models import SmallCNN, create_model
from fl_lightning.strategies import FedAvg, FedSMOO, Strategy


def make_net(args: argparse.Namespace) -> torch.nn.Module:
    torch.manual_seed(0)
    if args.model == "resnet18_gn":
        return create_model("resnet18_gn", num_classes=10, in_channels=3)
    return SmallCNN(in_channels=3, num_classes=10, width=args.width, hidden=64)


def make_data(args: argparse.Namespace, clients: int) -> FederatedDataModule:
    dm = FederatedDataModule(
        "synthetic:cifar10",
        num_clients=clients,
        partition=IID(),
        batch_size=args.batch_size,
        local_test_fraction=0.0,
        synthetic=SyntheticData(train_size=clients * args.samples_per_client, test_size=100),
    )
    dm.setup("fit")
    return dm


def strategy(name: str) -> Strategy:
    return FedAvg() if name == "FedAvg" else FedSMOO(beta=10.0, rho=0.1, clip_norm=10.0)


def round_times(
    args: argparse.Namespace, dm: FederatedDataModule, name: str, vectorize: int, compile: bool = False
) -> tuple[list[float], float]:
    """(seconds of each round after the warm-up, peak device memory in GiB or NaN)."""
    device = torch.device(args.device)
    client = ClientModule(make_net(args), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    module = FederatedModule(
        client,
        strategy(name),
        local_steps=args.local_steps,
        eval_clients_every=0,
        vectorize=vectorize,
        vectorize_memory_gb=args.memory_gb,
        threads_per_process=args.threads,
        compile=compile,
    )
    timer = RoundTimer(device)
    trainer = bare_trainer(args.rounds, device, callbacks=[timer], default_root_dir=str(Path(args.root)))
    trainer.fit(module, datamodule=dm)
    executor = module.engine.executor
    if vectorize > 1 and (executor.notices or not executor.counts["vectorised"]):
        raise RuntimeError(f"{name} did not run vectorised: {executor.notices}")
    peak = module.history[-1].get("peak_memory_gb", float("nan"))
    return timer.times[1:] if len(timer.times) > 1 else timer.times, peak


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--model", choices=["resnet18_gn", "small"], default="resnet18_gn")
    p.add_argument("--width", type=int, default=16, help="SmallCNN width (--model small)")
    p.add_argument("--clients", default="10,20,50", help="clients per round, comma-separated")
    p.add_argument("--strategies", default="FedAvg,FedSMOO")
    p.add_argument("--local-steps", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=50)
    p.add_argument("--samples-per-client", type=int, default=500)
    p.add_argument("--rounds", type=int, default=3, help="rounds per measurement (the first is warm-up)")
    p.add_argument("--repeats", type=int, default=1, help="measurements per mode, alternating")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.0)
    p.add_argument("--weight-decay", type=float, default=1e-3)
    p.add_argument("--memory-gb", type=float, default=None, help="model.vectorize_memory_gb (default: auto)")
    p.add_argument("--threads", type=int, default=None, help="CPU intra-op threads per process")
    p.add_argument("--compile", action="store_true", help="add vectorised + model.compile=true rows")
    p.add_argument("--vmap-on-cpu", action="store_true", help="the CPU runs the vmap path (VMAP_ON_CPU)")
    p.add_argument("--root", default="/tmp/fl_lightning_vectorized_benchmark")
    args = p.parse_args()
    vectorized.VMAP_ON_CPU = args.vmap_on_cpu
    warnings.filterwarnings("ignore")
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    device = torch.device(args.device)
    if device.type == "cuda":
        where = torch.cuda.get_device_name(device)
    else:
        where = f"CPU, {args.threads or torch.get_num_threads()} threads"
    print(
        f"device: {where}; torch {torch.__version__}\n"
        f"work per round: N clients x {args.local_steps} local steps, batch {args.batch_size}, {args.model}, "
        f"synthetic:cifar10 (IID); fastest of rounds 2..{args.rounds} over {args.repeats} run(s) per mode"
    )
    modes = {"vectorised": False, **({"vec+compiled": True} if args.compile else {})}
    head = ("strategy", "clients", "mode", "sequential", "mode", "speed-up", "peak GiB")
    print("  {:8s} {:>7s} {:>12s} {:>11s} {:>11s} {:>9s} {:>9s}".format(*head))
    for name in args.strategies.split(","):
        for clients in (int(c) for c in args.clients.split(",")):
            dm = make_data(args, clients)
            seq_times: list[float] = []
            times: dict[str, list[float]] = {mode: [] for mode in modes}
            peaks: dict[str, float] = {}
            for _ in range(args.repeats):
                seq_times += round_times(args, dm, name, 1)[0]
                for mode, compile in modes.items():
                    more, peaks[mode] = round_times(args, dm, name, clients, compile)
                    times[mode] += more
            seq = min(seq_times)
            for mode in modes:
                vec = min(times[mode])
                print(
                    f"  {name:8s} {clients:7d} {mode:>12s} {seq:10.3f}s {vec:10.3f}s {seq / vec:8.2f}x "
                    f"{peaks[mode]:9.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
