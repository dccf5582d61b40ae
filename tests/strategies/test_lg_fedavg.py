"""LG-FedAvg: only the global layers (the head) are shared, each client keeps its representation."""

import torch
from personal_helpers import personal_model, record_payloads

from fl_lightning.api.strategy import PERSONAL
from fl_lightning.functional.representation import head_names
from fl_lightning.strategies import LGFedAvg

from conftest import global_weights, make_module


def test_only_the_head_is_in_messages_and_uploads(fit):
    module = make_module(LGFedAvg())
    seen = record_payloads(module.strategy)
    start = global_weights(module)
    fit(module, rounds=2)
    head = head_names(module.client)
    body = set(start) - head
    assert len(seen.messages) == len(seen.uploads) == 8
    assert seen.names() == head
    end = global_weights(module)
    assert all(not torch.equal(start[n], end[n]) for n in head)  # the shared layers are averaged
    assert all(torch.equal(start[n], end[n]) for n in body)  # the server's body is never touched
    a, b = (module.store.get(c) for c in (0, 1))
    assert set(a) == {PERSONAL + n for n in body}
    assert all(not torch.equal(a[PERSONAL + n], b[PERSONAL + n]) for n in body)


def test_each_client_deploys_its_representation_with_the_global_head(fit):
    module = make_module(LGFedAvg(head=2))
    fit(module, rounds=2)
    glob, head = global_weights(module), head_names(module.client, 2)
    model, state = personal_model(module, 1), module.store.get(1)
    assert all(torch.equal(model[n], glob[n]) for n in head)
    assert all(torch.equal(model[n], state[PERSONAL + n]) for n in set(glob) - head)
    assert set(glob) - head == {f"net.features.{i}.{p}" for i in (0, 3) for p in ("weight", "bias")}
