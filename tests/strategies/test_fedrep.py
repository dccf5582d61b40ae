"""FedRep: head steps with the body frozen, then body steps with the head frozen; only the body travels."""

import pytest
import torch
from personal_helpers import record_payloads

from fl_lightning.errors import ConfigError
from fl_lightning.functional.representation import head_names
from fl_lightning.strategies import FedRep
from fl_lightning.strategies.fedrep import head_steps

from conftest import global_weights, make_module


class RecordingFedRep(FedRep):
    """FedRep that keeps the worker's parameters after every local step (and at the client's start)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.trace: dict[tuple[int, int], list[dict[str, torch.Tensor]]] = {}

    def on_client_start(self, module, ctx):
        super().on_client_start(module, ctx)
        self.trace[(ctx.round, ctx.client_id)] = [_params(module)]

    def local_step(self, module, optimizer, ctx, batch, closure):
        super().local_step(module, optimizer, ctx, batch, closure)
        self.trace[(ctx.round, ctx.client_id)].append(_params(module))


def _params(module):
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def _same(a, b, names):
    return all(torch.equal(a[n], b[n]) for n in names)


def _moved(a, b, names):
    return all(not torch.equal(a[n], b[n]) for n in names)


def test_head_steps_then_body_steps_each_with_the_other_part_frozen(fit):
    # momentum and weight decay would move a frozen part that merely got a zero gradient
    strategy = RecordingFedRep(head_epochs=2, body_epochs=1)
    module = make_module(strategy, local_steps=6, client_kw={"momentum": 0.9, "weight_decay": 1e-3})
    fit(module, rounds=2)
    head = head_names(module.client)
    body = set(global_weights(module)) - head
    assert len(strategy.trace) == 8
    for trace in strategy.trace.values():
        assert len(trace) == 7 and head_steps(6, 2, 1) == 4
        for s in range(1, 5):  # head phase: the body stays at the received representation
            assert _same(trace[s], trace[0], body) and _moved(trace[s], trace[s - 1], head)
        for s in range(5, 7):  # body phase: the head stays where the head phase left it
            assert _same(trace[s], trace[4], head) and _moved(trace[s], trace[s - 1], body)
    assert all(p.requires_grad for p in module.worker.parameters())  # restored for the next client


def test_only_the_body_is_communicated(fit):
    module = make_module(FedRep(), local_steps=4)
    seen = record_payloads(module.strategy)
    start = global_weights(module)
    fit(module, rounds=2)
    head = head_names(module.client)
    assert len(seen.uploads) == 8 and seen.names() == set(start) - head
    end = global_weights(module)
    assert _same(start, end, head) and _moved(start, end, set(start) - head)


def test_head_steps_split_the_round_by_epochs():
    assert head_steps(11, 10, 1) == 10  # model.local_epochs = 11: 10 head epochs, 1 body epoch
    assert head_steps(22, 10, 1) == 20
    assert head_steps(5, 0, 1) == 0 and head_steps(5, 1, 0) == 5


def test_bad_epochs_name_the_field():
    with pytest.raises(ConfigError, match="model.strategy.head_epochs"):
        FedRep(head_epochs=0, body_epochs=0)
    with pytest.raises(ConfigError, match="model.strategy.body_epochs"):
        FedRep(body_epochs=-1)
