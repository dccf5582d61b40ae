"""Pieces shared by the benchmarks: FedAvg written by hand in plain PyTorch.

The hand-written loop does the work of fl_lightning's FedAvg round: for every client, load the global
weights, run ``local_steps`` SGD steps over shuffled index batches drawn from the same per-client RNG
stream as the framework (``derive_seed(seed, client stream, round, client)``, reshuffled at each
pass), and average the results weighted by sample count.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from lightning.pytorch import Trainer
from torch import nn

from fl_lightning.data import ClientData
from fl_lightning.engine.local import client_seed


def bare_trainer(rounds: int, device: torch.device, **kwargs: object) -> Trainer:
    """A Trainer that runs ``rounds`` rounds and nothing else: no validation, logger, checkpoint or bar."""
    return Trainer(
        max_steps=rounds,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="gpu" if device.type == "cuda" else "cpu",
        devices=1,
        **kwargs,
    )


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on CPU), so wall-clock times are complete."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def hand_written_fedavg(
    global_net: nn.Module,
    clients: Sequence[ClientData],
    rounds: int,
    local_steps: int,
    batch_size: int,
    lr: float,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    seed: int = 0,
    device: torch.device | None = None,
    on_round: Callable[[int, float], None] | None = None,
) -> tuple[float, list[float], nn.Module]:
    """FedAvg in plain PyTorch; returns (total seconds, per-round seconds, final global model).

    ``global_net`` is trained in place (on ``device``, default: where it is); the clients' tensors
    must be on that device too. ``on_round(round, seconds)`` is called after each round.
    """
    device = device or next(global_net.parameters()).device
    start = time.perf_counter()
    worker = copy.deepcopy(global_net)
    times = []
    for r in range(rounds):
        sync(device)
        t0 = time.perf_counter()
        sums = {k: torch.zeros_like(v) for k, v in global_net.state_dict().items()}
        total = 0
        for client in clients:
            worker.load_state_dict(global_net.state_dict())
            opt = torch.optim.SGD(worker.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
            gen = torch.Generator().manual_seed(client_seed(seed, r, client.client_id))
            n, steps = client.num_samples, 0
            while steps < local_steps:
                order = client.train_idx[torch.randperm(n, generator=gen)].to(device, non_blocking=True)
                for s in range(0, n, batch_size):
                    idx = order[s : s + batch_size]
                    opt.zero_grad(set_to_none=True)
                    F.cross_entropy(worker(client.x[idx]), client.y[idx]).backward()
                    opt.step()
                    steps += 1
                    if steps == local_steps:
                        break
            with torch.no_grad():
                for k, v in worker.state_dict().items():
                    sums[k].add_(v, alpha=n)
            total += n
        global_net.load_state_dict({k: v / total for k, v in sums.items()})
        sync(device)
        times.append(time.perf_counter() - t0)
        if on_round is not None:
            on_round(r, times[-1])
    return time.perf_counter() - start, times, global_net
