"""What the engine tells a system model about the run it simulates (bound once, before round 1)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Setup:
    """The run a :class:`~fl_lightning.engine.system.base.SystemModel` times.

    Attributes:
        num_clients: Clients in the federation.
        seed: The run seed (``seed_everything``): every draw of the system model derives from it.
        batch_size: The local batch size (``data.batch_size``).
        full_steps: Each client's local steps of a full round (``model.local_epochs`` passes over its data,
            or ``model.local_steps``), indexed by client id.
        steps_per_epoch: Each client's steps of one pass over its data.
        local_epochs: ``model.local_epochs`` (None when ``model.local_steps`` sets the work instead).
        local_steps: ``model.local_steps`` (None: the work is in epochs).
        bytes_down: Bytes a client downloads per round (the global model's communicated entries).
        bytes_up: Bytes a client uploads per round.
    """

    num_clients: int
    seed: int
    batch_size: int
    full_steps: tuple[int, ...]
    steps_per_epoch: tuple[int, ...]
    local_epochs: int | None
    local_steps: int | None
    bytes_down: int
    bytes_up: int


__all__ = ["Setup"]
