"""FineTune: the "+FT" baselines fine-tune the global model on each client's data before its evaluation."""

import contextlib

import pytest
import torch
from lightning.pytorch.plugins.precision import MixedPrecision
from torch import nn

from fl_lightning.engine.local import LocalConfig, local_training
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


def _client(index: int = 2):
    data = make_data()
    data.setup()
    return data.clients[index]


def _tuned(strategy, client, config=None, precision=None, start=None, worker=None):
    """The weights ``strategy.adapt`` deploys for ``client`` on ``worker`` (default: a fresh module's client)
    from ``start`` (default: its weights)."""
    worker = make_module().client if worker is None else worker
    if start is not None:
        worker.load_state_dict(start)
    strategy.adapt(worker, client, {}, local_training(config or LocalConfig(16), precision))
    return {k: v.detach().clone() for k, v in worker.state_dict().items()}


def _moved(a, b) -> float:
    return sum(float((a[k].float() - b[k].float()).norm() ** 2) for k in a) ** 0.5


def test_adapt_fine_tunes_deterministically_and_leaves_the_global_rng():
    client = _client()
    start = global_weights(make_module())
    rng = torch.random.get_rng_state()
    results = [_tuned(FineTune(epochs=3, lr=0.05), client) for _ in range(2)]
    assert torch.equal(rng, torch.random.get_rng_state())  # the global RNG is untouched
    assert all(torch.equal(results[0][k], results[1][k]) for k in start)
    assert _moved(results[0], start) > 0.05
    module = make_module(FineTune(epochs=1))
    module.strategy.adapt(module.client, client, {}, local_training(LocalConfig(16)))
    assert module.client.training  # mode restored


def test_fine_tuning_clips_the_gradients_as_a_clients_local_training_does():
    """model.grad_clip_norm holds for fine-tuning too: plain SGD moves at most lr * clip per step."""
    client = _client()
    start = global_weights(make_module())
    steps = 2 * client.steps_per_epoch(16)
    free = _tuned(FineTune(epochs=2, lr=0.1), client)
    clipped = _tuned(FineTune(epochs=2, lr=0.1), client, LocalConfig(16, grad_clip_norm=1e-3))
    assert _moved(free, start) > 10 * steps * 0.1 * 1e-3
    assert _moved(clipped, start) <= steps * 0.1 * 1e-3 * 1.001


class _Recording:
    """A precision plugin that records what the local steps asked of it."""

    scaler = None

    def __init__(self) -> None:
        self.calls: list[str] = []

    @contextlib.contextmanager
    def train_step_context(self):
        self.calls.append("train_step_context")
        yield

    def convert_input(self, data):
        self.calls.append("convert_input")
        return data


def test_fine_tuning_runs_under_the_runs_precision_plugin():
    client = _client()
    precision = _Recording()
    _tuned(FineTune(epochs=1), client, precision=precision)
    steps = client.steps_per_epoch(16)
    assert precision.calls.count("convert_input") == steps
    assert precision.calls.count("train_step_context") == steps


def test_fine_tuning_steps_through_the_gradient_scaler_and_leaves_its_state():
    """16-mixed: the scaler steps the optimizer (as in a round), and its scale is the round's again after,
    so evaluating never changes how the next round trains."""
    client = _client()
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0, growth_interval=1)
    precision = MixedPrecision("16-mixed", "cpu", scaler=scaler)
    start = global_weights(make_module())
    before = scaler.state_dict()
    seen = []
    step = scaler.step
    scaler.step = lambda optimizer, *a, **k: seen.append(scaler.get_scale()) or step(optimizer, *a, **k)
    tuned = _tuned(FineTune(epochs=1, lr=0.05), client, precision=precision)
    assert len(seen) == client.steps_per_epoch(16) and seen[-1] > seen[0]  # grew on the way
    assert scaler.state_dict() == before and scaler.get_scale() == 4.0
    assert _moved(tuned, start) > 0


def test_the_stream_is_the_run_seeds_unless_fine_tune_names_one():
    client = _client()
    run0 = _tuned(FineTune(epochs=1), client, LocalConfig(16, seed=0))
    run3 = _tuned(FineTune(epochs=1), client, LocalConfig(16, seed=3))
    own3 = _tuned(FineTune(epochs=1, seed=3), client, LocalConfig(16, seed=0))
    assert any(not torch.equal(run0[k], run3[k]) for k in run0)
    assert all(torch.equal(own3[k], run3[k]) for k in run0)


def test_dropout_draws_come_from_the_clients_stream_not_the_global_rng():
    client = _client()
    tuned = []
    for global_seed in (1, 2):
        worker = make_module().client
        worker.net.classifier.insert(1, nn.Dropout(0.5))
        torch.manual_seed(global_seed)
        tuned.append(_tuned(FineTune(epochs=1), client, worker=worker))
    assert all(torch.equal(tuned[0][k], tuned[1][k]) for k in tuned[0])


def test_bad_arguments_name_the_field():
    with pytest.raises(ConfigError, match="model.strategy.epochs"):
        FineTune(epochs=-1)
    with pytest.raises(ConfigError, match="model.strategy.lr"):
        FineTune(lr=0.0)
    with pytest.raises(ConfigError, match="model.strategy.seed"):
        FineTune(seed=-1)
