"""Spreading a round's clients over the processes of a ``torch.distributed`` group, and leaving it.

The processes are the ones Lightning launches for ``--trainer.devices N`` / ``--trainer.num_nodes`` (DDP:
gloo on CPU, NCCL on GPU); the collectives are :mod:`fl_lightning.api.collectives`.
"""

from __future__ import annotations

import torch.distributed as dist


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
