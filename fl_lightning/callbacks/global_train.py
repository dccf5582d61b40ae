"""The global model on the federation's training data: the "training loss" FedProx and FedAvg papers plot."""

from __future__ import annotations

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.trainer.states import TrainerFn

from fl_lightning.callbacks.base import FederatedCallback
from fl_lightning.engine.local import evaluate
from fl_lightning.errors import ConfigError


class GlobalTrainMetrics(FederatedCallback):
    """Evaluates the global model on every client's local training data after a round's validation.

    FedProx's training loss (Li et al., MLSys 2020, Sec. 5 and Fig. 1: ``f(w^t) = sum_k p_k F_k(w^t)`` on
    the devices' training data, ``p_k`` by sample count; its code's ``train_error_and_loss``) is the global
    model's loss over the union of the clients' training samples, weighted by sample, which is what this
    merges by metric state. ``train/loss`` is a different number: the clients' loss during their local steps
    of the round. Logged as ``global_train/<metric>`` (``loss``, ``acc``, ...) at step = rounds done, and kept
    in the round's record (so ``summary.json`` is unchanged and a sweep reads it as a scalar column).

    Args:
        every_n_rounds: Evaluate after every this many rounds (and never during the sanity check).
        batch_size: Samples per forward pass of the evaluation.
    """

    def __init__(self, every_n_rounds: int = 1, batch_size: int = 1024) -> None:
        for name, value in (("every_n_rounds", every_n_rounds), ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(
                    f"trainer.callbacks: GlobalTrainMetrics.{name}={value!r} must be an integer >= 1"
                )
        self.every_n_rounds = every_n_rounds
        self.batch_size = batch_size

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        rounds = trainer.global_step
        history = getattr(pl_module, "history", None)
        if not history or rounds % self.every_n_rounds:
            return
        values = {f"global_train/{k}": v for k, v in self.compute(trainer, pl_module).items()}
        history[-1].metrics.update(values)
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(values, step=rounds)

    def compute(self, trainer: Trainer, pl_module: LightningModule) -> dict[str, float]:
        """The global model's metrics on every client's training samples, merged by state."""
        engine = pl_module.engine
        metrics = engine.metrics()
        model = pl_module.client
        for data in engine.clients:
            idx = data.train_idx.to(data.x.device)
            batches = (data.take(idx[i : i + self.batch_size]) for i in range(0, len(idx), self.batch_size))
            evaluate(model, batches, metrics, trainer.precision_plugin)
        return {k: float(v) for k, v in metrics.compute().items()}


__all__ = ["GlobalTrainMetrics"]
