"""A round progress bar: one tick per round, the round's client progress in its postfix.

On a terminal it is Lightning's TQDM bar counting rounds (``round: 40%|████ | 16/40``); when the output
is not a terminal (a log file, a pipe, a batch job) it draws no bar and logs one line per tenth of
the run instead (every round at the ``DEBUG`` level of the ``fl_lightning`` logger:
``python -m fl_lightning fit --verbose``).
"""

from __future__ import annotations

import logging
import math
import sys
import time
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

from fl_lightning.callbacks.base import FederatedCallback

log = logging.getLogger("fl_lightning")

#: Without a terminal, a round's line is logged at INFO every ``ceil(rounds / LINES)`` rounds.
LINES = 10


def interactive(stream: Any) -> bool:
    """Whether ``stream`` shows a redrawn bar: a terminal, or a Jupyter kernel's output."""
    try:
        if stream.isatty():
            return True
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
    return "ipykernel" in sys.modules


class FederatedProgressBar(TQDMProgressBar, FederatedCallback):
    """Rounds, not epochs: a TQDM bar on a terminal, a line per tenth of the run otherwise.

    On a terminal: one tick per round out of ``trainer.max_steps`` (a resumed run starts at its rounds
    done), the clients done in the current round and the latest ``train/*`` and ``global/*`` values
    in the postfix; the per-round evaluation of the global model draws no bar of its own.

    Elsewhere (``sys.stdout`` is not a terminal): no bar; after every round a line such as
    ``round 8/40: train/loss 0.41, global/acc 0.9361 (4.2 s)`` is logged to the ``fl_lightning``
    logger, at ``INFO`` for every ``ceil(max_steps / 10)``-th round and the last one, at ``DEBUG`` for
    the others (``--verbose`` shows them). The CLI prints that logger; from Python, configure
    ``logging`` (e.g. ``logging.basicConfig(level=logging.INFO)``) to see the lines.

    Args:
        refresh_rate: As Lightning's ``TQDMProgressBar``.
        leave: As Lightning's ``TQDMProgressBar``.
    """

    def __init__(self, refresh_rate: int = 1, leave: bool = False) -> None:
        super().__init__(refresh_rate=refresh_rate, leave=leave)
        self._clients = ""
        self._lines = False
        self._pending: int | None = None
        self._ended: tuple[str, float] | None = None  # the pending round's line values as it ended
        self._started = 0.0
        self._unit = "round"  # what a step is: "server step" for an asynchronous strategy

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self._lines = not interactive(sys.stdout)
        if self._lines:
            self.disable()

    # ------------------------------------------------------------------ the bar on a terminal
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._unit = getattr(pl_module, "round_unit", "round")  # before the bar is made
        super().on_train_start(trainer, pl_module)
        self._started = time.perf_counter()
        self._pending = None

    @property
    def train_description(self) -> str:
        return self._unit

    def on_train_epoch_start(self, trainer: Trainer, *_: Any) -> None:
        """The bar counts rounds done out of ``trainer.max_steps`` (Lightning's: batches of "Epoch N")."""
        if self._leave:
            self.train_progress_bar = self.init_train_tqdm()
        bar = self.train_progress_bar
        bar.reset(total=trainer.max_steps if trainer.max_steps > 0 else None)
        bar.initial = bar.n = trainer.global_step
        bar.refresh()

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._log_round(trainer, pl_module)  # a previous round that ran no validation
        self._pending = trainer.global_step
        if self._lines and trainer.is_global_zero:  # its line as it ended, should no validation follow
            self._ended = self._line_values(trainer, pl_module)
        bar = self._train_progress_bar
        if bar is not None:  # counted even when not drawn (no terminal): the bar's state is the progress
            bar.n = trainer.global_step
            refresh = self._should_update(trainer.global_step, bar.total)
            bar.set_postfix(self.get_metrics(trainer, pl_module), refresh=refresh)

    def init_validation_tqdm(self) -> Tqdm:
        if self.trainer.state.fn == "fit":  # the global model after every round: the postfix shows it
            return Tqdm(disable=True)
        return super().init_validation_tqdm()

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self._log_round(trainer, pl_module, now=True)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._log_round(trainer, pl_module)
        super().on_train_end(trainer, pl_module)

    def get_metrics(self, trainer: Trainer, pl_module: LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)  # the run folder's number: not progress
        return {"clients": self._clients, **metrics} if self._clients else metrics

    # ------------------------------------------------------------------ federated hooks
    def on_round_start(
        self, trainer: Trainer, pl_module: LightningModule, round: int, clients: list[int]
    ) -> None:
        self._client_progress(trainer, pl_module, 0, len(clients))

    def on_client_end(
        self, trainer: Trainer, pl_module: LightningModule, round: int, index: int, total: int, result: Any
    ) -> None:
        self._client_progress(trainer, pl_module, index + 1, total)

    def _client_progress(self, trainer: Trainer, pl_module: LightningModule, done: int, total: int) -> None:
        self._clients = f"{done}/{total}"
        bar = self._train_progress_bar
        if bar is not None and not bar.disable:
            bar.set_postfix(self.get_metrics(trainer, pl_module), refresh=True)

    # ------------------------------------------------------------------ lines without a terminal
    def _line_values(self, trainer: Trainer, pl_module: LightningModule) -> tuple[str, float]:
        """The metrics of a round's line, and the seconds since the start of training, as of now."""
        metrics = {k: v for k, v in self.get_metrics(trainer, pl_module).items() if k != "clients"}
        values = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items())
        return values, time.perf_counter() - self._started

    def _log_round(self, trainer: Trainer, pl_module: LightningModule, now: bool = False) -> None:
        """The line of the round that ended last, once (INFO every tenth of the run, else DEBUG): as of
        ``now`` (after its validation), else as it ended (a round without validation is said at the next
        round's end or at the end of training, with its own metrics and time)."""
        done, self._pending = self._pending, None
        ended, self._ended = self._ended, None
        if done is None or not self._lines or not trainer.is_global_zero:
            return
        total = trainer.max_steps if trainer.max_steps > 0 else None
        every = math.ceil(total / LINES) if total else 1
        level = logging.INFO if done % every == 0 or done == total else logging.DEBUG
        if not log.isEnabledFor(level):
            return
        values, elapsed = self._line_values(trainer, pl_module) if now or ended is None else ended
        where = f"{done}/{total}" if total else str(done)
        log.log(level, "%s %s: %s (%.1f s)", self._unit, where, values or "done", elapsed)
