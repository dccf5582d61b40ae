"""Aggregators: how a round's uploads become the averaged payload the server update receives.

The strategy chooses one (:meth:`fl_lightning.api.strategy.Strategy.aggregator`) per round; the engine
calls :meth:`Aggregator.add` for every upload it accepts; in a process group it exchanges every process's
:meth:`Aggregator.share` (with the round's other facts, in one exchange) and calls
:meth:`Aggregator.combine` with them (every process then holds the whole round's aggregate); then
:meth:`Aggregator.means`.

- :class:`StreamingMean` (the default, and what :class:`Aggregator` itself does): weighted sums
  ``sum_k w_k t_k`` and ``sum_k w_k`` per payload group; nothing model-sized is kept per client and the
  processes ``all_reduce`` the sums.
- :class:`BufferedAggregator`: keeps every client's upload, so a reduction can use order statistics
  (coordinate-wise median, trimmed mean, Krum); the processes all-gather the uploads, ordered by client
  id. Subclasses override :meth:`BufferedAggregator.reduce`; the default is the weighted mean.

Weights: ``w_k = n_k`` (the client's training samples) for a group whose ``strategy.weighting(group)``
is ``"samples"``, ``w_k = 1`` for ``"uniform"``. Uploads pass ``strategy.server_receive`` first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from fl_lightning.api.collectives import reduce_sums, sums_layout
from fl_lightning.api.types import Payload
from fl_lightning.functional.tensor import accumulate

if TYPE_CHECKING:
    from fl_lightning.api.strategy import Strategy

#: One buffered upload: ``(client_id, payload after server_receive, {group: aggregation weight})``.
Entry = tuple[int, Payload, dict[str, float]]


class Aggregator:
    """Base aggregator, and the default streaming weighted mean (see :class:`StreamingMean`).

    ``means()[g][n] = sum_k w_k t_k[g][n] / sum_k w_k`` over the uploads added (and, after
    :meth:`combine`, over every process's uploads). Subclasses override :meth:`add`, :meth:`share`,
    :meth:`combine`, :meth:`means` and :attr:`weight_totals` together.

    Args:
        strategy: The strategy whose ``server_receive`` and ``weighting`` apply to each upload. A
            :class:`~fl_lightning.api.strategy.StrategyWrapper` rebinds this to itself, so its own
            overrides of those hooks apply to the aggregator its base chose.
    """

    def __init__(self, strategy: Strategy) -> None:
        self.strategy = strategy
        self.sums: dict[str, dict[str, Tensor]] = {}
        self.totals: dict[str, float] = {}

    def weights(self, upload: Payload, num_samples: int) -> dict[str, float]:
        """The aggregation weight of each group of ``upload``: ``n_k`` or 1 by ``strategy.weighting``."""
        return {g: float(num_samples) if self.strategy.weighting(g) == "samples" else 1.0 for g in upload}

    def add(self, upload: Payload, num_samples: int, client_id: int = -1) -> None:
        """Add one client's upload (as sent; ``server_receive`` is applied here) with its sample count."""
        upload = self.strategy.server_receive(upload)
        for group, w in self.weights(upload, num_samples).items():
            accumulate(self.sums.setdefault(group, {}), upload[group], w)
            self.totals[group] = self.totals.get(group, 0.0) + w

    def share(self) -> Any:
        """What this process tells the others before :meth:`combine` (a small, picklable object): the
        layout of its weighted sums and its weight totals (the sums themselves are reduced in place)."""
        return sums_layout(self.sums), dict(self.totals)

    def combine(self, shared: list[Any], device: torch.device) -> None:
        """Make this process hold the aggregate over all processes, given every process's :meth:`share`
        (in rank order, this one's included); a collective: every process calls it."""
        reduce_sums(self.sums, [layout for layout, _ in shared], device)
        totals: dict[str, float] = {}
        for _, part in shared:  # in rank order: the same sums, bit for bit, on every process
            for g, w in part.items():
                totals[g] = totals.get(g, 0.0) + w
        self.totals = totals

    def means(self) -> Payload:
        """The aggregated payload handed to ``process_aggregate`` and then ``server_update``."""
        return {g: {n: t / self.totals[g] for n, t in ts.items()} for g, ts in self.sums.items()}

    @property
    def weight_totals(self) -> dict[str, float]:
        """Sum of the aggregation weights per payload group (``RoundInfo.weight_totals``)."""
        return dict(self.totals)


class StreamingMean(Aggregator):
    """The default aggregator: streaming weighted sums, one buffer per payload group, all-reduced.

    Memory is one model-sized buffer per group whatever the number of clients (FedAvg, McMahan et al.,
    2017, Algorithm 1: ``w <- sum_k n_k / n * w_k``).
    """


class BufferedAggregator(Aggregator):
    """Keeps every upload of the round, for reductions that need all of them (order statistics).

    In a process group every process shares its uploads (on the CPU) and :meth:`combine` orders all of
    them by client id (back on ``device``), so every process reduces the same list in the same order.
    Override :meth:`reduce`; the default is the weighted mean, equal to :class:`StreamingMean` up to
    float rounding (it sums in client-id order).
    """

    def __init__(self, strategy: Strategy) -> None:
        super().__init__(strategy)
        self.entries: list[Entry] = []

    def add(self, upload: Payload, num_samples: int, client_id: int = -1) -> None:
        upload = self.strategy.server_receive(upload)
        # uploads may alias the worker's tensors (reused for the next client): keep a copy
        kept = {g: {n: t.detach().clone() for n, t in ts.items()} for g, ts in upload.items()}
        self.entries.append((client_id, kept, self.weights(upload, num_samples)))

    def share(self) -> Any:
        return [(c, _to(p, torch.device("cpu")), w) for c, p, w in self.entries]

    def combine(self, shared: list[Any], device: torch.device) -> None:
        gathered = [e for part in shared for e in part]
        self.entries = [(c, _to(p, device), w) for c, p, w in sorted(gathered, key=lambda e: e[0])]

    def means(self) -> Payload:
        return self.reduce(sorted(self.entries, key=lambda e: e[0]))

    @property
    def weight_totals(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for _, _, weights in self.entries:
            for g, w in weights.items():
                totals[g] = totals.get(g, 0.0) + w
        return totals

    def reduce(self, entries: list[Entry]) -> Payload:
        """The aggregate of ``entries`` (sorted by client id); default: ``sum_k w_k t_k / sum_k w_k``."""
        sums: dict[str, dict[str, Tensor]] = {}
        totals: dict[str, float] = {}
        for _, upload, weights in entries:
            for g, ts in upload.items():
                accumulate(sums.setdefault(g, {}), ts, weights[g])
                totals[g] = totals.get(g, 0.0) + weights[g]
        return {g: {n: t / totals[g] for n, t in ts.items()} for g, ts in sums.items()}


def _to(payload: Payload, device: torch.device) -> Payload:
    return {g: {n: t.to(device) for n, t in ts.items()} for g, ts in payload.items()}
