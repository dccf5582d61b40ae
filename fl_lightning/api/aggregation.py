"""The aggregator: how a round's uploads become the averaged payload the server update receives.

A strategy declares its aggregation in one place, :meth:`~fl_lightning.api.strategy.Strategy.aggregator`,
which returns a fresh :class:`Aggregator` for each round, configured with

- ``weighting``: each payload group's aggregation weight ``w_k``, ``"samples"`` (``n_k``, the client's
  training samples; the default), ``"uniform"`` (1) or a function of the upload and ``n_k`` (FedNova: ``n_k
  / ||a_k||_1``); one rule for every group or a rule per group;
- ``receive``: a server-side transform of each upload before it is weighted (TDPFed-ACT composes the
  uploaded factors, FedAvg (s.a.r.) expands a sparse upload, FedGen weights the heads by label counts);
- ``reduce``: a reduction that needs every upload (order statistics: median, trimmed mean, Krum; FedPAC's
  classifier collaboration). Without one the aggregator keeps streaming weighted sums ``sum_k w_k t_k`` and
  ``sum_k w_k`` per group (one model-sized buffer per group whatever the number of clients, all-reduced
  across processes); with one it keeps every upload (all-gathered across processes, ordered by client id).

A plug-in builds on its base's aggregator with :meth:`Aggregator.replace` or :meth:`Aggregator.reweighted`
(DP averages the weights uniformly; the robust plug-ins reduce them by an order statistic).

The engine calls :meth:`Aggregator.add` for every upload it accepts; in a process group it exchanges every
process's :meth:`Aggregator.share` (with the round's other facts, in one exchange) and calls
:meth:`Aggregator.combine` with them (every process then holds the whole round's aggregate); then
:meth:`Aggregator.means`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

import torch
from torch import Tensor

from fl_lightning.api.collectives import reduce_sums, sums_layout
from fl_lightning.api.types import Payload
from fl_lightning.functional.tensor import accumulate

#: One buffered upload: ``(client_id, payload after receive, {group: aggregation weight})``.
Entry = tuple[int, Payload, dict[str, float]]
#: A group's weighting rule: by sample count, uniform, or ``rule(upload, num_samples) -> weight``.
Rule = Literal["samples", "uniform"] | Callable[[Payload, int], float]
#: One rule for every group, or ``{group: rule}`` where ``"*"`` is the rule of the groups not named
#: (default ``"samples"``).
Weighting = Rule | Mapping[str, Rule]
#: The key of a weighting's rule for the groups it does not name.
OTHERS = "*"


def _rules(weighting: Weighting) -> dict[str, Rule]:
    rules = dict(weighting) if isinstance(weighting, Mapping) else {OTHERS: weighting}
    for group, rule in rules.items():
        if rule not in ("samples", "uniform") and not callable(rule):
            raise ValueError(
                f"weighting of {group!r} must be 'samples', 'uniform' or a function, got {rule!r}"
            )
    return rules


def weighted_mean(entries: list[Entry]) -> Payload:
    """``sum_k w_k t_k / sum_k w_k`` per group over buffered ``entries`` (summed in their order)."""
    sums: dict[str, dict[str, Tensor]] = {}
    totals: dict[str, float] = {}
    for _, upload, weights in entries:
        for g, ts in upload.items():
            accumulate(sums.setdefault(g, {}), ts, weights[g])
            totals[g] = totals.get(g, 0.0) + weights[g]
    return {g: {n: t / totals[g] for n, t in ts.items()} for g, ts in sums.items()}


class Aggregator:
    """One round's aggregate of the accepted uploads, as the strategy configured it.

    ``means()[g][n] = sum_k w_k t_k[g][n] / sum_k w_k`` over the uploads added (after :meth:`combine`, over
    every process's uploads), or ``reduce(entries)`` when a reduction is given.

    Args:
        weighting: The aggregation weight ``w_k`` of each payload group: ``"samples"`` (``n_k``),
            ``"uniform"`` (1) or ``rule(upload, n_k) -> float`` (of the upload after ``receive``); one rule
            for every group, or ``{group: rule}`` with ``"*"`` for the groups not named (default
            ``"samples"``), e.g. ``{"control": "uniform"}`` (SCAFFOLD).
        receive: Server side, per upload, before it is weighted: what a client sent -> what is averaged
            (None: as sent). Runs after the upload's bytes were counted, so a strategy can aggregate
            something the server derives from each upload without sending it.
        reduce: The aggregate of every upload of the round, given the entries ``(client_id, upload,
            weights)`` sorted by client id (None: the streaming weighted mean). :func:`weighted_mean` is the
            plain mean of entries, for the groups a reduction leaves as they are.
    """

    def __init__(
        self,
        weighting: Weighting = "samples",
        receive: Callable[[Payload], Payload] | None = None,
        reduce: Callable[[list[Entry]], Payload] | None = None,
    ) -> None:
        self.weighting = _rules(weighting)
        self.receive = receive
        self.reduce = reduce
        self.sums: dict[str, dict[str, Tensor]] = {}
        self.totals: dict[str, float] = {}
        self.entries: list[Entry] = []

    # ------------------------------------------------------------------------------ configuration
    @property
    def buffered(self) -> bool:
        """Whether every upload is kept for a reduction (``reduce`` given) instead of streaming sums."""
        return self.reduce is not None

    def replace(self, **changes: Any) -> Aggregator:
        """A fresh aggregator with this one's configuration, ``changes`` (``weighting``, ``receive``,
        ``reduce``) replaced: how a plug-in builds on its base's."""
        config = {"weighting": self.weighting, "receive": self.receive, "reduce": self.reduce, **changes}
        return Aggregator(**config)

    def reweighted(self, rules: Mapping[str, Rule]) -> Aggregator:
        """A fresh aggregator whose groups named in ``rules`` follow them (the others as before)."""
        return self.replace(weighting={**self.weighting, **rules})

    def weight(self, group: str, upload: Payload, num_samples: int) -> float:
        """The aggregation weight of ``group`` of ``upload`` (after ``receive``) from a client with
        ``num_samples`` training samples."""
        rule = self.weighting.get(group, self.weighting.get(OTHERS, "samples"))
        if rule == "samples":
            return float(num_samples)
        if rule == "uniform":
            return 1.0
        return float(rule(upload, num_samples))  # type: ignore[operator]

    # ------------------------------------------------------------------------------ the round
    def add(self, upload: Payload, num_samples: int, client_id: int = -1) -> None:
        """Add one client's upload (as sent; ``receive`` is applied here) with its sample count."""
        if self.receive is not None:
            upload = self.receive(upload)
        weights = {g: self.weight(g, upload, num_samples) for g in upload}
        if self.buffered:
            # uploads may alias the worker's tensors (reused for the next client): keep a copy
            kept = {g: {n: t.detach().clone() for n, t in ts.items()} for g, ts in upload.items()}
            self.entries.append((client_id, kept, weights))
            return
        for group, w in weights.items():
            accumulate(self.sums.setdefault(group, {}), upload[group], w)
            self.totals[group] = self.totals.get(group, 0.0) + w

    def share(self) -> Any:
        """What this process tells the others before :meth:`combine` (a small, picklable object): the layout
        of its weighted sums and its weight totals (the sums themselves are reduced in place), or its
        uploads (on the CPU) when buffered."""
        if self.buffered:
            return [(c, _to(p, torch.device("cpu")), w) for c, p, w in self.entries]
        return sums_layout(self.sums), dict(self.totals)

    def combine(self, shared: list[Any], device: torch.device) -> None:
        """Make this process hold the aggregate over all processes, given every process's :meth:`share`
        (in rank order, this one's included); a collective: every process calls it. Buffered: every
        process's uploads, ordered by client id, back on ``device``."""
        if self.buffered:
            gathered = [e for part in shared for e in part]
            self.entries = [(c, _to(p, device), w) for c, p, w in sorted(gathered, key=lambda e: e[0])]
            return
        reduce_sums(self.sums, [layout for layout, _ in shared], device)
        totals: dict[str, float] = {}
        for _, part in shared:  # in rank order: the same sums, bit for bit, on every process
            for g, w in part.items():
                totals[g] = totals.get(g, 0.0) + w
        self.totals = totals

    def means(self) -> Payload:
        """The aggregated payload handed to ``process_aggregate`` and then ``server_update``."""
        if self.reduce is not None:
            return self.reduce(sorted(self.entries, key=lambda e: e[0]))
        return {g: {n: t / self.totals[g] for n, t in ts.items()} for g, ts in self.sums.items()}

    @property
    def weight_totals(self) -> dict[str, float]:
        """Sum of the aggregation weights per payload group (``RoundInfo.weight_totals``)."""
        if not self.buffered:
            return dict(self.totals)
        totals: dict[str, float] = {}
        for _, _, weights in self.entries:
            for g, w in weights.items():
                totals[g] = totals.get(g, 0.0) + w
        return totals


def _to(payload: Payload, device: torch.device) -> Payload:
    return {g: {n: t.to(device) for n, t in ts.items()} for g, ts in payload.items()}


__all__ = ["OTHERS", "Aggregator", "Entry", "Rule", "Weighting", "weighted_mean"]
