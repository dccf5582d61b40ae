"""Strategies used only by tests that launch the CLI in subprocesses (importable by class path)."""

from __future__ import annotations

import os
import signal

import torch

from fl_lightning.api.aggregation import Aggregator
from fl_lightning.strategies import FedAvg


class Stateful(FedAvg):
    """FedAvg plus per-client state that feeds back into training (it must follow its client)."""

    def local_loss(self, module, ctx, batch, outputs):
        drift = ctx.state.get("drift")
        return None if drift is None else 0.05 * drift * sum(p.sum() for p in module.parameters())

    def upload(self, module, ctx):
        up = super().upload(module, ctx)
        delta = sum((up["weights"][k] - v).sum() for k, v in ctx.message["weights"].items())
        ctx.state["drift"] = ctx.state.get("drift", torch.zeros((), device=delta.device)) + delta
        return up


class FailOn(FedAvg):
    """FedAvg where some clients raise and some upload NaN, on whichever process trains them."""

    def __init__(self, raise_on: list[int] | None = None, nan_on: list[int] | None = None) -> None:
        super().__init__()
        self.raise_on, self.nan_on = set(raise_on or []), set(nan_on or [])

    def on_client_start(self, module, ctx):
        super().on_client_start(module, ctx)
        if ctx.client_id in self.raise_on:
            raise RuntimeError("deliberate failure")

    def upload(self, module, ctx):
        up = super().upload(module, ctx)
        if ctx.client_id in self.nan_on:
            up["weights"] = {k: torch.full_like(v, float("nan")) for k, v in up["weights"].items()}
        return up


def median(entries):
    """Coordinate-wise median of the round's uploads (an order statistic: needs every upload)."""
    groups = entries[0][1]
    return {
        g: {n: torch.stack([up[g][n] for _, up, _ in entries]).median(dim=0).values for n in groups[g]}
        for g in groups
    }


class MedianFedAvg(FedAvg):
    """FedAvg with the coordinate-wise median as aggregate (all-gathered uploads under DDP)."""

    def aggregator(self):
        return Aggregator(reduce=median)


class StopAt(FedAvg):
    """FedAvg whose run is stopped in round ``round`` (0-based), as ``how`` says.

    ``"fail"``: every client raises (a RuntimeError; with ``model.max_failed_rounds=1`` the run stops
    with a RunError); ``"interrupt"``: a KeyboardInterrupt (Ctrl-C); ``"sigterm"``: a SIGTERM sent to
    this process once (the round completes, then Lightning stops).
    """

    def __init__(self, round: int = 1, how: str = "fail") -> None:
        super().__init__()
        self.round, self.how = round, how
        self._signalled = False

    def on_client_start(self, module, ctx):
        super().on_client_start(module, ctx)
        if ctx.round < self.round:
            return
        if self.how == "fail":
            raise RuntimeError("deliberate failure")
        if self.how == "interrupt":
            raise KeyboardInterrupt
        if self.how == "sigterm" and not self._signalled:
            self._signalled = True
            os.kill(os.getpid(), signal.SIGTERM)
