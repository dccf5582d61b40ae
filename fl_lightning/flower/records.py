"""fl_lightning payloads as Flower records, and back.

A message's content is a Flower ``RecordDict``; fl_lightning's payloads (``{group: {name: tensor}}``,
e.g. SCAFFOLD's ``{"weights": ..., "control": ...}``) travel in it as one ``ArrayRecord`` per group under
``payload.<group>``, next to a ``ConfigRecord`` ``fl.config`` (round, client id) and, in a reply, a
``MetricRecord`` ``fl.metrics`` (the client's metrics and ``num-examples``, its aggregation weight) and an
``ArrayRecord`` ``fl.train_state`` (its training-metric states, merged by state on the server); an evaluate
reply carries the metric states of the client's deployed model as ``fl.eval_state``.
A client's persistent state (``ctx.state``: SCAFFOLD's ``c_i``, personal layers) is kept between rounds
in its node's ``context.state`` as the ``ArrayRecord`` ``fl.client_state.<client id>`` (a node may host
several clients).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict
from torch import Tensor

from fl_lightning.api.types import Payload, TrainState

#: Prefix of the ``ArrayRecord`` of one payload group in a message's ``RecordDict``.
PAYLOAD = "payload."
#: ``ConfigRecord`` of a message: ``round`` (0-based, fl_lightning's), ``client-id``.
CONFIG = "fl.config"
#: ``MetricRecord`` of a reply: the client's metrics and ``num-examples``.
METRICS = "fl.metrics"
#: ``ArrayRecord`` of a train reply: the training-metric states (``<metric>/<state>``).
TRAIN_STATE = "fl.train_state"
#: ``ArrayRecord`` of an evaluate reply: the metric states of the client's deployed model.
EVAL_STATE = "fl.eval_state"
#: ``MetricRecord`` of an evaluate reply: the client's metric values (computed on its node).
EVAL_METRICS = "fl.eval_metrics"
#: ``ArrayRecord`` in the node's ``context.state``: a client's persistent state (``<CLIENT_STATE>.<id>``).
CLIENT_STATE = "fl.client_state"
#: ``MetricRecord`` key of a reply's aggregation weight (Flower's convention).
NUM_EXAMPLES = "num-examples"


def tensors_to_record(tensors: Mapping[str, Tensor]) -> ArrayRecord:
    """Named tensors as an ``ArrayRecord`` (host copies; names and order kept)."""
    return ArrayRecord.from_torch_state_dict({n: t.detach() for n, t in tensors.items()})


def array_to_numpy(array: Array) -> np.ndarray:
    """An ``Array``'s values (read-only; a view of its bytes when it can be).

    Flower stores an array as the bytes ``numpy.save`` writes; ``Array.numpy()`` reads them back with
    ``numpy.load``, which parses the header with ``ast.literal_eval`` each time. The values of a C-order
    array are the last ``size * itemsize`` bytes, and the dtype and shape are the ``Array``'s own fields, so
    they are taken from there; anything else goes through ``Array.numpy()``.
    """
    if array.stype == "numpy.ndarray":
        dtype = np.dtype(array.dtype)
        count = int(np.prod(array.shape, dtype=np.int64))
        data = array.data
        start = len(data) - count * dtype.itemsize
        if (
            not dtype.hasobject
            and start > 10
            and data[:6] == b"\x93NUMPY"
            and b"'fortran_order': False" in data[:start]
        ):
            return np.frombuffer(data, dtype=dtype, count=count, offset=start).reshape(array.shape)
    return array.numpy()


def record_to_tensors(record: ArrayRecord, device: torch.device | str = "cpu") -> dict[str, Tensor]:
    """An ``ArrayRecord`` as named tensors on ``device`` (fresh, writable memory)."""
    return {n: torch.from_numpy(array_to_numpy(a).copy()).to(device) for n, a in record.items()}


def payload_to_records(payload: Payload) -> dict[str, ArrayRecord]:
    """One ``ArrayRecord`` per payload group, keyed ``payload.<group>``."""
    return {PAYLOAD + group: tensors_to_record(tensors) for group, tensors in payload.items()}


def records_to_payload(content: RecordDict, device: torch.device | str = "cpu") -> Payload:
    """The payload carried by a message's ``RecordDict`` (its ``payload.<group>`` records)."""
    return {
        key[len(PAYLOAD) :]: record_to_tensors(record, device)
        for key, record in content.array_records.items()
        if key.startswith(PAYLOAD)
    }


def train_state_to_record(state: TrainState) -> ArrayRecord:
    """Training-metric states ``{metric: {state: tensor}}`` as one ``ArrayRecord`` (``metric/state``)."""
    return tensors_to_record({f"{m}/{s}": t for m, states in state.items() for s, t in states.items()})


def record_to_train_state(record: ArrayRecord) -> TrainState:
    """Inverse of :func:`train_state_to_record`."""
    state: TrainState = {}
    for key, tensor in record_to_tensors(record).items():
        metric, _, name = key.rpartition("/")
        state.setdefault(metric, {})[name] = tensor
    return state


def metrics_to_record(metrics: Mapping[str, float], num_examples: int) -> MetricRecord:
    """A client's scalar metrics and its aggregation weight as a ``MetricRecord``."""
    return MetricRecord({**{k: float(v) for k, v in metrics.items()}, NUM_EXAMPLES: int(num_examples)})


def save_client_state(store: RecordDict, client_id: int, state: Mapping[str, Tensor]) -> None:
    """Keep a client's state in its node's ``context.state`` (an empty state removes it)."""
    key = f"{CLIENT_STATE}.{client_id}"
    if state:
        store[key] = tensors_to_record(state)
    elif key in store:
        del store[key]


def load_client_state(store: RecordDict, client_id: int) -> dict[str, Tensor]:
    """The client's state kept by :func:`save_client_state` (empty before its first round)."""
    record = store.array_records.get(f"{CLIENT_STATE}.{client_id}")
    return {} if record is None else record_to_tensors(record)
