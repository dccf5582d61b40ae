"""FedALA: the adaptive local aggregation of the global model into the local one, by hand."""

import pytest
import torch
from drift_helpers import assert_resume_is_identical, least_squares_module, single_client

from fl_lightning.cli import main
from fl_lightning.engine.local import LocalConfig, local_training, train_client
from fl_lightning.errors import ConfigError
from fl_lightning.strategies import FedALA, FedAvg

from conftest import global_weights, make_module

W = "net.weight"
X = torch.tensor([[1.0, 2.0], [0.5, -1.0], [2.0, 0.0], [-1.0, 1.0]], dtype=torch.float64)
Y = torch.tensor([1.0, -2.0, 3.0, 0.5], dtype=torch.float64)
LR, ETA = 0.1, 0.5


def grad(w):
    return ((X @ w.T).squeeze(-1) - Y) @ X / len(Y)


def _round(strategy, glob, state):
    worker = least_squares_module(2, lr=LR)
    strategy.setup(worker, 1)
    return train_client(
        worker, strategy, {"weights": {W: glob}}, state, single_client(X, Y), 0, LocalConfig(4, local_steps=1)
    )


def test_one_epoch_on_the_weights_then_the_local_step_by_hand():
    # all the data (rand_percent 100) in one batch of 4: one step on W, then one local SGD step from hat theta
    glob = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    local = torch.tensor([[0.5, 2.0]], dtype=torch.float64)
    weights = torch.tensor([[0.25, 0.9]], dtype=torch.float64)
    state = {"fedala/local/" + W: local.clone(), "fedala/weight/" + W: weights.clone()}
    res = _round(FedALA(rand_percent=100, layer_idx=0, eta=ETA), glob, state)
    mixed = local + (glob - local) * weights
    weights = (weights - ETA * grad(mixed) * (glob - local)).clamp(0, 1)
    mixed = local + (glob - local) * weights
    trained = mixed - LR * grad(mixed)
    torch.testing.assert_close(res.state["fedala/weight/" + W], weights)
    torch.testing.assert_close(res.upload["weights"][W], trained)
    torch.testing.assert_close(res.state["fedala/local/" + W], trained)


def test_the_first_weight_learning_runs_until_the_loss_deviation_rule_holds():
    # threshold huge: the rule holds as soon as more than num_pre_loss = 2 losses are recorded (3 epochs)
    glob = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    local = torch.tensor([[0.5, 2.0]], dtype=torch.float64)
    strategy = FedALA(rand_percent=100, layer_idx=1, eta=ETA, threshold=1e9, num_pre_loss=2)
    res = _round(strategy, glob, {"fedala/local/" + W: local.clone()})
    weights = torch.ones_like(glob)
    for _ in range(3):
        weights = (weights - ETA * grad(local + (glob - local) * weights) * (glob - local)).clamp(0, 1)
    torch.testing.assert_close(res.state["fedala/weight/" + W], weights)
    assert not torch.equal(weights, torch.ones_like(glob))


def test_the_first_round_is_fedavg_and_later_rounds_are_not(fit):
    for rounds, same in ((1, True), (2, False)):
        plain, ala = make_module(FedAvg()), make_module(FedALA())
        fit(plain, rounds=rounds)
        fit(ala, rounds=rounds)
        a, b = global_weights(plain), global_weights(ala)
        assert all(torch.equal(a[k], b[k]) for k in a) is same
    state = ala.store.get(0)
    assert {k for k in state if k.startswith("fedala/weight/")} == {
        "fedala/weight/net.classifier.2.weight",
        "fedala/weight/net.classifier.2.bias",
    }


@pytest.mark.parametrize("percent", [0, -5, 100.5, float("nan")])
def test_rand_percent_out_of_range_is_one_line_naming_the_field(percent):
    with pytest.raises(ConfigError, match=r"^model\.strategy\.rand_percent=.* must be .*\(0, 100\]") as err:
        FedALA(rand_percent=percent)
    assert "\n" not in str(err.value)


def test_layer_idx_beyond_the_model_names_the_field():
    with pytest.raises(ConfigError, match=r"^model\.strategy\.layer_idx=3 must count 0\.\.1 last parameter"):
        FedALA(layer_idx=3).setup(least_squares_module(2, lr=LR), 1)
    with pytest.raises(ConfigError, match=r"^model\.strategy\.layer_idx=-1 must be an integer >= 0"):
        FedALA(layer_idx=-1)


def test_a_resumed_run_is_bit_identical(tmp_path):
    assert_resume_is_identical(tmp_path, lambda: make_module(FedALA()))


def _cli_error(tmp_path, capsys, *args):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--trainer.max_steps=1", f"--trainer.default_root_dir={tmp_path}", *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_the_cli_takes_its_arguments_and_refuses_rand_percent_out_of_range_in_one_line(tmp_path, capsys):
    line = _cli_error(tmp_path, capsys, "--model.strategy=FedALA", "--model.strategy.rand_percent=0")
    assert line.startswith("error: model.strategy.rand_percent=0.0 must be in (0, 100]")


def test_the_deployed_model_is_one_more_epoch_of_ala_not_kept_and_the_global_model_before_training():
    glob = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    local = torch.tensor([[0.5, 2.0]], dtype=torch.float64)
    strategy = FedALA(rand_percent=100, layer_idx=0, eta=ETA)
    worker = least_squares_module(2, lr=LR, w0=glob)
    strategy.setup(worker, 1)
    strategy.adapt(worker, single_client(X, Y), {}, local_training(LocalConfig(4)))
    assert torch.equal(worker.net.weight.detach(), glob)  # never trained
    state = {"fedala/local/" + W: local.clone()}  # trained once: no W yet, one epoch from ones
    strategy.adapt(worker, single_client(X, Y), state, local_training(LocalConfig(4)))
    weights = (1 - ETA * grad(glob) * (glob - local)).clamp(0, 1)
    torch.testing.assert_close(worker.net.weight.detach(), local + (glob - local) * weights)
    assert set(state) == {"fedala/local/" + W}
