"""Trainer precision flags reach the local training and evaluation of the clients."""

import pytest
import torch

from conftest import global_weights, make_module


@pytest.mark.parametrize("precision", ["bf16-mixed", "64-true"])
def test_precision_flags_train_and_evaluate(fit, precision):
    module = make_module()
    trainer = fit(module, rounds=2, precision=precision)
    weights = global_weights(module)
    assert all(torch.isfinite(v).all() for v in weights.values())
    expected = torch.float64 if precision == "64-true" else torch.float32
    assert all(v.dtype == expected for v in weights.values())
    assert 0.0 <= float(trainer.callback_metrics["global/acc"]) <= 1.0


def test_bf16_local_training_differs_from_fp32(fit):
    a, b = make_module(), make_module()
    fit(a, rounds=1)
    fit(b, rounds=1, precision="bf16-mixed")
    wa, wb = global_weights(a), global_weights(b)
    assert any(not torch.equal(wa[k], wb[k]) for k in wa)  # autocast really ran in the clients
    assert all(torch.allclose(wa[k], wb[k], atol=0.05) for k in wa)
