"""Seeded client sampling: which clients a round draws, as a pure function of ``(seed, round)``."""

from __future__ import annotations

import torch

from fl_lightning.functional.tensor import derive_seed

#: Stream key of the round's client sampling in :func:`~fl_lightning.functional.tensor.derive_seed`.
SAMPLING_STREAM = 0x5A3


def sample_clients(num_clients: int, count: int, seed: int, round: int) -> list[int]:
    """``count`` distinct clients for ``round``, sorted; a function of ``(seed, round)`` only.

    So a resumed run, or any process of a distributed one, draws the same clients for the same round.
    """
    g = torch.Generator().manual_seed(derive_seed(seed, SAMPLING_STREAM, round))
    return sorted(torch.randperm(num_clients, generator=g)[:count].tolist())
