"""A round progress bar: one tick per round, the round's client progress in its postfix."""

from __future__ import annotations

from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import TQDMProgressBar

from fl_lightning.callbacks.base import FederatedCallback


class FederatedProgressBar(TQDMProgressBar, FederatedCallback):
    """Lightning's TQDM bar with one tick per round and the round's client progress in its postfix."""

    def __init__(self, refresh_rate: int = 1, leave: bool = False) -> None:
        super().__init__(refresh_rate=refresh_rate, leave=leave)
        self._clients = ""

    def on_round_start(
        self, trainer: Trainer, pl_module: LightningModule, round: int, clients: list[int]
    ) -> None:
        self._client_progress(trainer, pl_module, 0, len(clients))

    def on_client_end(
        self, trainer: Trainer, pl_module: LightningModule, round: int, index: int, total: int, result: Any
    ) -> None:
        self._client_progress(trainer, pl_module, index + 1, total)

    def get_metrics(self, trainer: Trainer, pl_module: LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        return {"clients": self._clients, **metrics} if self._clients else metrics

    def _client_progress(self, trainer: Trainer, pl_module: LightningModule, done: int, total: int) -> None:
        self._clients = f"{done}/{total}"
        bar = self._train_progress_bar
        if bar is not None and not bar.disable:
            bar.set_postfix(self.get_metrics(trainer, pl_module), refresh=True)
