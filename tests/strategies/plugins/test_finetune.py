"""FineTune: the "+FT" baselines fine-tune the global model on each client's data before its evaluation."""

import pytest
import torch

from fl_lightning.errors import ConfigError
from fl_lightning.strategies import FedAvg, FedProx, FineTune

from conftest import global_weights, make_data, make_module


def test_training_is_the_base_strategy_and_only_the_deployed_model_changes(fit):
    plain, tuned = make_module(FedProx(mu=0.1)), make_module(FineTune(FedProx(mu=0.1), epochs=2))
    fit(plain, rounds=2)
    fit(tuned, rounds=2)
    a, b = global_weights(plain), global_weights(tuned)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert plain.client_eval.keys() == tuned.client_eval.keys()
    assert any(plain.client_eval[c]["acc"] != tuned.client_eval[c]["acc"] for c in plain.client_eval)


def test_zero_epochs_deploys_the_global_model(fit):
    plain, tuned = make_module(FedAvg()), make_module(FineTune(epochs=0))
    fit(plain, rounds=1)
    fit(tuned, rounds=1)
    assert plain.client_eval == tuned.client_eval


def test_validate_and_test_fine_tune_despite_lightning_inference_mode(fit):
    """trainer.validate/test run under torch.inference_mode; per-client fine-tuning needs gradients."""
    module = make_module(FineTune(epochs=1))
    trainer = fit(module, rounds=1)
    during_fit = dict(module.client_eval)
    module.engine._worker = None  # as from a checkpoint: the worker is made inside validate
    val = trainer.validate(module, datamodule=module.datamodule, verbose=False)[0]
    assert "personal/acc" in val and module.client_eval == during_fit
    assert "personal/acc" in trainer.test(module, datamodule=module.datamodule, verbose=False)[0]


def test_adapt_fine_tunes_deterministically_and_leaves_the_global_rng():
    module = make_module(FineTune(epochs=3, lr=0.05))
    data = make_data()
    data.setup()
    client = data.clients[2]
    start = global_weights(module)
    rng = torch.random.get_rng_state()
    results = []
    for _ in range(2):
        worker = module.client
        worker.load_state_dict(start)
        module.strategy.adapt(worker, client, {}, batch_size=16)
        results.append(global_weights(module))
    assert torch.equal(rng, torch.random.get_rng_state())  # the global RNG is untouched
    assert all(torch.equal(results[0][k], results[1][k]) for k in start)
    assert any(not torch.equal(results[0][k], start[k]) for k in start)
    assert module.client.training  # mode restored


def test_bad_arguments_name_the_field():
    with pytest.raises(ConfigError, match="model.strategy.epochs"):
        FineTune(epochs=-1)
    with pytest.raises(ConfigError, match="model.strategy.lr"):
        FineTune(lr=0.0)
