"""Aggregation of a round's uploads: streaming weighted sums, nothing model-sized kept per client."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

from fl_lightning.core.types import Payload
from fl_lightning.functional.tensor import accumulate

if TYPE_CHECKING:
    from fl_lightning.strategies.base import Strategy


class Aggregator:
    """Streaming weighted sums of uploads: ``sum_k w_k * t_k`` and ``sum_k w_k`` per payload group.

    Nothing model-sized is kept per client. ``weights_for(group)`` selects sample-count or uniform
    weights. :meth:`means` divides the sums; across processes the sums (not model lists) are what an
    ``all_reduce`` combines.
    """

    def __init__(self, strategy: Strategy) -> None:
        self.strategy = strategy
        self.sums: dict[str, dict[str, Tensor]] = {}
        self.totals: dict[str, float] = {}

    def add(self, upload: Payload, num_samples: int) -> None:
        for group, tensors in self.strategy.server_receive(upload).items():
            w = float(num_samples) if self.strategy.weighting(group) == "samples" else 1.0
            accumulate(self.sums.setdefault(group, {}), tensors, w)
            self.totals[group] = self.totals.get(group, 0.0) + w

    def means(self) -> Payload:
        return {g: {n: t / self.totals[g] for n, t in ts.items()} for g, ts in self.sums.items()}
