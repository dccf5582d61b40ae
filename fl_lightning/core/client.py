"""The client: a LightningModule whose ``training_step`` computes the task loss of a batch."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Literal

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from torch import Tensor, nn

from fl_lightning.errors import ConfigError
from fl_lightning.models.cnn import SmallCNN


class ClientModule(LightningModule):
    """A federated client: the network, its task loss, its local optimizer.

    One instance holds the global model on the server; the round loop trains a working copy of it
    for each sampled client in turn (weights loaded from the server's message), so hundreds of
    clients cost one model in memory.

    The local objective at every step is ``training_step(batch)["loss"] + strategy.local_loss(...)``:
    the local loop (:func:`fl_lightning.core.local.train_client`) calls :meth:`training_step` and adds
    the strategy's term itself, so the module never sees the strategy. Subclass and override
    :meth:`task_loss`, :meth:`training_step` or :meth:`configure_optimizers` for other tasks;
    ``training_step`` returns the task loss, or a dict with ``"loss"`` and ``"outputs"`` (the network's
    outputs, which strategies such as MOON and FedCOG reuse instead of running another forward).

    Hooks that run on a client: ``forward``, ``training_step``, ``configure_optimizers`` (through the
    strategy's ``configure_client_optimizer``) and ``on_before_optimizer_step``. ``self.log(name, value)``
    in them records a scalar into the client's metrics of the round (mean over the local steps, logged
    as ``z_client/<id>/<name>``). No other Lightning hook runs per client.

    Args:
        net: The network (any ``nn.Module`` mapping a batch of inputs to logits); None gives
            ``SmallCNN(in_channels=1, num_classes=10)``, the default for the embedded digits data.
        task: ``"multiclass"`` (softmax cross-entropy, integer targets) or ``"multilabel"``
            (sigmoid binary cross-entropy, 0/1 target vectors).
        optimizer: Local optimizer: ``"sgd"``, ``"adam"`` or ``"adamw"``.
        lr: Local learning rate at round 0 (the loop multiplies it by ``lr_decay ** round``).
        momentum: SGD momentum (local; the buffer is reset every round as in the papers).
        weight_decay: Weight decay applied by the optimizer (``L2`` for SGD/Adam, decoupled for AdamW).
    """

    def __init__(
        self,
        net: nn.Module | None = None,
        task: Literal["multiclass", "multilabel"] = "multiclass",
        optimizer: Literal["sgd", "adam", "adamw"] = "sgd",
        lr: float = 0.05,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__()
        if task not in ("multiclass", "multilabel"):
            raise ConfigError(f"model.client.task={task!r} must be 'multiclass' or 'multilabel'")
        if optimizer not in ("sgd", "adam", "adamw"):
            raise ConfigError(f"model.client.optimizer={optimizer!r} must be one of sgd, adam, adamw")
        if lr <= 0:
            raise ConfigError(f"model.client.lr={lr} must be > 0")
        self.net = SmallCNN(in_channels=1, num_classes=10) if net is None else net
        self.task = task
        self.optimizer_name = optimizer
        self.lr = lr
        self.momentum = momentum
        self.weight_decay = weight_decay
        self._train_sums: list | None = None  # [sum of loss*n, correct, n]
        self._local_logs: dict[str, tuple[Tensor, int]] | None = None  # name -> (sum, count) while training

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def task_loss(self, outputs: Tensor, target: Tensor) -> Tensor:
        """Mean cross-entropy (multiclass) or mean binary cross-entropy over labels (multilabel)."""
        if self.task == "multiclass":
            return F.cross_entropy(outputs, target)
        return F.binary_cross_entropy_with_logits(outputs, target.to(outputs.dtype))

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
        """Start a new local run's running sums (called by the loop before local training)."""
        self._train_sums = None
        if self._local_logs is not None:
            self._local_logs = {}

    def _track_train(self, outputs: Tensor, target: Tensor, loss: Tensor) -> None:
        n = target.shape[0]
        outputs = outputs.detach()
        if self.task == "multiclass":
            correct = (outputs.argmax(dim=1) == target).sum()
        else:  # label-wise accuracy at threshold 0.5
            correct = ((outputs > 0) == target.bool()).float().mean(dim=1).sum()
        weighted = loss.detach() * n
        sums = self._train_sums
        if sums is not None:
            weighted, correct, n = sums[0] + weighted, sums[1] + correct, sums[2] + n
        self._train_sums = [weighted, correct, n]

    def train_stats(self) -> dict[str, float]:
        """Mean task loss and accuracy over the local steps since :meth:`reset_train_stats`, and the
        mean of every value logged with ``self.log`` since then."""
        out = {}
        if self._train_sums is not None:
            loss_sum, correct, n = self._train_sums
            out = {"train_loss": float(loss_sum) / n, "train_acc": float(correct) / n}
        for name, (total, count) in (self._local_logs or {}).items():
            out[name] = float(total) / count
        return out
