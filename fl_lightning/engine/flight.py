"""A client in flight on a schedule: dispatched, trained, its upload held until it arrives."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from fl_lightning.api.types import Payload, TrainState


@dataclass
class Flight:
    """One dispatched client of a schedule (:mod:`fl_lightning.engine.schedule`), an arrival to consume.

    The client trains when it is dispatched, on the global model of that moment (``version``); on the
    asynchronous schedule what the server keeps of its upload (``held``, the strategy's ``hold``) waits here
    until its simulated arrival (a synchronous round streams every upload into its aggregator instead),
    ``arrival_s = start_s + download + computation + upload``. Arrivals are consumed in the order
    ``(arrival_s, client, batch)``: the clock orders them, ties go to the lower client id.

    Attributes:
        client: The client id.
        batch: The dispatch event that sent it (the ``Work``'s round: the client's RNG stream is seeded by
            ``(seed, batch, client)``, unique per dispatch).
        version: The server version (server steps done) of the global model it trained on, ``tau_k``.
        start_s: The simulated time it was dispatched.
        arrival_s: The simulated time its upload arrives.
        steps: The local steps it ran.
        num_samples: Its training samples.
        held: What the server keeps of its upload until it arrives (None: the client failed or dropped out,
            or a synchronous round aggregated the upload already).
        error: Why it failed ("" if it did not).
        metrics: Its metrics of the local work (``z_client/<id>/*``).
        train_state: Its training-metric states (merged into ``train/*`` of the step that consumes it).
    """

    client: int
    batch: int
    version: int
    start_s: float
    arrival_s: float
    steps: int
    num_samples: int
    held: Payload | None = None
    error: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    train_state: TrainState = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        """Whether the client's work failed (an error, a non-finite upload, a mid-round dropout)."""
        return bool(self.error)

    @property
    def order(self) -> tuple[float, int, int]:
        """The key arrivals are consumed by: the arrival time, then the client id, then the dispatch."""
        return (self.arrival_s, self.client, self.batch)

    def state(self) -> dict[str, Any]:
        """A checkpointable record (plain values and tensors, loadable with ``weights_only=True``)."""
        return {
            "client": self.client,
            "batch": self.batch,
            "version": self.version,
            "start_s": self.start_s,
            "arrival_s": self.arrival_s,
            "steps": self.steps,
            "num_samples": self.num_samples,
            "held": self.held,
            "error": self.error,
            "metrics": dict(self.metrics),
            "train_state": self.train_state,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], device: torch.device) -> Flight:
        """The flight :meth:`state` recorded, its tensors on ``device``."""
        held = state["held"]
        if held is not None:
            held = {g: {n: t.to(device) for n, t in ts.items()} for g, ts in held.items()}
        return cls(
            client=int(state["client"]),
            batch=int(state["batch"]),
            version=int(state["version"]),
            start_s=float(state["start_s"]),
            arrival_s=float(state["arrival_s"]),
            steps=int(state["steps"]),
            num_samples=int(state["num_samples"]),
            held=held,
            error=str(state["error"]),
            metrics={k: float(v) for k, v in state["metrics"].items()},
            train_state=state["train_state"],
        )


__all__ = ["Flight"]
