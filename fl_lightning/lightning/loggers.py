"""Loggers of the Lightning adapter."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.loggers import TensorBoardLogger


class RoundStepLogger(TensorBoardLogger):
    """A TensorBoard logger that writes every scalar at the step :attr:`round_step` once it is set.

    ``validate``/``test``/``predict`` of a checkpoint log into ``<run>/<subcommand>/`` (see the CLI):
    their scalars belong at the checkpoint's rounds, the x-axis of the run's other scalars, while
    Lightning passes its own step counter, which outside ``fit`` is 0. The module sets ``round_step``
    when it knows the checkpoint's rounds.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.round_step: int | None = None

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        super().log_metrics(metrics, step if self.round_step is None else self.round_step)
