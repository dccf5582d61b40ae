"""The learning task of a run: ``multiclass`` or ``multilabel``, and everything that depends on it.

A :class:`Task` is the one place that knows what a task means: its loss, its predictions and scores, the
per-sample correctness that the training accuracy counts, and its evaluation metrics. The client module,
the vectorised worker, the evaluation metrics, ``predict`` and the strategies that check the task all ask
it instead of comparing strings.

It is a ``str`` (``Task("multiclass") == "multiclass"``), so configs, checkpoints' hyperparameters and
``module.task == "multilabel"`` in user code keep working.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from fl_lightning.errors import ConfigError

#: The task names.
TASKS = ("multiclass", "multilabel")


class Task(str):
    """``multiclass`` (softmax cross-entropy, integer targets) or ``multilabel`` (sigmoid binary
    cross-entropy per label, 0/1 target vectors).

    Args:
        name: ``"multiclass"`` or ``"multilabel"``.
        field: The config field named in the error for another name.

    Raises:
        ConfigError: For another name, one line naming ``field``.
    """

    __slots__ = ()

    def __new__(cls, name: str, field: str = "task") -> Task:
        if isinstance(name, Task):
            return name
        if name not in TASKS:
            raise ConfigError(f"{field}={name!r} must be 'multiclass' or 'multilabel'")
        return super().__new__(cls, name)

    @property
    def multilabel(self) -> bool:
        return self == "multilabel"

    @property
    def metric(self) -> str:
        """The headline metric of the task: ``acc`` (multiclass) or ``o_f1`` (micro F1, multilabel)."""
        return "o_f1" if self.multilabel else "acc"

    def loss(self, outputs: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
        """The task loss of logits ``outputs`` ``[..., N, C]``.

        Multiclass: cross-entropy with integer targets ``[..., N]``. Multilabel: binary cross-entropy with
        logits averaged over the labels, targets ``[..., N, C]`` in {0, 1}. ``reduction="none"`` gives the
        per-sample losses ``[..., N]``; ``"mean"`` their mean (torch's own mean reduction, over the ``N * C``
        label terms for multilabel).
        """
        if reduction == "mean":
            if self.multilabel:
                return F.binary_cross_entropy_with_logits(outputs, target.to(outputs.dtype))
            return F.cross_entropy(outputs, target)
        if self.multilabel:
            return F.binary_cross_entropy_with_logits(
                outputs, target.to(outputs.dtype), reduction="none"
            ).mean(-1)
        flat = F.cross_entropy(outputs.reshape(-1, outputs.shape[-1]), target.reshape(-1), reduction="none")
        return flat.view(target.shape)

    def correct(self, outputs: Tensor, target: Tensor) -> Tensor:
        """Per-sample correctness ``[..., N]`` for the training accuracy: the arg-max class equals the target
        (multiclass, bool), or the fraction of labels predicted right at probability 0.5 (multilabel)."""
        outputs = outputs.detach()
        if self.multilabel:
            return ((outputs > 0) == target.bool()).float().mean(dim=-1)
        return outputs.argmax(dim=-1) == target

    def predictions(self, outputs: Tensor) -> Tensor:
        """The predicted class (multiclass) or the 0/1 labels with probability above 0.5 (multilabel)."""
        return (outputs > 0).long() if self.multilabel else outputs.argmax(dim=-1)

    def scores(self, outputs: Tensor) -> Tensor:
        """Class probabilities (softmax, multiclass) or label probabilities (sigmoid, multilabel)."""
        return outputs.float().sigmoid() if self.multilabel else outputs.float().softmax(dim=-1)

    def __reduce__(self) -> tuple:
        return (Task, (str(self),))


__all__ = ["TASKS", "Task"]
