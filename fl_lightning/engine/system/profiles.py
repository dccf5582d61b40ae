"""Every client's device as the engine's clock reads it: speed, bandwidth, availability, dropout."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Profiles:
    """The devices of a federation, indexed by client id (drawn or read once per run).

    Attributes:
        speed: Training samples per second of each client's device (its computation takes
            ``steps * batch / speed`` seconds).
        download_mbps: Download bandwidth in Mbit/s (the global model comes down in ``8 B / (10^6 d)`` s).
        upload_mbps: Upload bandwidth in Mbit/s.
        availability: Probability of being online when a round samples (or an asynchronous server
            dispatches), each time drawn afresh.
        dropout: Probability of dropping out in the middle of a round's work (the client fails).
        phase: Each client's place in the day/night cycle, in [0, 1) (its time zone); empty: no cycle.
        day_s: The cycle's period in simulated seconds.
        online_fraction: The share of each period a client is online.
    """

    speed: tuple[float, ...]
    download_mbps: tuple[float, ...]
    upload_mbps: tuple[float, ...]
    availability: tuple[float, ...]
    dropout: tuple[float, ...]
    phase: tuple[float, ...] = ()
    day_s: float = 86400.0
    online_fraction: float = 1.0

    def __len__(self) -> int:
        return len(self.speed)

    @property
    def cycle(self) -> bool:
        """Whether the clients follow a day/night cycle."""
        return bool(self.phase) and self.online_fraction < 1


__all__ = ["Profiles"]
