"""FedCM: alpha = 1 is FedAvg bit for bit; the momentum step and the server direction by hand; 2x down."""

import pytest
import torch
from drift_helpers import assert_resume_is_identical, least_squares_module, single_client
from torch import nn

from fl_lightning.engine.local import LocalConfig, train_client
from fl_lightning.errors import ConfigError
from fl_lightning.strategies import FedAvg, FedCM, RoundInfo

from conftest import global_weights, make_module

W = "net.weight"
F64 = {"dtype": torch.float64}


def _equal(a, b):
    wa, wb = global_weights(a), global_weights(b)
    return all(torch.equal(wa[k], wb[k]) for k in wa)


def test_alpha_one_is_fedavg_bit_for_bit(fit):
    # v = 1 * g + 0 * Delta = g exactly, and the server aggregates as FedAvg
    a = make_module(FedAvg(), clients_per_round=3, local_steps=3)
    b = make_module(FedCM(alpha=1.0), clients_per_round=3, local_steps=3)
    c = make_module(FedCM(alpha=0.1), clients_per_round=3, local_steps=3)
    for m in (a, b, c):
        fit(m, rounds=3)
    assert _equal(a, b)
    assert not _equal(a, c)


def test_local_momentum_steps_by_hand():
    # f(w) = 1/2 (w - 3)^2, w^t = 1, Delta^t = 0.5, alpha = 0.25, lr 0.1, K = 2
    strategy = FedCM(alpha=0.25)
    worker = least_squares_module(1, lr=0.1)
    strategy.setup(worker, 4)
    data = single_client(torch.ones(1, 1, **F64), torch.tensor([3.0], **F64))
    message = {"weights": {W: torch.tensor([[1.0]], **F64)}, "momentum": {W: torch.tensor([[0.5]], **F64)}}
    res = train_client(worker, strategy, message, {}, data, 0, LocalConfig(batch_size=1, local_steps=2))
    # v1 = 0.25 * -2 + 0.75 * 0.5 = -0.125 -> 1.0125;  v2 = 0.25 * -1.9875 + 0.375 = -0.121875 -> 1.0246875
    torch.testing.assert_close(res.upload["weights"][W], torch.tensor([[1.0246875]], **F64))
    torch.testing.assert_close(res.upload["fedcm"]["steps_x_lr"], torch.tensor(0.2))  # K * lr
    assert res.state == {}  # no client state


def test_server_direction_by_hand():
    # w^t = 0, mean_S w_i = 2, mean K * lr = 0.5: Delta^{t+1} = (0 - 2) / 0.5 = -4; w^{t+1} = 2 (FedAvg)
    strategy = FedCM(alpha=0.1)
    model = nn.Linear(1, 1, bias=False)
    nn.init.zeros_(model.weight)
    strategy.setup(model, 4)
    opt = strategy.configure_server_optimizer(list(model.parameters()))
    info = RoundInfo(0, [0, 1], [0, 1], 4, weight_totals={"weights": 30.0, "fedcm": 2.0})
    means = {"weights": {"weight": torch.tensor([[2.0]])}, "fedcm": {"steps_x_lr": torch.tensor(0.5)}}
    strategy.server_update(model, means, info)
    opt.step()
    torch.testing.assert_close(strategy.momentum["weight"], torch.tensor([[-4.0]]))
    torch.testing.assert_close(model.weight.detach(), torch.tensor([[2.0]]))
    agg = strategy.aggregator()  # K eta uniformly, the weights by sample count
    assert agg.weight("fedcm", {}, 7) == 1.0 and agg.weight("weights", {}, 7) == 7.0


def test_fedcm_sends_two_models_down_and_one_up(fit):
    module = make_module(FedCM(), clients_per_round=3)
    fit(module, rounds=2)
    model_bytes = sum(p.numel() * p.element_size() for p in module.client.parameters())
    assert [r.bytes_down for r in module.history] == [2 * 3 * model_bytes] * 2
    assert [r.bytes_up for r in module.history] == [3 * (model_bytes + 4)] * 2  # + K*lr, one float32


def test_server_direction_survives_a_resume(tmp_path):
    make = lambda: make_module(FedCM(alpha=0.5), participation=0.5, lr_decay=0.9)  # noqa: E731
    assert_resume_is_identical(tmp_path, make, client_state=False)


def test_bad_alpha_names_the_field():
    with pytest.raises(ConfigError, match="model.strategy.alpha"):
        FedCM(alpha=0.0)
