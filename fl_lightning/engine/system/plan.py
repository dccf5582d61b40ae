"""A synchronous round as the system model decides it: who trains, how many steps, how long it lasts."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RoundPlan:
    """One synchronous round on the simulated clock, decided before any client trains.

    Attributes:
        sampled: The clients the round sampled (sorted; with over-selection ``ceil((1 + r) K)`` of them).
        steps: The clients that train and the local steps each runs (the executors run exactly these).
        finish_s: Each training client's time from the round's start to its upload's arrival.
        dropped_out: Clients that drop out in the middle of their work: failed clients of the round.
        late: Clients past the deadline that contribute nothing (policy ``drop``, or no step fits).
        partial: Clients past the deadline whose steps were cut to what fits (policy ``partial``).
        discarded: Over-selected clients that finished after the first ``K`` (their work is not used).
        duration_s: The round's simulated time: its slowest accepted client, or the deadline when a
            client missed it (the server waited for it until then), or the ``K``-th arrival with
            over-selection.
        online: How many clients were online when the round sampled.
        wait_s: Simulated time the round waited for a client to come online before it could sample.
    """

    sampled: list[int]
    steps: dict[int, int]
    finish_s: dict[int, float]
    dropped_out: list[int] = field(default_factory=list)
    late: list[int] = field(default_factory=list)
    partial: list[int] = field(default_factory=list)
    discarded: list[int] = field(default_factory=list)
    duration_s: float = 0.0
    online: int = 0
    wait_s: float = 0.0

    @property
    def trained(self) -> list[int]:
        """The clients that train, sorted."""
        return sorted(self.steps)


__all__ = ["RoundPlan"]
