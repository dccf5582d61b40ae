"""Tests of ``fl_lightning.api.metrics`` against scikit-learn on small hand-made examples."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from sklearn.metrics import (
    accuracy_score,
    average_precision_score,
    f1_score,
    log_loss,
    precision_score,
    recall_score,
)

from fl_lightning.api.metrics import TaskMetrics, classification_metrics
from fl_lightning.errors import ConfigError

TOL = 1e-5

# ---------------------------------------------------------------- multiclass: 7 samples, 3 classes
MC_LOGITS = torch.tensor(
    [
        [2.0, 0.1, -1.0],  # pred 0, target 0: correct
        [0.3, 1.2, 0.0],  # pred 1, target 1: correct
        [1.5, 0.2, 0.9],  # pred 0, target 2: wrong
        [-0.5, 0.4, 2.2],  # pred 2, target 2: correct
        [0.9, 1.1, -0.2],  # pred 1, target 0: wrong
        [0.2, -0.3, 0.6],  # pred 2, target 1: wrong
        [1.0, 0.7, 0.8],  # pred 0, target 2: wrong
    ]
)
MC_TARGET = torch.tensor([0, 1, 2, 2, 0, 1, 2])
# Three clients of sizes 1, 2, 4 with accuracies 1, 1/2, 1/4: the plain mean 7/12 differs from 3/7.
MC_CLIENTS = [slice(0, 1), slice(1, 3), slice(3, 7)]

# -------------------------------------------------------------- multilabel: 6 samples, 5 labels
# label 0, 1: ordinary; label 2: no positive targets, one false positive (row 3);
# label 3: positives (rows 0, 2, 5) but no positive prediction (all logits < 0);
# label 4: neither positive targets nor positive predictions.
ML_TARGET = torch.tensor(
    [
        [1, 0, 0, 1, 0],
        [1, 1, 0, 0, 0],
        [0, 1, 0, 1, 0],
        [1, 0, 0, 0, 0],
        [0, 1, 0, 0, 0],
        [0, 0, 0, 1, 0],
    ]
)
ML_LOGITS = torch.tensor(
    [
        [2.2, -1.4, -2.0, -0.3, -1.0],
        [0.4, -0.2, -1.5, -1.1, -2.0],
        [-0.8, 1.7, -0.9, -0.6, -1.5],
        [-0.1, -2.3, 0.5, -0.9, -0.7],
        [-1.1, 0.6, -1.2, -1.6, -0.4],
        [-1.3, 0.9, -0.6, -0.2, -2.5],
    ]
)
ML_CLIENTS = [slice(0, 1), slice(1, 3), slice(3, 6)]
ML_KEYS = [
    "c_precision",
    "c_recall",
    "c_f1",
    "o_precision",
    "o_recall",
    "o_f1",
    "map_macro",
    "map_micro",
    "loss",
]


def _sk_multilabel(logits: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
    """The multilabel metrics as defined in ``fl_lightning.api.metrics``, computed with scikit-learn."""
    y = target.numpy()
    prob = torch.sigmoid(logits).double().numpy()
    pred = (prob > 0.5).astype(int)
    has_pos = y.sum(axis=0) > 0
    out = {}
    for prefix, average in (("c", "macro"), ("o", "micro")):
        out[f"{prefix}_precision"] = precision_score(y, pred, average=average, zero_division=0)
        out[f"{prefix}_recall"] = recall_score(y, pred, average=average, zero_division=0)
        out[f"{prefix}_f1"] = f1_score(y, pred, average=average, zero_division=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "No positive class found in y_true" for all-negative labels
        out["map_macro"] = average_precision_score(y[:, has_pos], prob[:, has_pos], average="macro")
        out["map_micro"] = average_precision_score(y, prob, average="micro")
    out["loss"] = log_loss(y.ravel(), prob.ravel(), labels=[0, 1])
    return out


def _updated(task: str, num_classes: int, logits: torch.Tensor, target: torch.Tensor) -> TaskMetrics:
    metrics = TaskMetrics.for_task(task, num_classes)
    metrics.update(logits, target)
    return metrics


def _merged_clients(task: str, num_classes: int, logits, target, clients) -> tuple[TaskMetrics, list]:
    per_client = [_updated(task, num_classes, logits[s], target[s]) for s in clients]
    merged = per_client[0].clone()
    for client in per_client:
        merged.merge(client)
    return merged, per_client


def _assert_close(actual: dict[str, float], expected: dict[str, float]) -> None:
    assert list(actual) == list(expected)
    for key, value in expected.items():
        assert actual[key] == pytest.approx(value, abs=TOL), key


# ----------------------------------------------------------------------------------- multiclass


def test_classification_metrics_keys() -> None:
    assert set(classification_metrics(3).keys()) == {"acc", "loss"}


def test_multiclass_matches_sklearn() -> None:
    metrics = _updated("multiclass", 3, MC_LOGITS, MC_TARGET)
    prob = torch.softmax(MC_LOGITS.double(), dim=1).numpy()
    expected = {
        "acc": accuracy_score(MC_TARGET.numpy(), MC_LOGITS.argmax(1).numpy()),
        "loss": log_loss(MC_TARGET.numpy(), prob, labels=range(3)),
    }
    assert expected["acc"] == pytest.approx(3 / 7)
    result = metrics.compute()
    assert all(type(v) is float for v in result.values())
    _assert_close(result, expected)


def test_multiclass_batches_accumulate() -> None:
    metrics = TaskMetrics.for_task("multiclass", 3)
    metrics.update(MC_LOGITS[:4], MC_TARGET[:4])
    metrics.update(MC_LOGITS[4:], MC_TARGET[4:])
    assert metrics.update_count == 2
    _assert_close(metrics.compute(), _updated("multiclass", 3, MC_LOGITS, MC_TARGET).compute())


def test_multiclass_merge_by_state() -> None:
    merged, per_client = _merged_clients("multiclass", 3, MC_LOGITS, MC_TARGET, MC_CLIENTS)
    single = _updated("multiclass", 3, MC_LOGITS, MC_TARGET)
    _assert_close(merged.compute(), single.compute())
    assert merged.update_count == 3

    client_acc = [c.compute()["acc"] for c in per_client]
    assert client_acc == pytest.approx([1.0, 0.5, 0.25])
    # Averaging per-client scalars would give 7/12; merging states gives the pooled 3/7.
    assert merged.compute()["acc"] == pytest.approx(3 / 7)
    assert merged.compute()["acc"] != pytest.approx(float(np.mean(client_acc)), abs=1e-3)


# ----------------------------------------------------------------------------------- multilabel


def test_multilabel_matches_sklearn() -> None:
    metrics = _updated("multilabel", 5, ML_LOGITS, ML_TARGET)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # all-negative labels must not warn on compute
        result = metrics.compute()
    assert list(result) == ML_KEYS
    assert all(type(v) is float for v in result.values())
    _assert_close(result, _sk_multilabel(ML_LOGITS, ML_TARGET))


def test_multilabel_hand_computed_values() -> None:
    # Per-label (P, R, F1): (1, 2/3, 4/5), (2/3, 2/3, 2/3), then (0, 0, 0) for labels 2, 3 and 4.
    # Pooled: TP=4, FP=2, FN=5. Labels 2, 3, 4 count as 0 in the macro means (none is dropped).
    result = _updated("multilabel", 5, ML_LOGITS, ML_TARGET).compute()
    assert result["c_precision"] == pytest.approx((1 + 2 / 3) / 5, abs=TOL)
    assert result["c_recall"] == pytest.approx((2 / 3 + 2 / 3) / 5, abs=TOL)
    assert result["c_f1"] == pytest.approx((4 / 5 + 2 / 3) / 5, abs=TOL)
    assert result["o_precision"] == pytest.approx(4 / 6, abs=TOL)
    assert result["o_recall"] == pytest.approx(4 / 9, abs=TOL)
    assert result["o_f1"] == pytest.approx(2 * 4 / (2 * 4 + 2 + 5), abs=TOL)


def test_map_macro_leaves_out_labels_without_positives() -> None:
    result = _updated("multilabel", 5, ML_LOGITS, ML_TARGET).compute()
    y, prob = ML_TARGET.numpy(), torch.sigmoid(ML_LOGITS.double()).numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sk_all_labels = average_precision_score(y, prob, average="macro")
    # scikit-learn scores labels 2 and 4 (no positives) as AP 0 and averages over all 5 labels.
    per_label = average_precision_score(y[:, [0, 1, 3]], prob[:, [0, 1, 3]], average=None)
    assert sk_all_labels == pytest.approx(per_label.sum() / 5)
    assert result["map_macro"] == pytest.approx(per_label.mean(), abs=TOL)
    assert result["map_macro"] > sk_all_labels


def test_map_macro_is_nan_without_any_positive() -> None:
    result = _updated("multilabel", 5, ML_LOGITS, torch.zeros_like(ML_TARGET)).compute()
    assert np.isnan(result["map_macro"])
    assert result["map_micro"] == pytest.approx(0.0)


def test_multilabel_logits_inside_unit_interval_are_still_sigmoided() -> None:
    # torchmetrics would threshold values already in [0, 1] as probabilities; 0.3 must mean sigmoid(0.3).
    logits = torch.tensor([[0.3, 0.9], [0.1, 0.6], [0.2, 0.4]])
    target = torch.tensor([[1, 0], [0, 1], [1, 1]])
    _assert_close(_updated("multilabel", 2, logits, target).compute(), _sk_multilabel(logits, target))


def test_multilabel_float_targets() -> None:
    result = _updated("multilabel", 5, ML_LOGITS, ML_TARGET.float()).compute()
    _assert_close(result, _sk_multilabel(ML_LOGITS, ML_TARGET))


def test_multilabel_merge_by_state() -> None:
    merged, per_client = _merged_clients("multilabel", 5, ML_LOGITS, ML_TARGET, ML_CLIENTS)
    single = _updated("multilabel", 5, ML_LOGITS, ML_TARGET)
    _assert_close(merged.compute(), single.compute())
    _assert_close(merged.compute(), _sk_multilabel(ML_LOGITS, ML_TARGET))

    client_f1 = [c.compute()["o_f1"] for c in per_client]
    assert merged.compute()["o_f1"] != pytest.approx(float(np.mean(client_f1)), abs=1e-3)


@pytest.mark.parametrize(
    ("task", "num_classes", "logits", "target", "clients"),
    [
        ("multiclass", 3, MC_LOGITS, MC_TARGET, MC_CLIENTS),
        ("multilabel", 5, ML_LOGITS, ML_TARGET, ML_CLIENTS),
    ],
)
def test_merge_details(task, num_classes, logits, target, clients) -> None:
    per_client = [_updated(task, num_classes, logits[s], target[s]) for s in clients]
    before = [c.compute() for c in per_client]
    merged = TaskMetrics.for_task(task, num_classes)
    merged.merge(TaskMetrics.for_task(task, num_classes))  # merging an empty instance is a no-op
    assert merged.compute() == {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "compute called before update" from a merged-only metric
        for client in per_client:
            merged.merge(client)
            merged.compute()  # a cached result must not survive the next merge
    _assert_close(merged.compute(), _updated(task, num_classes, logits, target).compute())
    # the merged-in clients are unchanged
    for client, result in zip(per_client, before):
        _assert_close(client.compute(), result)
    # updating after a merge keeps accumulating (compute-group states are re-linked)
    merged.update(logits, target)
    twice = _updated(task, num_classes, torch.cat([logits, logits]), torch.cat([target, target]))
    _assert_close(merged.compute(), twice.compute())


def test_merge_rejects_other_config() -> None:
    with pytest.raises(ValueError, match="cannot merge"):
        TaskMetrics.for_task("multiclass", 3).merge(TaskMetrics.for_task("multiclass", 4))


# ----------------------------------------------------------------------------- lifecycle, errors


@pytest.mark.parametrize(("task", "num_classes"), [("multiclass", 3), ("multilabel", 5)])
def test_empty_compute_returns_empty_dict(task, num_classes) -> None:
    metrics = TaskMetrics.for_task(task, num_classes)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert metrics.compute() == {}
        assert not metrics.updated
        assert metrics.update_count == 0
        metrics.update(torch.zeros(0, num_classes), torch.zeros(0, dtype=torch.long))  # empty batch: skipped
        assert metrics.compute() == {}


@pytest.mark.parametrize(
    ("task", "num_classes", "logits", "target"),
    [("multiclass", 3, MC_LOGITS, MC_TARGET), ("multilabel", 5, ML_LOGITS, ML_TARGET)],
)
def test_reset_and_clone(task, num_classes, logits, target) -> None:
    metrics = _updated(task, num_classes, logits, target)
    expected = metrics.compute()
    copy = metrics.clone()
    assert (copy.task, copy.num_classes, copy.device) == (task, num_classes, metrics.device)
    assert copy.compute() == {}
    assert copy.update_count == 0
    copy.update(logits[:2], target[:2])
    _assert_close(metrics.compute(), expected)  # the original is unaffected
    assert copy.compute() != metrics.compute()
    metrics.reset()
    assert metrics.compute() == {}
    assert not metrics.updated
    metrics.update(logits, target)
    _assert_close(metrics.compute(), expected)


def test_unknown_task_raises_config_error() -> None:
    with pytest.raises(ConfigError, match="task"):
        TaskMetrics.for_task("regression", 3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(
    ("task", "num_classes", "logits", "target", "clients"),
    [
        ("multiclass", 3, MC_LOGITS, MC_TARGET, MC_CLIENTS),
        ("multilabel", 5, ML_LOGITS, ML_TARGET, ML_CLIENTS),
    ],
)
def test_cuda(task, num_classes, logits, target, clients) -> None:
    cpu = _updated(task, num_classes, logits, target).compute()
    on_gpu = TaskMetrics.for_task(task, num_classes).to("cuda")
    assert on_gpu.device.type == "cuda"
    assert on_gpu.clone().device.type == "cuda"
    on_gpu.update(logits.cuda(), target.cuda())
    _assert_close(on_gpu.compute(), cpu)
    # states follow the logits' device, and a CPU client merges into a GPU global metric
    follows = _updated(task, num_classes, logits[clients[0]].cuda(), target[clients[0]].cuda())
    assert follows.device.type == "cuda"
    for s in clients[1:]:
        follows.merge(_updated(task, num_classes, logits[s], target[s]))
    _assert_close(follows.compute(), cpu)


@pytest.mark.parametrize(("task", "classes"), [("multiclass", 4), ("multilabel", 5)])
def test_metric_states_travel_as_plain_tensors(task, classes):
    """state_tensors -> from_state_tensors rebuilds the metrics exactly (a Flower reply, a process group's
    exchange), and merging the rebuilt halves equals evaluating every batch in one instance."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(30, classes, generator=g)
    target = (
        torch.randint(0, classes, (30,), generator=g)
        if task == "multiclass"
        else (torch.rand(30, classes, generator=g) > 0.6).long()
    )
    whole, a, b = (TaskMetrics(task, classes) for _ in range(3))
    whole.update(logits, target)
    a.update(logits[:12], target[:12])
    b.update(logits[12:], target[12:])
    states = {k: v for k, v in a.state_tensors().items()}
    assert all(isinstance(v, torch.Tensor) and v.device.type == "cpu" for v in states.values())
    assert TaskMetrics.from_state_tensors(task, classes, states).compute() == pytest.approx(a.compute())
    merged = TaskMetrics(task, classes)
    for part in (a, b):
        merged.merge(TaskMetrics.from_state_tensors(task, classes, part.state_tensors()))
    assert merged.compute() == pytest.approx(whole.compute(), nan_ok=True)
    empty = TaskMetrics(task, classes).state_tensors()
    assert not TaskMetrics.from_state_tensors(task, classes, empty).updated
