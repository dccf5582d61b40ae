"""FedDC: hand-computed local step, drift and variates; server drift over all N clients; exact optimum."""

import pytest
import torch
from drift_helpers import (
    assert_resume_is_identical,
    global_minimiser,
    heterogeneous_clients,
    least_squares_module,
    run_rounds,
    single_client,
)
from torch import nn

from fl_lightning.engine.local import LocalConfig, train_client
from fl_lightning.errors import ConfigError
from fl_lightning.strategies import FedDC, RoundInfo

from conftest import make_data, make_module

W = "net.weight"
F64 = {"dtype": torch.float64}


def test_local_steps_drift_and_variates_by_hand():
    # f(theta) = 1/2 (theta - 3)^2, w = 1, h_i = 0.2, c = 0.5, c_i = 0.2, alpha = 0.5, lr 0.1, K = 2
    strategy = FedDC(alpha=0.5)
    worker = least_squares_module(1, lr=0.1)
    strategy.setup(worker, 4)
    data = single_client(torch.ones(1, 1, **F64), torch.tensor([3.0], **F64))
    message = {"weights": {W: torch.tensor([[1.0]], **F64)}, "control": {W: torch.tensor([[0.5]], **F64)}}
    state = {"control/" + W: torch.tensor([[0.2]], **F64), "drift/" + W: torch.tensor([[0.2]], **F64)}
    res = train_client(worker, strategy, message, state, data, 0, LocalConfig(batch_size=1, local_steps=2))
    # grad = g + alpha (theta + h_i - w) + (c - c_i)
    # step 1: -2 + 0.1 + 0.3 = -1.6 -> 1.16;  step 2: -1.84 + 0.18 + 0.3 = -1.36 -> 1.296
    # h_i <- 0.2 + 0.296;  c_i+ = 0.2 - 0.5 - 0.296 / 0.2 = -1.78;  Delta c_i = -1.98
    torch.testing.assert_close(res.upload["weights"][W], torch.tensor([[1.296]], **F64))
    torch.testing.assert_close(res.state["drift/" + W], torch.tensor([[0.496]], **F64))
    torch.testing.assert_close(res.state["control/" + W], torch.tensor([[-1.78]], **F64))
    torch.testing.assert_close(res.upload["control"][W], torch.tensor([[-1.98]], **F64))


def test_server_step_by_hand():
    # N = 4, 2 aggregated, w = 0, uniform mean theta = 3 (sum of Delta theta = 6), H = 0.25, mean Delta c = 2
    strategy = FedDC(alpha=0.5)
    model = nn.Linear(1, 1, bias=False)
    nn.init.zeros_(model.weight)
    strategy.setup(model, 4)
    strategy.drift["weight"].fill_(0.25)
    opt = strategy.configure_server_optimizer(list(model.parameters()))
    info = RoundInfo(0, [0, 1], [0, 1], 4, weight_totals={"weights": 2.0, "control": 2.0})
    means = {"weights": {"weight": torch.tensor([[3.0]])}, "control": {"weight": torch.tensor([[2.0]])}}
    strategy.server_update(model, means, info)
    opt.step()
    torch.testing.assert_close(strategy.drift["weight"], torch.tensor([[1.75]]))  # H + 6/4
    torch.testing.assert_close(model.weight.detach(), torch.tensor([[4.75]]))  # mean theta + H
    torch.testing.assert_close(strategy.control["weight"], torch.tensor([[1.0]]))  # c + 2/4 * 2
    assert all(strategy.aggregator().weight(g, {}, 7) == 1.0 for g in ("weights", "control"))  # uniform


def test_server_drift_is_the_mean_of_all_client_drifts(fit):
    module = make_module(FedDC(alpha=0.3), participation=0.25, local_steps=3)
    fit(module, data=make_data(), rounds=3)
    store = module.store.state_dict()
    assert 0 < len(store) < 4
    for name, h in module.strategy.drift.items():
        total = sum(state["drift/" + name] for state in store.values())
        torch.testing.assert_close(h, total / 4, rtol=1e-5, atol=1e-7)


def test_convex_quadratics_reach_the_exact_global_minimiser():
    clients = heterogeneous_clients(num_clients=4, dim=5, rows=15)
    model, _ = run_rounds(FedDC(alpha=1.0), clients, 60, local_steps=10, lr=0.05)
    assert (model.net.weight.detach().reshape(-1) - global_minimiser(clients)).norm() < 1e-7


def test_feddc_communicates_two_models_each_way(fit):
    module = make_module(FedDC(), clients_per_round=3)
    fit(module, rounds=1)
    model_bytes = sum(p.numel() * p.element_size() for p in module.client.parameters())
    assert module.history[0].bytes_down == module.history[0].bytes_up == 2 * 3 * model_bytes


def test_drifts_and_variates_survive_a_resume(tmp_path):
    assert_resume_is_identical(tmp_path, lambda: make_module(FedDC(), participation=0.5, lr_decay=0.9))


def test_bad_alpha_names_the_field():
    with pytest.raises(ConfigError, match="model.strategy.alpha"):
        FedDC(alpha=-1.0)
