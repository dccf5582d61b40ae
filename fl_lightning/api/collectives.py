"""Collectives of a process group (``torch.distributed``), as the aggregators and the engine use them.

Every process of a run holds the same global model and trains its share of a round's clients; what they
learnt is combined with collectives of the process group Lightning (or ``torchrun``) started: gloo on CPU,
NCCL on GPU. Nothing here starts processes or opens sockets, and outside a process group every function is
the identity (one process).

Per round the engine pays for two exchanges: one :func:`all_gather_objects` of the round's small facts
(which clients, their metrics, the layout of the weighted sums) and one :func:`all_reduce_flat` of every
weighted sum packed into one flat buffer per dtype (one ``all_reduce`` for a float32 model).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor


def is_distributed() -> bool:
    """True inside an initialised process group with more than one process."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world() -> tuple[int, int]:
    """``(rank, world size)`` of this process (``(0, 1)`` outside a process group)."""
    if not is_distributed():
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def all_gather_objects(obj: Any) -> list[Any]:
    """``obj`` from every process, in rank order (a one-element list outside a process group)."""
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def all_reduce_flat(tensors: list[Tensor]) -> None:
    """Sum ``tensors`` over all processes, in place, with one ``all_reduce`` per dtype.

    The tensors (same list, shapes and dtypes on every process) are packed into one contiguous buffer per
    dtype, reduced, and copied back: a model of a few dozen tensors costs one collective, not one each.
    """
    if not is_distributed() or not tensors:
        return
    by_dtype: dict[torch.dtype, list[Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    for dtype in sorted(by_dtype, key=str):
        group = by_dtype[dtype]
        flat = torch.cat([t.reshape(-1) for t in group])
        dist.all_reduce(flat)
        offset = 0
        for t in group:
            n = t.numel()
            t.copy_(flat[offset : offset + n].view_as(t))
            offset += n


def sums_layout(
    sums: dict[str, dict[str, Tensor]],
) -> dict[str, dict[str, tuple[tuple[int, ...], torch.dtype]]]:
    """The names, shapes and dtypes of weighted sums (exchanged before they are reduced)."""
    return {g: {n: (tuple(t.shape), t.dtype) for n, t in ts.items()} for g, ts in sums.items()}


def reduce_sums(
    sums: dict[str, dict[str, Tensor]],
    layouts: list[dict[str, dict[str, tuple[tuple[int, ...], torch.dtype]]]],
    device: torch.device,
) -> None:
    """Sum per-process weighted sums over all processes, in place, in one flat exchange per dtype.

    ``layouts`` are every process's :func:`sums_layout` (a process may have trained no client, or only
    failed ones: its missing entries join as zeros). Entries are packed in sorted order, the same on every
    process. (The weight totals are plain numbers: they travel with the layouts, see
    :meth:`fl_lightning.api.aggregation.Aggregator.combine`.)
    """
    merged: dict[str, dict[str, tuple[tuple[int, ...], torch.dtype]]] = {}
    for part in layouts:
        for g, ts in part.items():
            merged.setdefault(g, {}).update(ts)
    ordered: list[Tensor] = []
    for g in sorted(merged):
        group = sums.setdefault(g, {})
        for n in sorted(merged[g]):
            shape, dtype = merged[g][n]
            if n not in group:
                group[n] = torch.zeros(shape, dtype=dtype, device=device)
            ordered.append(group[n])
    all_reduce_flat(ordered)


__all__ = ["all_gather_objects", "all_reduce_flat", "is_distributed", "reduce_sums", "sums_layout", "world"]
