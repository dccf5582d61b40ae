"""Evaluation metrics for global and per-client evaluation in federated learning.

Every metric here is a torchmetrics metric whose STATE (counts, sums, stored scores) can be merged:
per-client metrics are combined into global ones by adding their states with :meth:`TaskMetrics.merge`,
never by averaging per-client scalar results. For accuracy this means the global value is
``sum_k correct_k / sum_k n_k`` and not ``mean_k (correct_k / n_k)``, which would over-weight small
clients.

:class:`TaskMetrics` is the single entry point: it computes the task loss from the logits itself and
updates all metrics of the task with one call per evaluation batch.

Metric definitions (``N`` samples, ``L`` labels, ``C`` classes):

Multiclass (``logits``: ``(N, C)``, ``target``: ``(N,)`` class indices):
    * ``acc``: micro accuracy, the fraction of samples whose arg-max class equals the target.
    * ``loss``: mean over samples of the cross-entropy ``-log softmax(logits)[target]``.

Multilabel (``logits``: ``(N, L)``, ``target``: ``(N, L)`` in {0, 1}); a label is predicted positive iff
``sigmoid(logit) > 0.5`` (strictly, as in torchmetrics), the names follow the FedCOG / FLAIR papers:
    * ``c_precision``, ``c_recall``, ``c_f1``: per-label precision ``TP/(TP+FP)``, recall ``TP/(TP+FN)``
      and F1 ``2TP/(2TP+FP+FN)``, then the unweighted mean over all ``L`` labels (macro, "C" = per class).
      A 0/0 ratio counts as 0 (scikit-learn's ``zero_division=0``); labels are never dropped from the
      mean, so a label with no positives and no positive predictions contributes 0 to all three.
    * ``o_precision``, ``o_recall``, ``o_f1``: the same ratios with TP/FP/FN summed over all ``N * L``
      label decisions (micro, "O" = overall); 0/0 counts as 0.
    * ``map_macro``: mean over labels of the exact (non-interpolated) average precision
      ``AP = sum_n (R_n - R_{n-1}) P_n`` of the label's sigmoid scores, taken over the labels that have at
      least one positive target only. AP is undefined for a label without positives; scikit-learn's
      ``average_precision_score(average="macro")`` and torchmetrics' ``average="macro"`` count such a
      label as AP 0 (with a warning), which pulls the mean down for every label a client lacks. Here
      those labels are left out instead; ``map_macro`` is NaN when no label has a positive.
    * ``map_micro``: the exact AP of all ``N * L`` scores pooled as one binary problem
      (as ``average_precision_score(average="micro")``); 0 when there are no positives at all.
    * ``loss``: mean over samples of the per-sample binary cross-entropy averaged over labels, i.e. the
      mean of ``binary_cross_entropy_with_logits`` over all ``N * L`` entries.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor, nn
from torchmetrics import Metric, MetricCollection
from torchmetrics.aggregation import MeanMetric
from torchmetrics.classification import (
    MulticlassAccuracy,
    MultilabelAveragePrecision,
    MultilabelF1Score,
    MultilabelPrecision,
    MultilabelRecall,
)

from fl_lightning.api.task import TASKS, Task

# Result keys per task, in the order :meth:`TaskMetrics.compute` returns them (MetricCollection sorts
# its members by name, so the order is fixed here).
KEYS: dict[str, tuple[str, ...]] = {
    "multiclass": ("acc", "loss"),
    "multilabel": (
        "c_precision",
        "c_recall",
        "c_f1",
        "o_precision",
        "o_recall",
        "o_f1",
        "map_macro",
        "map_micro",
        "loss",
    ),
}

#: Never all-gather inside ``compute()``: across processes, states are combined explicitly with
#: :meth:`TaskMetrics.merge` (the engine's executors gather them), so a process that evaluated nothing
#: cannot hang.
_LOCAL: dict[str, Any] = {"sync_on_compute": False}

# torchmetrics warns on every compute for each label without positives (its AP is undefined there);
# ``map_macro`` leaves those labels out on purpose, so the warning is noise.
_NO_POSITIVES_WARNING = r"No positive samples found in target"


def classification_metrics(num_classes: int) -> MetricCollection:
    """Metrics of a multiclass classifier: ``acc`` (micro accuracy) and ``loss`` (mean cross-entropy).

    ``acc`` is updated with ``(logits, target)``; ``loss`` is a :class:`~torchmetrics.MeanMetric` updated
    with per-sample losses (or a mean and its weight). Because the two take different inputs, update
    them through :class:`TaskMetrics` rather than through ``MetricCollection.update``.

    Args:
        num_classes: Number of classes ``C``.

    Returns:
        A ``MetricCollection`` with keys ``"acc"`` and ``"loss"``.
    """
    return MetricCollection(
        {
            "acc": MulticlassAccuracy(num_classes=num_classes, average="micro", **_LOCAL),
            "loss": MeanMetric(**_LOCAL),
        }
    )


def multilabel_metrics(num_labels: int) -> MetricCollection:
    """Metrics of a multilabel classifier (definitions in the module docstring).

    ``map_macro`` holds the per-label AP (``average=None``); :class:`TaskMetrics` averages it over the
    labels that have positives. ``loss`` is a :class:`~torchmetrics.MeanMetric` of per-sample losses.

    Args:
        num_labels: Number of labels ``L``.

    Returns:
        A ``MetricCollection`` with keys ``c_precision``, ``c_recall``, ``c_f1``, ``o_precision``,
        ``o_recall``, ``o_f1``, ``map_macro``, ``map_micro`` and ``loss``.
    """
    metrics: dict[str, Metric] = {}
    for prefix, average in (("c", "macro"), ("o", "micro")):
        kwargs: dict[str, Any] = {"num_labels": num_labels, "average": average, "threshold": 0.5, **_LOCAL}
        metrics[f"{prefix}_precision"] = MultilabelPrecision(**kwargs, zero_division=0)
        metrics[f"{prefix}_recall"] = MultilabelRecall(**kwargs, zero_division=0)
        metrics[f"{prefix}_f1"] = MultilabelF1Score(**kwargs, zero_division=0)
    # Both AP metrics keep the same (preds, target) state, so the collection's compute groups store the
    # scores once; likewise the six P/R/F1 metrics share one set of per-label TP/FP/TN/FN counts.
    ap = {"num_labels": num_labels, "thresholds": None, **_LOCAL}
    metrics["map_macro"] = MultilabelAveragePrecision(average=None, **ap)
    metrics["map_micro"] = MultilabelAveragePrecision(average="micro", **ap)
    metrics["loss"] = MeanMetric(**_LOCAL)
    return MetricCollection(metrics)


class TaskMetrics(nn.Module):
    """All evaluation metrics of one task behind a single ``update(logits, target)``.

    Internally the task's collection is split into ``scores`` (a ``MetricCollection`` of the metrics
    updated with predictions and targets, so its compute groups share state) and ``loss`` (the
    ``MeanMetric`` of per-sample losses). The metric states belong to this module, so ``.to(device)``
    moves them; ``update`` also moves them to the device of ``logits``, so that metrics are computed
    where the model runs.

    Args:
        task: ``"multiclass"`` or ``"multilabel"``.
        num_classes: Number of classes (multiclass) or labels (multilabel).

    Raises:
        ConfigError: If ``task`` is not one of :data:`TASKS`.
    """

    def __init__(self, task: str, num_classes: int) -> None:
        super().__init__()
        self.task = Task(task)
        self.num_classes = int(num_classes)
        factory = multilabel_metrics if self.task.multilabel else classification_metrics
        members = dict(factory(self.num_classes).items(keep_base=True, copy_state=False))
        self.loss: Metric = members.pop("loss")
        self.scores = MetricCollection(members)
        self._update_count = 0

    @classmethod
    def for_task(cls, task: str, num_classes: int) -> TaskMetrics:
        """Metrics of ``task`` (``"multiclass"`` or ``"multilabel"``) with ``num_classes`` classes/labels.

        Raises:
            ConfigError: If ``task`` is not one of :data:`TASKS`.
        """
        return cls(task, num_classes)

    @property
    def device(self) -> torch.device:
        """The device the metric states live on."""
        return self.loss.device

    @property
    def update_count(self) -> int:
        """Number of non-empty batches seen, including those of merged instances."""
        return self._update_count

    @property
    def updated(self) -> bool:
        """Whether any batch has been seen (directly or through :meth:`merge`)."""
        return self._update_count > 0

    def _members(self) -> dict[str, Metric]:
        # Never index the collection with ``[]``: MetricCollection.__getitem__ deep-copies the shared
        # compute-group states into every member, which duplicates the stored AP scores.
        return {**dict(self.scores.items(keep_base=True, copy_state=False)), "loss": self.loss}

    @torch.no_grad()
    def update(self, logits: Tensor, target: Tensor) -> None:
        """Compute the task loss of a batch and update every metric with it (empty batches are skipped).

        Args:
            logits: ``(N, C)`` unnormalised scores.
            target: ``(N,)`` class indices (multiclass) or ``(N, C)`` 0/1 labels (multilabel).
        """
        if logits.shape[0] == 0:
            return
        if logits.device != self.device:
            self.to(logits.device)
        logits = logits.detach().float()
        target = target.detach().to(logits.device)
        if not self.task.multilabel:
            target = target.long()
        self.loss.update(self.task.loss(logits, target, reduction="none"))
        # Multilabel: probabilities, not logits: torchmetrics only applies a sigmoid when some value lies
        # outside [0, 1], so a batch of logits that all fall in [0, 1] would be thresholded raw.
        self.scores.update(self.task.scores(logits) if self.task.multilabel else logits, target.long())
        self._update_count += 1

    def compute(self) -> dict[str, float]:
        """The metric values as python floats, keyed as in the module docstring; ``{}`` if never updated."""
        if not self.updated:
            return {}
        members = self._members()
        out: dict[str, float] = {}
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_NO_POSITIVES_WARNING)
            for name in KEYS[str(self.task)]:
                value = members[name].compute()
                if name == "map_macro":
                    recall = members["c_recall"]
                    has_pos = (recall.tp + recall.fn) > 0  # labels with at least one positive target
                    value = value[has_pos].mean() if bool(has_pos.any()) else torch.tensor(float("nan"))
                out[name] = float(value)
        return out

    def reset(self) -> None:
        """Clear all metric states."""
        self.scores.reset()
        self.loss.reset()
        self._update_count = 0

    def merge(self, other: TaskMetrics) -> None:
        """Add the metric STATE of ``other`` into this instance (``other`` is left unchanged).

        Counts and sums are added and stored scores concatenated, so afterwards :meth:`compute` equals
        that of one instance updated with the batches of both. ``other`` may live on another device.

        Raises:
            ValueError: If ``other`` has a different task or number of classes.
        """
        if (other.task, other.num_classes) != (self.task, self.num_classes):
            raise ValueError(
                f"cannot merge {other.task}/{other.num_classes} metrics into {self.task}/{self.num_classes}"
            )
        if not other.updated:
            return
        device = self.device
        incoming_members = other._members()
        for name, metric in self._members().items():
            incoming = incoming_members[name]
            state = {
                key: [t.to(device) for t in val] if isinstance(val, list) else val.to(device)
                for key, val in incoming.metric_state.items()
            }
            # merge_state assigns new objects (never in place), so state shared by reference within a
            # compute group stays consistent; the next update re-links the group members.
            metric.merge_state(state)
            # torchmetrics 1.9's merge_state neither adds the update count (compute would then warn
            # "called before the update method") nor drops the value cached by an earlier compute(),
            # and has no public way to do either: private attributes, torchmetrics capped at <1.10.
            metric._update_count += incoming._update_count
            metric._computed = None
        self._update_count += other._update_count

    def state_tensors(self) -> dict[str, Tensor]:
        """The metric states as flat named CPU tensors (``<metric>/<state>``, list states concatenated,
        ``<metric>/updates`` and ``updates`` counts), e.g. to send them in a Flower message;
        :meth:`from_state_tensors` rebuilds the metrics."""
        out: dict[str, Tensor] = {"updates": torch.tensor(self._update_count)}
        for name, metric in self._members().items():
            for key, val in metric.metric_state.items():
                if isinstance(val, list):
                    if not val:
                        continue
                    val = torch.cat([v.reshape(-1, *v.shape[1:]) if v.dim() else v.reshape(1) for v in val])
                out[f"{name}/{key}"] = val.detach().cpu()
            out[f"{name}/updates"] = torch.tensor(metric.update_count)
        return out

    @classmethod
    def from_state_tensors(cls, task: str, num_classes: int, tensors: dict[str, Tensor]) -> TaskMetrics:
        """Metrics holding the states :meth:`state_tensors` wrote (e.g. a client's, on the server)."""
        out = cls(task, num_classes)
        if not int(tensors.get("updates", 0)):
            return out
        for name, metric in out._members().items():
            state: dict[str, Any] = {}
            for key, default in metric.metric_state.items():
                value = tensors.get(f"{name}/{key}")
                if isinstance(default, list):
                    state[key] = [] if value is None else [value]
                elif value is not None:
                    state[key] = value
            metric.merge_state(state)  # into fresh (zero / empty) states: the states themselves
            # no public setter of the update count (see merge): torchmetrics capped at <1.10
            metric._update_count = int(tensors.get(f"{name}/updates", 0))
        out._update_count = int(tensors["updates"])
        return out

    def clone(self) -> TaskMetrics:
        """A fresh, reset instance with the same task and size, on the same device."""
        return TaskMetrics(self.task, self.num_classes).to(self.device)

    def extra_repr(self) -> str:
        """Task and size, shown in ``repr``."""
        return f"task={self.task!r}, num_classes={self.num_classes}"


__all__ = ["KEYS", "TASKS", "TaskMetrics", "classification_metrics", "multilabel_metrics"]
