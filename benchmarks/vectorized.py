"""Round time of vectorised clients (``model.runtime.vectorize``) against one client at a time; ratios from
one run.

Work (defaults): ResNet-18-GN (``resnet18_gn`` in the model registry), every client of the federation
sampled each round, 10, 20 and 50 clients per round, 50 local SGD steps at batch 50, FedAvg and FedSMOO
(rho 0.1, beta 10, clip 10), on ``data.dataset=synthetic:cifar10`` (generated, IID, no download). For each
(strategy, clients) the same data and model run sequentially (``vectorize=1``) and vectorised
(``vectorize=clients``: one group per round, unless the memory budget splits it), each timed as the
fastest of the rounds after a warm-up round (the least disturbed by other jobs on a shared machine),
between device syncs, with the two modes alternating ``--repeats`` times; validation and client evaluation
are off. Printed: seconds per round, the speed-up sequential / vectorised (targets on one GPU: >= 1.8x at
10 clients, >= 3x at 20, >= 5x at 50) and, on CUDA, the peak device memory of a vectorised round. With
``--compile`` each (strategy, clients) adds a row with the vectorised round under
``model.runtime.compile=true`` (the vmapped forward compiled; CUDA graphs on a GPU) against the same
sequential eager round; its compilation falls in the warm-up round.

    python benchmarks/vectorized.py                                          # a GPU, the default sizes
    python benchmarks/vectorized.py --compile                                # + vectorised and compiled
    python benchmarks/vectorized.py --device cpu --model small --local-steps 5 --rounds 3 --repeats 2

``--workload cross_device`` is issue 33's CPU workload instead: Fashion-MNIST (Debian's
/usr/share/datasets/fashion-mnist) over 1,000 IID clients, 100 per round, one local epoch of batch 10 (60
samples each, no local test split: 6 steps), the FedAvg paper's 2NN (784-200-200-10), SGD lr 0.05 without
momentum, FedAvg, one intra-op thread, no evaluation. Four modes, each in a fresh process (for its peak
RSS), alternating ``--repeats`` times: one client at a time (``model.runtime.vectorize=1``),
``model.runtime.vectorize=100`` (``model.runtime.vectorize_cpu=measure``: its first round measures and
decides), and two hand-written batched
rounds doing the same work (the clients' batches from the same per-client generators, the weighted mean of
the clients' weights as the new global model): the 100 clients' MLPs as ``baddbmm`` with autograd and one
``torch._foreach_add_`` update per step, and the backward written by hand with the update fused into
``baddbmm_``. Printed per mode: round 1, the steady round (median of rounds 2..R, fastest over the
repeats), the process's peak RSS during the rounds and its growth over the RSS before them (the data
loaded); then one at a time / vectorize=100
(target >= 2x, stretch 3x) and vectorize=100 / hand-written (target <= 1.3).

    python benchmarks/vectorized.py --workload cross_device --rounds 5 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from common import bare_trainer
from gpu import RoundTimer
from torch.nn.utils.rnn import pad_sequence

from fl_lightning import Runtime
from fl_lightning.api.client import ClientModule
from fl_lightning.data import IID, FederatedDataModule
from fl_lightning.data.datasets import Synthetic
from fl_lightning.engine.local import client_seed
from fl_lightning.functional.sampling import sample_clients
from fl_lightning.lightning.module import FederatedModule
from fl_lightning.models import MLP, SmallCNN, create_model
from fl_lightning.strategies import FedAvg, FedSMOO, Strategy


def make_net(args: argparse.Namespace) -> torch.nn.Module:
    torch.manual_seed(0)
    if args.model == "resnet18_gn":
        return create_model("resnet18_gn", num_classes=10, in_channels=3)
    return SmallCNN(in_channels=3, num_classes=10, width=args.width, hidden=64)


def make_data(args: argparse.Namespace, clients: int) -> FederatedDataModule:
    dm = FederatedDataModule(
        Synthetic(like="cifar10", train_size=clients * args.samples_per_client, test_size=100),
        num_clients=clients,
        partition=IID(),
        batch_size=args.batch_size,
        local_test_fraction=0.0,
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
        runtime=Runtime(
            vectorize=vectorize,
            vectorize_memory_gb=args.memory_gb,
            vectorize_cpu="batched",  # the vectorised path itself, whatever a CPU would measure
            threads_per_process=args.threads,
            compile=compile,
        ),
    )
    timer = RoundTimer(device)
    trainer = bare_trainer(args.rounds, device, callbacks=[timer], default_root_dir=str(Path(args.root)))
    trainer.fit(module, datamodule=dm)
    executor = module.engine.executor
    if vectorize > 1 and (executor.notices or not executor.counts["vectorised"]):
        raise RuntimeError(f"{name} did not run vectorised: {executor.notices}")
    peak = module.history[-1].peak_memory_gb or float("nan")
    return timer.times[1:] if len(timer.times) > 1 else timer.times, peak


# ------------------------------------------------------------------------------ the cross-device workload
CROSS_DEVICE_MODES = ("one at a time", "vectorize=100", "hand-written autograd", "hand-written fused")


def cross_device_data(args: argparse.Namespace) -> FederatedDataModule:
    dm = FederatedDataModule(
        "fashion_mnist",
        num_clients=args.num_clients,
        partition=IID(),
        batch_size=10,
        local_test_fraction=0.0,
    )
    dm.setup("fit")
    return dm


def cross_device_net() -> MLP:
    torch.manual_seed(0)
    return MLP(in_features=784, num_classes=10, hidden=(200, 200))


def framework_rounds(args: argparse.Namespace, dm: FederatedDataModule, vectorize: int) -> tuple[list, dict]:
    """Seconds of each round through FederatedModule, and the run's ``vectorize/*`` record."""
    client = ClientModule(cross_device_net(), lr=0.05, momentum=0.0)
    module = FederatedModule(
        client,
        FedAvg(),
        clients_per_round=args.per_round,
        local_epochs=1,
        eval_clients_every=0,
        runtime=Runtime(vectorize=vectorize, threads_per_process=1),
    )
    timer = RoundTimer(torch.device("cpu"))
    trainer = bare_trainer(args.rounds, torch.device("cpu"), callbacks=[timer], default_root_dir=args.root)
    trainer.fit(module, datamodule=dm)
    return timer.times, module.history[-1].vectorize


def hand_rounds(args: argparse.Namespace, dm: FederatedDataModule, fused: bool) -> list[float]:
    """FedAvg rounds of the 2NN written by hand as one batched computation over the round's clients (the
    engine's sampling and per-client batch generators, so the same work): stacked weights ``[K, out, in]``
    loaded from the global model, ``baddbmm`` forwards, then either autograd and one multi-tensor update
    per step or a hand-written backward whose update goes straight into the weights (``baddbmm_``), and the
    clients' weights averaged by sample count into the global model."""
    net = cross_device_net()
    layers = [m for m in net.modules() if isinstance(m, torch.nn.Linear)]
    global_w = [(m.weight.detach().clone(), m.bias.detach().clone()) for m in layers]
    size = args.per_round
    ws = [w.unsqueeze(0).repeat(size, 1, 1) for w, _ in global_w]  # allocated once, as the engine's stack
    bs = [b.unsqueeze(0).repeat(size, 1) for _, b in global_w]
    x_all, y_all = dm.clients[0].x, dm.clients[0].y
    lr, times = 0.05, []
    for r in range(args.rounds):
        start = time.perf_counter()
        clients = [dm.clients[c] for c in sample_clients(len(dm.clients), size, 0, r)]
        with torch.no_grad():
            for (w, b), sw, sb in zip(global_w, ws, bs):
                sw.copy_(w.expand_as(sw))
                sb.copy_(b.expand_as(sb))
        gens = [torch.Generator().manual_seed(client_seed(0, r, c.client_id)) for c in clients]
        steps = [c.steps_per_epoch(10) for c in clients]
        streams = [c.batch_indices(10, n, g) for c, n, g in zip(clients, steps, gens)]
        none = torch.zeros(0, dtype=torch.long)
        for step in range(max(steps)):
            idx = [next(s) if step < n else none for s, n in zip(streams, steps)]
            count = torch.tensor([len(i) for i in idx], dtype=torch.float32)
            padded = pad_sequence(idx, batch_first=True)
            mask = (torch.arange(padded.shape[1]) < count[:, None]).float()
            count = count.clamp(min=1)
            x = x_all.index_select(0, padded.flatten()).view(size, padded.shape[1], -1)
            y = y_all.index_select(0, padded.flatten()).view(size, -1)
            if fused:
                _fused_step(ws, bs, x, y, mask, count, lr)
            else:
                _autograd_step(ws, bs, x, y, mask, count, lr)
        share = torch.tensor([float(c.num_samples) for c in clients])
        share /= share.sum()
        with torch.no_grad():
            global_w = [(torch.tensordot(share, w, 1), torch.tensordot(share, b, 1)) for w, b in zip(ws, bs)]
        times.append(time.perf_counter() - start)
    return times


def _forward(ws: list, bs: list, x: torch.Tensor) -> list[torch.Tensor]:
    """Every layer's output (ReLU after the hidden layers), each client through its own weights."""
    outs, h = [], x
    for i, (w, b) in enumerate(zip(ws, bs)):
        h = torch.baddbmm(b.unsqueeze(1), h, w.transpose(1, 2))
        if i < len(ws) - 1:
            h = h.relu()
        outs.append(h)
    return outs


def _autograd_step(ws: list, bs: list, x, y, mask, count, lr: float) -> None:
    params = ws + bs
    for p in params:
        p.requires_grad_(True)
    logits = _forward(ws, bs, x)[-1]
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view_as(mask)
    ((loss * mask).sum(1) / count).sum().backward()
    with torch.no_grad():
        torch._foreach_add_(params, [p.grad for p in params], alpha=-lr)
    for p in params:
        p.grad = None
        p.requires_grad_(False)


@torch.no_grad()
def _fused_step(ws: list, bs: list, x, y, mask, count, lr: float) -> None:
    outs = _forward(ws, bs, x)
    d = torch.softmax(outs[-1], -1)
    d.scatter_add_(-1, y.unsqueeze(-1), -torch.ones_like(d[..., :1]))
    d.mul_((mask / count[:, None]).unsqueeze(-1))
    for i in range(len(ws) - 1, -1, -1):
        below = torch.bmm(d, ws[i]) if i > 0 else None  # before the weights change
        ws[i].baddbmm_(d.transpose(1, 2), outs[i - 1] if i > 0 else x, alpha=-lr)
        bs[i].sub_(d.sum(1), alpha=lr)
        if below is not None:
            d = below.masked_fill_(outs[i - 1] <= 0, 0)


def _rss() -> int:
    """The process's resident memory now, in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _reset_peak_rss() -> bool:
    """Reset the process's peak resident memory (Linux: ``5`` into ``/proc/self/clear_refs``)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss() -> int:
    """The process's peak resident memory (since :func:`_reset_peak_rss`), in bytes."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def cross_device_one(args: argparse.Namespace) -> None:
    """One mode of the cross-device workload in this process; prints one JSON line."""
    torch.set_num_threads(1)
    dm = cross_device_data(args)
    before, facts = _rss(), {}
    _reset_peak_rss()  # the peak of the rounds, not of reading the data
    if args.mode == "one at a time":
        times, facts = framework_rounds(args, dm, 1)
    elif args.mode == "vectorize=100":
        times, facts = framework_rounds(args, dm, args.per_round)
    else:
        times = hand_rounds(args, dm, fused=args.mode == "hand-written fused")
    print(json.dumps({"times": times, "rss_before": before, "rss_peak": _peak_rss(), "facts": facts}))


def cross_device(args: argparse.Namespace) -> None:
    """The cross-device workload: each mode in a fresh process, alternating; ratios of the fastest."""
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(
        f"cross-device: Fashion-MNIST, {args.num_clients} IID clients, {args.per_round} per round, 1 local "
        f"epoch of batch 10, 2NN 784-200-200-10, SGD 0.05, FedAvg, 1 thread, torch {torch.__version__}; "
        f"{args.rounds} rounds per run, {args.repeats} run(s) per mode, alternating; load average {load}",
        flush=True,
    )
    runs: dict[str, list[dict]] = {mode: [] for mode in CROSS_DEVICE_MODES}
    for _ in range(args.repeats):
        for mode in CROSS_DEVICE_MODES:
            cmd = [sys.executable, __file__, "--workload", "cross_device", "--mode", mode]
            cmd += ["--rounds", str(args.rounds), "--num-clients", str(args.num_clients)]
            cmd += ["--per-round", str(args.per_round), "--root", args.root]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            runs[mode].append(json.loads(out.strip().splitlines()[-1]))
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    head = ("mode", "round 1", "steady", "peak RSS", "growth")
    print("  (peak RSS: during the rounds; growth: over the process's RSS before them, the data loaded)")
    print("  {:22s} {:>9s} {:>9s} {:>10s} {:>9s}".format(*head))
    steady: dict[str, float] = {}
    for mode, results in runs.items():
        steady[mode] = min(statistics.median(r["times"][1:] or r["times"]) for r in results)
        first = min(r["times"][0] for r in results)
        peak = max(r["rss_peak"] for r in results) / 2**20
        growth = max(r["rss_peak"] - r["rss_before"] for r in results) / 2**20
        print(f"  {mode:22s} {first:8.3f}s {steady[mode]:8.3f}s {peak:7.0f} MiB {growth:5.0f} MiB")
    facts = runs["vectorize=100"][-1]["facts"]
    one, ours = steady["one at a time"], steady["vectorize=100"]
    print(f"  vectorize=100: {', '.join(f'{k}={v:.3g}' for k, v in facts.items())}")
    print(f"  one at a time / vectorize=100: {one / ours:.2f}x (target >= 2x, stretch 3x)")
    for hand in ("hand-written fused", "hand-written autograd"):
        print(f"  vectorize=100 / {hand}: {ours / steady[hand]:.2f} (target <= 1.3)")
    print(f"  load average after: {load}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", choices=["resnet", "cross_device"], default="resnet")
    p.add_argument("--mode", choices=CROSS_DEVICE_MODES, default=None, help=argparse.SUPPRESS)
    p.add_argument("--num-clients", type=int, default=1000, help="cross_device: clients in the federation")
    p.add_argument("--per-round", type=int, default=100, help="cross_device: clients per round")
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
    p.add_argument(
        "--memory-gb", type=float, default=None, help="model.runtime.vectorize_memory_gb (default: auto)"
    )
    p.add_argument("--threads", type=int, default=None, help="CPU intra-op threads per process")
    p.add_argument("--compile", action="store_true", help="add vectorised + model.runtime.compile=true rows")
    p.add_argument("--root", default="/tmp/fl_lightning_vectorized_benchmark")
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    for name in ("lightning.pytorch", "lightning.fabric", "fl_lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    if args.workload == "cross_device":
        cross_device_one(args) if args.mode else cross_device(args)
        return
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
