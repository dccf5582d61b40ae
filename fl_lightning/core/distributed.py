"""Spreading a round's clients over processes: assignment, collective reduce, gathering results.

The processes are the ones Lightning launches for ``--trainer.devices N`` / ``--trainer.num_nodes``
(DDP: gloo on CPU, NCCL on GPU). Every process holds the same global model; each trains its share of
the round's clients, and the weighted sums of their uploads are combined with ``all_reduce`` so that
every process applies the same server update. Nothing here starts processes or opens sockets.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor


def is_distributed() -> bool:
    """True inside an initialised process group with more than one process."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def assign_clients(clients: list[int], sizes: dict[int, int], workers: int) -> list[list[int]]:
    """Longest-processing-time-first: clients by decreasing size, each to the least-loaded worker.

    Local work grows with a client's sample count, so balancing the sums of sample counts minimises
    the slowest worker (LPT is within 4/3 of the optimal makespan, Graham 1969). Deterministic:
    ties go to the smaller client id and the lower worker index. Each worker's list is sorted.
    """
    loads = [0] * workers
    out: list[list[int]] = [[] for _ in range(workers)]
    for cid in sorted(clients, key=lambda c: (-sizes[c], c)):
        w = min(range(workers), key=lambda i: (loads[i], i))
        out[w].append(cid)
        loads[w] += sizes[cid]
    return [sorted(ws) for ws in out]


def all_gather_objects(obj: Any) -> list[Any]:
    """``obj`` from every process (a one-element list outside a process group)."""
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def all_reduce_sums(
    sums: dict[str, dict[str, Tensor]], totals: dict[str, float], device: torch.device
) -> None:
    """Sum per-process weighted sums and weight totals over all processes, in place.

    A process may have trained no client (or only failed ones), so the set of entries is agreed
    first (names, shapes, dtypes); missing entries join as zeros. Entries are reduced in sorted
    order, identical on every process.
    """
    if not is_distributed():
        return
    layout = {g: {n: (tuple(t.shape), t.dtype) for n, t in ts.items()} for g, ts in sums.items()}
    merged: dict[str, dict[str, tuple]] = {}
    for part in all_gather_objects(layout):
        for g, ts in part.items():
            merged.setdefault(g, {}).update(ts)
    for g in sorted(merged):
        group = sums.setdefault(g, {})
        for n in sorted(merged[g]):
            shape, dtype = merged[g][n]
            if n not in group:
                group[n] = torch.zeros(shape, dtype=dtype, device=device)
            dist.all_reduce(group[n])
    names = sorted(merged)
    local = torch.tensor([totals.get(g, 0.0) for g in names], dtype=torch.float64, device=device)
    dist.all_reduce(local)
    for g, v in zip(names, local.tolist()):
        totals[g] = v


def leave_process_group() -> None:
    """Wait for every process, then destroy the process group (no-op outside one).

    Called when a command ends, so that no process tears its connections down while another still
    finishes its last round, evaluation or checkpoint: a process that exited first made gloo abort
    its peers at interpreter exit ("terminate called without an active exception", status -6) in
    some 2-process runs. Lightning's own ``atexit`` teardown then finds nothing left to destroy.
    """
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
