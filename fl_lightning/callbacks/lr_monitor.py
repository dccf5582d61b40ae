"""The server learning rate, logged per round on the rounds-done x-axis."""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import LearningRateMonitor


class RoundLearningRateMonitor(LearningRateMonitor):
    """Lightning's ``LearningRateMonitor`` at round granularity, on the rounds-done x-axis.

    The stock callback logs the server optimizer's lr when a round starts, at step = rounds done
    *before* it (0..R-1), while every other tag is logged after its round (1..R). This one records
    the lr a round uses when the round starts and logs it when the round ends, at step = rounds done,
    so ``lr-SGD`` lines up with ``global/acc`` and ``round/client_lr``. Arguments are the stock ones;
    ``logging_interval`` is ignored (one epoch holds every round, so each round is logged).
    """

    def __init__(self, log_momentum: bool = False, log_weight_decay: bool = False) -> None:
        super().__init__(
            logging_interval="step", log_momentum=log_momentum, log_weight_decay=log_weight_decay
        )
        self._pending: dict[str, float] = {}

    def on_train_batch_start(self, trainer: Trainer, *args: Any, **kwargs: Any) -> None:
        self._pending = self._extract_stats(trainer, "any") if trainer.loggers else {}

    def on_train_epoch_start(self, trainer: Trainer, *args: Any, **kwargs: Any) -> None:
        """Nothing: the lr is logged per round."""

    def on_train_batch_end(self, trainer: Trainer, *args: Any, **kwargs: Any) -> None:
        if self._pending:
            for logger in trainer.loggers:
                logger.log_metrics(self._pending, step=trainer.global_step)
        self._pending = {}
