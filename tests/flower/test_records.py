"""fl_lightning payloads, client states and metrics as Flower records, and back."""

from __future__ import annotations

import pytest

pytest.importorskip("flwr")

import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fl_lightning.api.metrics import TaskMetrics
from fl_lightning.flower.executor import combine_states
from fl_lightning.flower.records import (
    CLIENT_STATE,
    NUM_EXAMPLES,
    PAYLOAD,
    array_to_numpy,
    load_client_state,
    metrics_to_record,
    payload_to_records,
    record_to_tensors,
    record_to_train_state,
    records_to_payload,
    save_client_state,
    tensors_to_record,
    train_state_to_record,
)


def _payload():
    g = torch.Generator().manual_seed(0)
    return {
        "weights": {
            "net.0.weight": torch.randn(3, 4, generator=g),
            "net.0.bias": torch.randn(3, generator=g),
        },
        "control": {"net.0.weight": torch.randn(3, 4, generator=g).double()},
    }


def test_a_payload_round_trips_through_a_record_dict():
    payload = _payload()
    records = payload_to_records(payload)
    assert set(records) == {PAYLOAD + "weights", PAYLOAD + "control"}
    assert all(isinstance(r, ArrayRecord) for r in records.values())
    content = RecordDict({**records, "fl.config": ConfigRecord({"round": 0})})
    back = records_to_payload(content)
    assert back.keys() == payload.keys()
    for group, tensors in payload.items():
        assert list(back[group]) == list(tensors)  # names and their order kept
        for name, t in tensors.items():
            assert back[group][name].dtype == t.dtype and back[group][name].shape == t.shape
            assert torch.equal(back[group][name], t)


def test_received_tensors_are_writable_copies():
    t = torch.arange(6.0).reshape(2, 3)
    back = records_to_payload(RecordDict(payload_to_records({"weights": {"w": t}})))["weights"]["w"]
    back.add_(1)  # a read-only numpy buffer would warn or fail here; the original is untouched
    assert torch.equal(t, torch.arange(6.0).reshape(2, 3))


def test_only_payload_records_are_read_as_payload():
    content = RecordDict({"other": tensors_to_record({"x": torch.ones(1)}), **payload_to_records(_payload())})
    assert set(records_to_payload(content)) == {"weights", "control"}


def test_train_state_round_trips():
    state = {
        "train_loss": {"mean_value": torch.tensor(3.5), "weight": torch.tensor(7.0)},
        "train_acc": {"mean_value": torch.tensor(2.0), "weight": torch.tensor(7.0)},
    }
    back = record_to_train_state(train_state_to_record(state))
    assert back.keys() == state.keys()
    for k in state:
        assert back[k].keys() == state[k].keys()
        assert all(torch.equal(back[k][s], state[k][s]) for s in state[k])


def test_client_state_is_kept_per_client_in_the_context_state_and_removed_when_empty():
    store = RecordDict()
    assert load_client_state(store, 3) == {}
    state = {"control/w": torch.randn(2, 2), "personal/head.bias": torch.zeros(3)}
    other = {"control/w": torch.ones(2, 2)}
    save_client_state(store, 3, state)
    save_client_state(store, 5, other)  # a node hosting two clients keeps both
    assert isinstance(store[f"{CLIENT_STATE}.3"], ArrayRecord)
    back = load_client_state(store, 3)
    assert back.keys() == state.keys() and all(torch.equal(back[k], state[k]) for k in state)
    assert torch.equal(load_client_state(store, 5)["control/w"], other["control/w"])
    save_client_state(store, 3, {})
    assert f"{CLIENT_STATE}.3" not in store and f"{CLIENT_STATE}.5" in store


def test_metrics_record_carries_the_aggregation_weight():
    record = metrics_to_record({"train_loss": 0.5, "local_acc": 1}, 42)
    assert isinstance(record, MetricRecord)
    assert record[NUM_EXAMPLES] == 42 and isinstance(record["local_acc"], float)


def test_arrays_read_back_exactly_in_any_layout_and_dtype():
    """The fast read of an Array's bytes (no numpy.load) gives what Array.numpy() gives; Fortran-order
    arrays (a transposed tensor) and other dtypes round-trip too."""
    g = torch.Generator().manual_seed(0)
    tensors = {
        "c_order": torch.randn(3, 4, generator=g),
        "transposed": torch.randn(4, 3, generator=g).t(),
        "scalar": torch.tensor(5),
        "empty": torch.zeros(0, 3),
        "int": torch.arange(6).reshape(2, 3),
        "half": torch.randn(2, 2, generator=g).half(),
        "double": torch.randn(5, generator=g).double(),
    }
    record = tensors_to_record(tensors)
    back = record_to_tensors(record)
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and torch.equal(back[name], t), name
        assert torch.equal(torch.from_numpy(array_to_numpy(record[name]).copy()), t), name
    back["c_order"].add_(1)  # fresh, writable memory
    assert torch.equal(record_to_tensors(record)["c_order"], tensors["c_order"])


@pytest.mark.parametrize(("task", "labels"), [("multiclass", 4), ("multilabel", 3)])
def test_combined_metric_states_equal_merging_one_metrics_per_client(task, labels):
    """The server merges the clients' evaluation states in one go (counts added, stored scores
    concatenated): the same as one TaskMetrics per client merged, for every metric of the task."""
    g = torch.Generator().manual_seed(1)
    clients = []
    for n in (5, 1, 7):
        m = TaskMetrics(task, labels)
        logits = torch.randn(n, labels, generator=g)
        target = torch.randint(0, labels, (n,), generator=g)
        if task == "multilabel":
            target = (torch.rand(n, labels, generator=g) > 0.5).long()
        m.update(logits, target)
        clients.append(m.state_tensors())
    clients.append(TaskMetrics(task, labels).state_tensors())  # a client with an empty test split
    reference = TaskMetrics(task, labels)
    for s in clients:
        reference.merge(TaskMetrics.from_state_tensors(task, labels, s))
    template = TaskMetrics(task, labels)
    combined = TaskMetrics.from_state_tensors(task, labels, combine_states(template, clients))
    expected, got = reference.compute(), combined.compute()
    assert got.keys() == expected.keys() and combined.update_count == reference.update_count
    for key in expected:
        assert got[key] == pytest.approx(expected[key], rel=1e-6, nan_ok=True), key
