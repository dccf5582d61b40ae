"""The client: a LightningModule whose ``training_step`` computes the task loss of a batch."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar, Literal

import torch
from lightning.pytorch import LightningModule
from torch import Tensor, nn
from torchmetrics.aggregation import MeanMetric

from fl_lightning.api.task import Task
from fl_lightning.api.types import TrainState
from fl_lightning.defaults import lazy_default
from fl_lightning.errors import ConfigError, check_number
from fl_lightning.hparams import record_hyperparameters
from fl_lightning.models.cnn import SmallCNN

#: The default network, for the embedded digits data; a lazy instance so ``--print_config`` shows it.
_DEFAULT_NET = lazy_default(SmallCNN, in_channels=1, num_classes=10)
#: The per-client and per-round training metrics (task loss and accuracy over the local steps).
TRAIN_METRICS = ("train_loss", "train_acc")


class ClientModule(LightningModule):
    """A federated client: the network, its task loss, its local optimizer.

    One instance holds the global model on the server; the round loop trains a working copy of it
    for each sampled client in turn (weights loaded from the server's message), so hundreds of
    clients cost one model in memory.

    The local objective at every step is ``training_step(batch)["loss"] + strategy.local_loss(...)``:
    the local loop (:func:`fl_lightning.engine.local.train_client`) calls :meth:`training_step` and adds
    the strategy's term itself, so the module never sees the strategy. Subclass and override
    :meth:`task_loss`, :meth:`training_step` or :meth:`configure_optimizers` for other tasks;
    ``training_step`` returns the task loss, or a dict with ``"loss"`` and ``"outputs"`` (the network's
    outputs, which strategies such as MOON and FedCOG reuse instead of running another forward).

    Hooks that run on a client: ``forward``, ``training_step``, ``configure_optimizers`` (through the
    strategy's ``configure_client_optimizer``) and ``on_before_optimizer_step``. ``self.log(name, value)``
    in them records a scalar into the client's metrics of the round (mean over the local steps, logged
    as ``z_client/<id>/<name>``). No other Lightning hook runs per client.

    The training metrics of a client's local run are torchmetrics ``MeanMetric``s in
    ``fl_train_metrics``: ``train_loss`` (each step's task loss weighted by its batch size) and
    ``train_acc`` (the mean of the per-sample correctness). The loop pools the clients' metric STATES
    into the round's ``train/loss`` and ``train/acc`` (:func:`merge_train_states`), so these are means
    over every sample seen in the round, not means of per-client means.

    Args:
        net: The network (any ``nn.Module`` mapping a batch of inputs to logits). Default:
            ``SmallCNN(in_channels=1, num_classes=10)``, for the embedded digits data (also for None).
        task: ``"multiclass"`` (softmax cross-entropy, integer targets) or ``"multilabel"``
            (sigmoid binary cross-entropy, 0/1 target vectors).
        optimizer: Local optimizer: ``"sgd"``, ``"adam"`` or ``"adamw"``.
        lr: Local learning rate at round 0 (the loop multiplies it by ``lr_decay ** round``). The
            defaults (lr 0.1, momentum 0.9) are those of the zero-config run.
        momentum: SGD momentum (local; the buffer is reset every round as in the papers).
        weight_decay: Weight decay applied by the optimizer (``L2`` for SGD/Adam, decoupled for AdamW).
    """

    #: The methods that the vectorised clients' stacked worker re-implements on stacked parameters.
    STACKED_METHODS: ClassVar[tuple[str, ...]] = (
        "forward",
        "training_step",
        "task_loss",
        "configure_optimizers",
        "on_before_optimizer_step",
    )
    #: Whether the clients of this class may train stacked (``model.runtime.vectorize``): declared ``False``
    #: by a subclass that changes one of :attr:`STACKED_METHODS` (the stacked worker would not run its
    #: version).
    #: Safe fallback: a subclass that overrides one of them in its own body without declaring ``stackable``
    #: there gets ``False`` (it trains one client at a time, with the vectorised path's notice).
    stackable: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """The safe fallback of an undeclared ``stackable`` (see :attr:`stackable`)."""
        super().__init_subclass__(**kwargs)
        own = vars(cls)
        if "stackable" not in own and any(m in own for m in cls.STACKED_METHODS):
            cls.stackable = False

    def __init__(
        self,
        net: nn.Module | None = _DEFAULT_NET,
        task: Literal["multiclass", "multilabel"] = "multiclass",
        optimizer: Literal["sgd", "adam", "adamw"] = "sgd",
        lr: float = 0.1,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__()
        task = Task(task, "model.client.task")
        if optimizer not in ("sgd", "adam", "adamw"):
            raise ConfigError(f"model.client.optimizer={optimizer!r} must be one of sgd, adam, adamw")
        check_number(lr, "model.client.lr", low=0, low_open=True, hint="e.g. 0.1")
        check_number(
            momentum, "model.client.momentum", low=0, high=1, high_open=True, hint="0: plain SGD; e.g. 0.9"
        )
        check_number(weight_decay, "model.client.weight_decay", low=0, hint="0: none; e.g. 1e-4")
        # the CLI builds a fresh network from the config; from Python the default is one shared object
        self.net = SmallCNN(in_channels=1, num_classes=10) if net is None or net is _DEFAULT_NET else net
        self.task = task
        self.optimizer_name = optimizer
        self.lr = lr
        self.momentum = momentum
        self.weight_decay = weight_decay
        arguments = {"net": self.net, "task": task, "optimizer": optimizer, "lr": lr, "momentum": momentum}
        record_hyperparameters(self, {**arguments, "weight_decay": weight_decay})  # for checkpoints
        # nan_strategy="disable": no NaN check, so no host sync (torchmetrics 1.9 then ignores `weight`,
        # hence each loss is passed repeated once per sample of its batch instead of weighted); no
        # sync_on_compute: each process trains its own clients.
        self.fl_train_metrics = nn.ModuleDict(
            {k: MeanMetric(nan_strategy="disable", sync_on_compute=False) for k in TRAIN_METRICS}
        )
        self._train_batches: list[tuple[Tensor, Tensor]] = []  # (loss, per-sample correctness) per step
        self._train_paused = False  # set by the SAM step around its second (perturbed) pass
        self._local_logs: dict[str, tuple[Tensor, int]] | None = None  # name -> (sum, count) while training

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def task_loss(self, outputs: Tensor, target: Tensor) -> Tensor:
        """Mean cross-entropy (multiclass) or mean binary cross-entropy over labels (multilabel):
        :meth:`Task.loss <fl_lightning.api.task.Task.loss>`."""
        return self.task.loss(outputs, target)

    def training_step(self, batch: Any, batch_idx: int) -> dict[str, Tensor]:
        """The task loss of ``batch`` and the outputs it was computed from (the strategy's term is added
        by the local loop)."""
        x, y = batch
        outputs = self(x)
        loss = self.task_loss(outputs, y)
        self._track_train(outputs, y, loss)
        return {"loss": loss, "outputs": outputs}

    def configure_optimizers(self) -> torch.optim.Optimizer:
        params = [p for p in self.parameters() if p.requires_grad]
        if self.optimizer_name == "sgd":
            return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)
        if self.optimizer_name == "adam":
            return torch.optim.Adam(params, lr=self.lr, weight_decay=self.weight_decay)
        return torch.optim.AdamW(params, lr=self.lr, weight_decay=self.weight_decay)

    # ---------------------------------------------------------------- logging during local training
    @contextlib.contextmanager
    def local_training(self) -> Iterator[None]:
        """One client's local run: fresh train statistics, and ``self.log`` collected for the client."""
        self.reset_train_stats()
        self._local_logs = {}
        try:
            yield
        finally:
            self._local_logs = None

    def log(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        """Lightning's ``log``; during local training the value joins the client's metrics instead.

        Under the local loop there is no Trainer per client: each logged value is summed on the device
        (no host sync per step) and :meth:`train_stats` reports its mean over the calls of the round.
        Lightning's options (``prog_bar``, ``on_step``, ``sync_dist``...) do not apply there.
        """
        logs = self._local_logs
        if logs is None:
            super().log(name, value, *args, **kwargs)
            return
        if not isinstance(value, (Tensor, int, float)) or (isinstance(value, Tensor) and value.numel() != 1):
            raise ValueError(
                f"self.log({name!r}, ...) in a client's training_step takes a scalar tensor or number; "
                f"got {type(value).__name__}"
            )
        value = value.detach().float() if isinstance(value, Tensor) else float(value)
        total, count = logs.get(name, (0.0, 0))
        logs[name] = (total + value, count + 1)

    # ---------------------------------------------------------------- cheap training statistics
    def reset_train_stats(self) -> None:
        """Start a new local run's training metrics (called by the loop before local training)."""
        self._train_batches.clear()
        for metric in self.fl_train_metrics.values():
            metric.reset()
        if self._local_logs is not None:
            self._local_logs = {}

    def _track_train(self, outputs: Tensor, target: Tensor, loss: Tensor) -> None:
        """Record one step's task loss and per-sample correctness (no sync; metrics updated later)."""
        if self._train_paused:
            return
        self._train_batches.append((loss.detach(), self.task.correct(outputs, target)))

    def _update_train_metrics(self) -> None:
        """Update the metrics with the steps recorded since the last call: one ``update`` per metric.

        Batched, not per step, to keep the local step as cheap as the hand-written loop's (an
        ``update`` costs a few small kernels); the loss enters once per sample of its batch.
        """
        batches = self._train_batches
        if not batches:
            return
        losses = torch.cat([loss.expand(correct.shape[0]) for loss, correct in batches])
        self.fl_train_metrics["train_loss"].update(losses)
        self.fl_train_metrics["train_acc"].update(torch.cat([correct for _, correct in batches]))
        batches.clear()

    def train_state(self) -> TrainState:
        """The training metrics' states on the CPU (one device-to-host copy); {} if no step was tracked."""
        self._update_train_metrics()
        metrics = self.fl_train_metrics
        if metrics["train_loss"].update_count == 0:
            return {}
        names = [(k, attr) for k, m in metrics.items() for attr in m.metric_state]
        values = torch.stack([getattr(metrics[k], attr).detach() for k, attr in names]).cpu()
        state: TrainState = {k: {} for k in metrics}
        for (k, attr), value in zip(names, values, strict=True):
            state[k][attr] = value
        return state

    def train_stats(self) -> dict[str, float]:
        """Mean task loss and accuracy over the local steps since :meth:`reset_train_stats` (one sync), and
        the mean of every value logged with ``self.log`` since then."""
        self._update_train_metrics()
        metrics = self.fl_train_metrics
        out: dict[str, float] = {}
        if metrics["train_loss"].update_count:
            values = torch.stack([m.compute().float() for m in metrics.values()]).tolist()
            out = dict(zip(metrics.keys(), values, strict=True))
        for name, (total, count) in (self._local_logs or {}).items():
            out[name] = float(total) / count
        return out


def merge_train_states(states: Iterable[TrainState]) -> dict[str, float]:
    """Pool clients' training-metric states (torchmetrics ``merge_state``) and compute each metric once.

    For the loss this is ``sum_k loss_sum_k / sum_k seen_k`` over the clients' samples seen, the mean
    over all of them (likewise the accuracy); states are merged in the order given.
    """
    merged = {k: MeanMetric(nan_strategy="disable", sync_on_compute=False) for k in TRAIN_METRICS}
    for state in states:
        for k, metric in merged.items():
            if k in state:
                metric.merge_state(state[k])
                # torchmetrics 1.9's merge_state does not count (compute warns) and the count has no public
                # setter: a private attribute, torchmetrics capped at <1.10 in pyproject.toml
                metric._update_count += 1
    return {k: float(m.compute()) for k, m in merged.items() if m.update_count}
