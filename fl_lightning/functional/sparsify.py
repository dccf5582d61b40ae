"""Random-subset transmission of a flattened model: which entries are sent, and how a receiver fills the rest.

Used by FedAvg (s.a.r.), the TDPFed paper's baseline that "randomly selects some parameters for
transmission according to the same proportion" on the uplink and the downlink (Wang et al., Sec. VII-D).
A sender draws the indices from a seed and sends the seed with the values, so the receiver rebuilds the
same indices: the traffic is ``round(D / ratio)`` values plus one 8-byte seed.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor


def flatten(tensors: Mapping[str, Tensor]) -> Tensor:
    """The entries of ``tensors`` (in key order) as one flat float vector (one copy)."""
    return torch.cat([t.detach().reshape(-1).float() for t in tensors.values()])


def random_indices(numel: int, ratio: float, seed: int, device: torch.device | str = "cpu") -> Tensor:
    """``round(numel / ratio)`` distinct sorted indices in ``[0, numel)``, drawn uniformly from ``seed``.

    The same ``(numel, ratio, seed)`` gives the same indices on any process and device (drawn on the
    CPU). ``ratio = 1`` gives every index. At least one index is drawn.
    """
    count = max(1, min(numel, round(numel / ratio)))
    if count == numel:
        return torch.arange(numel, device=device)
    generator = torch.Generator().manual_seed(int(seed))
    return torch.randperm(numel, generator=generator)[:count].sort().values.to(device)


def densify(values: Tensor, indices: Tensor, fill: Tensor) -> Tensor:
    """A copy of the flat vector ``fill`` with ``values`` written at ``indices`` (what a receiver holds)."""
    return fill.detach().clone().index_copy_(0, indices, values.to(fill.dtype))


def indicator(indices: Tensor, numel: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """A flat 0/1 vector of length ``numel`` with ones at ``indices``."""
    return torch.zeros(numel, dtype=dtype, device=indices.device).index_fill_(0, indices, 1.0)


def received_average(masked_mean: Tensor, mask_mean: Tensor, current: Tensor) -> Tensor:
    """Per entry, the weighted average over the senders of that entry; ``current`` where nobody sent it.

    With ``M_k`` the 0/1 indicator of client ``k``'s sent entries and weights ``p_k``:
    ``masked_mean = sum_k p_k M_k w_k`` and ``mask_mean = sum_k p_k M_k`` (both divided by ``sum_k p_k``),
    and the result is ``masked_mean / mask_mean`` where ``mask_mean > 0``. Every entry sent by every
    client (``ratio = 1``) gives the plain weighted average, FedAvg.
    """
    sent = mask_mean > 0
    return torch.where(sent, masked_mean / torch.where(sent, mask_mean, torch.ones_like(mask_mean)), current)
