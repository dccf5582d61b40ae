"""Trainer precision flags reach the local training and evaluation of the clients."""

import contextlib

import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import accuracy_score

from conftest import global_weights, make_data, make_module


def _reference(model, x, y, precision):
    """Accuracy and mean cross-entropy of ``model`` evaluated in ``precision`` by torch alone."""
    if precision == "64-true":
        x, ctx = x.double(), contextlib.nullcontext()
    else:
        ctx = torch.autocast("cpu", dtype=torch.bfloat16)
    with torch.no_grad(), ctx:
        logits = model(x).float()
    return accuracy_score(y.numpy(), logits.argmax(-1).numpy()), float(F.cross_entropy(logits, y))


@pytest.mark.parametrize("precision", ["bf16-mixed", "64-true"])
def test_precision_flags_train_and_evaluate(fit, precision):
    module = make_module()
    start = global_weights(module)
    data = make_data()
    trainer = fit(module, rounds=2, precision=precision, data=data)
    assert [(r.clients, r.failed) for r in module.history] == [(4, 0), (4, 0)]
    weights = global_weights(module)
    expected = torch.float64 if precision == "64-true" else torch.float32
    assert all(v.dtype == expected for v in weights.values())
    assert all(not torch.equal(start[k].to(expected), weights[k]) for k in weights)  # every tensor trained
    # the global evaluation ran the final global model in that precision
    x, y = (torch.cat(t) for t in zip(*data.val_dataloader()))
    acc, loss = _reference(module.client, x, y, precision)
    metrics = trainer.callback_metrics
    assert float(metrics["global/acc"]) == pytest.approx(acc, abs=1e-6)
    assert float(metrics["global/loss"]) == pytest.approx(loss, abs=2e-6)
    # and so did every client's evaluation of its deployed model on its local test split
    per = module.final_client_metrics()
    for c, client in enumerate(data.clients):
        acc, loss = _reference(module.client, client.x[client.test_idx], client.y[client.test_idx], precision)
        assert per[c]["acc"] == pytest.approx(acc, abs=1e-6)
        assert per[c]["loss"] == pytest.approx(loss, abs=2e-6)
    if precision == "bf16-mixed":  # the check can tell: in fp32 the same model has another loss (~3e-5)
        with torch.no_grad():
            fp32 = float(F.cross_entropy(module.client(x), y))
        assert abs(float(metrics["global/loss"]) - fp32) > 1e-5


def test_bf16_local_training_differs_from_fp32(fit):
    a, b = make_module(), make_module()
    fit(a, rounds=1)
    fit(b, rounds=1, precision="bf16-mixed")
    wa, wb = global_weights(a), global_weights(b)
    assert any(not torch.equal(wa[k], wb[k]) for k in wa)  # autocast really ran in the clients
    assert all(torch.allclose(wa[k], wb[k], atol=0.05) for k in wa)
