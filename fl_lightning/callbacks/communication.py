"""Communication to a target: how many rounds and bytes a run needs until a metric first reaches a value.

The filter-decomposition paper compares methods by the parameters communicated until a target accuracy
(Chen & Qiu, ICML 2025, Sec. 6.4 and Fig. 2(d): 52% on CIFAR-100 (100, 20)). The byte counts come from
the server module's per-round history, i.e. from the tensors actually sent in every round.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_only

from fl_lightning.callbacks.base import FederatedCallback
from fl_lightning.errors import ConfigError

log = logging.getLogger("fl_lightning")


class CommunicationToTarget(FederatedCallback):
    """Records the first round at which ``monitor >= target`` and the bytes communicated until then.

    After every evaluation the monitored metric (``global/acc``, or ``personal/acc`` for personalised
    models) is compared with the target; the first time it is reached, the round count and the
    cumulative bytes down, up and in total are logged as ``target/round``, ``target/bytes_down``,
    ``target/bytes_up``, ``target/bytes_total`` and, at the end of fit, written to
    ``<log_dir>/target.json`` (with ``"reached": false`` if the run never got there). The record is part
    of the callback's checkpoint state, so a resumed run keeps it.

    Args:
        monitor: The metric key, e.g. ``global/acc``.
        target: The value to reach (accuracies are fractions: 0.52 for 52%).
    """

    def __init__(self, monitor: str = "global/acc", target: float = 0.5) -> None:
        if not monitor:
            raise ConfigError("trainer.callbacks: CommunicationToTarget.monitor is empty; e.g. global/acc")
        self.monitor = monitor
        self.target = target
        self.result: dict[str, Any] | None = None

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.result is not None or trainer.sanity_checking:
            return
        value = trainer.callback_metrics.get(self.monitor)
        if value is None or float(value) < self.target:
            return
        history = getattr(pl_module, "history", [])
        down = sum(r.bytes_down for r in history)
        up = sum(r.bytes_up for r in history)
        self.result = {
            "round": len(history),
            "value": float(value),
            "bytes_down": down,
            "bytes_up": up,
            "bytes_total": down + up,
        }
        for logger in trainer.loggers:
            logger.log_metrics(
                {f"target/{k}": float(v) for k, v in self.result.items()}, step=trainer.global_step
            )

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._write(trainer.log_dir)  # log_dir is a collective under DDP: read it on every process

    @rank_zero_only
    def _write(self, log_dir: str | None) -> None:
        record = {"monitor": self.monitor, "target": self.target, "reached": self.result is not None}
        record.update(self.result or {})
        if self.result is None:
            log.info("%s never reached %s", self.monitor, self.target)
        else:
            log.info(
                "%s reached %s after %d rounds and %d bytes",
                self.monitor,
                self.target,
                self.result["round"],
                self.result["bytes_total"],
            )
        if log_dir:
            path = Path(log_dir) / "target.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(record, indent=2))

    @property
    def state_key(self) -> str:
        return self._generate_state_key(monitor=self.monitor, target=self.target)

    def state_dict(self) -> dict[str, Any]:
        return {"result": self.result}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.result = state_dict.get("result")
