"""MOON: the model-contrastive loss, previous local models, the representation tap."""

import math

import pytest
import torch
import torch.nn.functional as F

from fl_lightning.api.types import ClientContext
from fl_lightning.callbacks import FederatedCallback
from fl_lightning.errors import ConfigError
from fl_lightning.functional.representation import (
    PREVIOUS,
    FeatureTap,
    features_of,
    model_contrastive_loss,
    previous_model,
)
from fl_lightning.strategies import MOON, FedAvg

from conftest import global_weights, make_data, make_module


def test_contrastive_loss_by_hand():
    z = torch.tensor([[1.0, 0.0]])
    z_glob = torch.tensor([[1.0, 0.0]])  # cos = 1
    z_prev = torch.tensor([[0.0, 1.0]])  # cos = 0
    tau = 0.5
    expected = -math.log(math.exp(1 / tau) / (math.exp(1 / tau) + math.exp(0.0)))
    assert float(model_contrastive_loss(z, z_glob, z_prev, tau)) == pytest.approx(expected)


def test_contrastive_loss_is_log2_and_flat_when_global_equals_previous():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(8, 5, generator=g, requires_grad=True)
    ref = torch.randn(8, 5, generator=g)
    loss = model_contrastive_loss(z, ref, ref.clone(), 0.5)
    torch.testing.assert_close(loss, torch.tensor(math.log(2.0)))
    loss.backward()
    torch.testing.assert_close(z.grad, torch.zeros_like(z), rtol=0, atol=1e-7)


def test_contrastive_gradient_pulls_towards_the_global_and_away_from_the_previous_representation():
    z = torch.tensor([[1.0, 1.0]], requires_grad=True)
    z_glob, z_prev = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]])
    model_contrastive_loss(z, z_glob, z_prev, 0.5).backward()
    step, z = -z.grad, z.detach()
    assert float(F.cosine_similarity(z + 0.1 * step, z_glob)) > float(F.cosine_similarity(z, z_glob))


def test_moon_with_mu_zero_is_fedavg(fit):
    a, b = make_module(FedAvg()), make_module(MOON(mu=0.0))
    fit(a, rounds=3)
    fit(b, rounds=3)
    wa, wb = global_weights(a), global_weights(b)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


class LocalModels(FederatedCallback):
    """Each client's model at the end of its local steps (its upload, copied: it may alias the worker)."""

    def __init__(self):
        self.seen = {}

    def on_client_end(self, trainer, pl_module, round, index, total, result):
        self.seen[result.client_id] = {n: t.clone() for n, t in result.upload["weights"].items()}


def test_first_round_has_no_previous_model_and_equals_fedavg(fit):
    a, b = make_module(FedAvg()), make_module(MOON(mu=5.0))
    local = LocalModels()
    fit(a, rounds=1)
    fit(b, rounds=1, callbacks=[local])
    wa, wb = global_weights(a), global_weights(b)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    # after its first round each client keeps its own final local model as the next round's previous model
    assert sorted(local.seen) == [0, 1, 2, 3]
    for cid, weights in local.seen.items():
        prev = previous_model(b.store.get(cid))
        assert prev.keys() == weights.keys()
        assert all(torch.equal(prev[n], weights[n]) for n in weights)
        assert not all(torch.equal(prev[n], wb[n]) for n in weights)  # not the new global model


def test_later_rounds_differ_from_fedavg_and_keep_the_previous_model(fit):
    a, b = make_module(FedAvg()), make_module(MOON(mu=5.0))
    fit(a, rounds=2, data=make_data(num_clients=2))
    fit(b, rounds=2, data=make_data(num_clients=2))
    wa, wb = global_weights(a), global_weights(b)
    assert any(not torch.equal(wa[k], wb[k]) for k in wa)
    assert all(k.startswith(PREVIOUS) for k in b.store.get(1))


def test_tap_gives_the_features_of_the_training_forward(monkeypatch):
    calls = []
    hook = FeatureTap._hook
    monkeypatch.setattr(FeatureTap, "_hook", lambda self, *args: calls.append(1) or hook(self, *args))
    module = make_module(MOON())
    worker = module.client
    ctx = ClientContext(0, 0, {}, {}, 1, 1, 0.1)
    x = torch.randn(5, 1, 8, 8)
    tap = FeatureTap(worker, ctx.scratch, "tap")
    assert ctx.scratch["tap"] is tap
    out = worker(x)
    recorded = tap.features_for(out)
    z, logits = features_of(worker, x)  # another forward: the first output's features are no longer recorded
    assert torch.equal(recorded, z) and torch.equal(out, logits)
    assert tap.features_for(out) is None
    ctx.scratch.clear()  # what the loop does when a client's work ends
    worker(x)  # a stale tap removes itself
    seen = len(calls)
    worker(x)
    assert len(calls) == seen  # its hook is gone from the layer


def test_bad_arguments_name_the_field():
    with pytest.raises(ConfigError, match="model.strategy.mu"):
        MOON(mu=-1)
    with pytest.raises(ConfigError, match="model.strategy.temperature"):
        MOON(temperature=0)
