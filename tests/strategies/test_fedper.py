"""FedPer: the head never leaves its client, the body is FedAvg'd."""

import pytest
import torch
from personal_helpers import personal_model, record_payloads

from fl_lightning.api.strategy import PERSONAL
from fl_lightning.errors import ConfigError
from fl_lightning.functional.representation import head_names
from fl_lightning.strategies import FedPer

from conftest import global_weights, make_module


def test_the_head_is_never_in_a_message_or_an_upload(fit):
    module = make_module(FedPer())
    seen = record_payloads(module.strategy)
    start = global_weights(module)
    fit(module, rounds=2)
    head = head_names(module.client)
    assert head == {"net.classifier.2.weight", "net.classifier.2.bias"}
    assert len(seen.messages) == len(seen.uploads) == 8
    assert seen.names() == set(start) - head
    heads = [module.store.get(c)[PERSONAL + n] for c in range(4) for n in head]
    assert not any(torch.equal(h, t) for h in heads for t in seen.tensors())  # nor their values
    end = global_weights(module)
    assert all(torch.equal(start[n], end[n]) for n in head)  # the server never touches a head
    assert all(not torch.equal(start[n], end[n]) for n in set(start) - head)


def test_each_client_deploys_the_global_body_with_its_own_head(fit):
    module = make_module(FedPer())
    fit(module, rounds=2)
    glob, head = global_weights(module), head_names(module.client)
    deployed = [personal_model(module, c) for c in range(2)]
    for c, model in enumerate(deployed):
        state = module.store.get(c)
        assert all(torch.equal(model[n], state[PERSONAL + n]) for n in head)
        assert all(torch.equal(model[n], glob[n]) for n in set(glob) - head)
    assert all(not torch.equal(deployed[0][n], deployed[1][n]) for n in head)


def test_module_names_choose_the_head(fit):
    module = make_module(FedPer(head=["net.classifier"]))
    seen = record_payloads(module.strategy)
    fit(module, rounds=1)
    assert seen.names() == {f"net.features.{i}.{p}" for i in (0, 3) for p in ("weight", "bias")}


def test_a_bad_head_names_the_field():
    module = make_module(FedPer(head=3))
    with pytest.raises(ConfigError, match="model.strategy.head=3"):
        module.strategy.setup(module.client, 4)
