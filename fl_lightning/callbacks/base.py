"""The federated callback hooks: a Lightning ``Callback`` with round and client events."""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer


class FederatedCallback(Callback):
    """A Lightning ``Callback`` with three extra, optional federated hooks.

    Every stock hook works as usual at round granularity (one training step = one round). The
    server module also calls these on every callback that defines them:

    - ``on_round_start(trainer, pl_module, round, clients)`` before local training,
    - ``on_client_end(trainer, pl_module, round, index, total, result)`` after each client
      (``result`` is the :class:`~fl_lightning.api.types.ClientResult`, or None if the client failed),
    - ``on_round_end(trainer, pl_module, round, record)`` after the server update, with the
      round's record (clients, bytes, time, train metrics).
    """

    def on_round_start(
        self, trainer: Trainer, pl_module: LightningModule, round: int, clients: list[int]
    ) -> None:
        """Before the sampled clients train."""

    def on_client_end(
        self, trainer: Trainer, pl_module: LightningModule, round: int, index: int, total: int, result: Any
    ) -> None:
        """After one client's local work."""

    def on_round_end(self, trainer: Trainer, pl_module: LightningModule, round: int, record: dict) -> None:
        """After the server update of a round."""
