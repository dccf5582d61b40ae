"""FedDyn: hand-computed local step and duals, the server dual over all m clients, exact convex optimum."""

import pytest
import torch
from drift_helpers import (
    assert_resume_is_identical,
    client_gradient,
    global_minimiser,
    heterogeneous_clients,
    least_squares_module,
    run_rounds,
    single_client,
)
from torch import nn

from fl_lightning.engine.local import LocalConfig, train_client
from fl_lightning.errors import ConfigError
from fl_lightning.strategies import FedAvg, FedDyn, RoundInfo

from conftest import make_data, make_module

W = "net.weight"


def test_local_steps_and_client_dual_by_hand():
    # f(w) = 1/2 (w - 3)^2; w^t = 1, lambda_i = 0.4, alpha = 0.5, lr 0.1, K = 2
    strategy = FedDyn(alpha=0.5)
    worker = least_squares_module(1, lr=0.1)
    strategy.setup(worker, 4)
    data = single_client(torch.ones(1, 1, dtype=torch.float64), torch.tensor([3.0], dtype=torch.float64))
    message = {"weights": {W: torch.tensor([[1.0]], dtype=torch.float64)}}
    state = {"dual/" + W: torch.tensor([[0.4]], dtype=torch.float64)}
    res = train_client(worker, strategy, message, state, data, 0, LocalConfig(batch_size=1, local_steps=2))
    # step 1: g - lambda + alpha (w - w^t) = -2 - 0.4 + 0 = -2.4 -> 1.24
    # step 2: -1.76 - 0.4 + 0.5 * 0.24 = -2.04 -> 1.444;  lambda <- 0.4 - 0.5 * 0.444 = 0.178
    torch.testing.assert_close(res.upload["weights"][W], torch.tensor([[1.444]], dtype=torch.float64))
    torch.testing.assert_close(res.state["dual/" + W], torch.tensor([[0.178]], dtype=torch.float64))
    assert set(res.upload) == {"weights"}  # one model up


def test_server_step_by_hand_divides_the_dual_by_all_clients():
    # round 0, m = 4 clients, 2 aggregated: w^0 = 0, uploads 2 and 4 (uniform mean 3), alpha = 0.5
    strategy = FedDyn(alpha=0.5)
    model = nn.Linear(1, 1, bias=False)
    nn.init.zeros_(model.weight)
    strategy.setup(model, 4)
    opt = strategy.configure_server_optimizer(list(model.parameters()))
    info = RoundInfo(0, [0, 1], [0, 1], 4, weight_totals={"weights": 2.0})
    strategy.server_update(model, {"weights": {"weight": torch.tensor([[3.0]])}}, info)
    opt.step()
    # h = 0 - 0.5/4 * (2 + 4) = -0.75;  w^1 = 3 - h/alpha = 3 + 1.5 = 4.5  (= w^0 + mean + sum/m, spec P6)
    torch.testing.assert_close(strategy.h["weight"], torch.tensor([[-0.75]]))
    torch.testing.assert_close(model.weight.detach(), torch.tensor([[4.5]]))
    assert strategy.aggregator().weight("weights", {}, 7) == 1.0  # uniform


def test_server_dual_is_the_mean_of_all_client_duals(fit):
    module = make_module(FedDyn(alpha=0.3), participation=0.25, local_steps=3)  # 1 of 4 clients per round
    data = make_data()
    fit(module, data=data, rounds=3)
    store = module.store.state_dict()
    assert 0 < len(store) < 4  # some clients were never sampled: they count as lambda_j = 0
    h = module.strategy.h
    for name in h:
        total = sum(state["dual/" + name] for state in store.values())
        torch.testing.assert_close(h[name], total / 4, rtol=1e-5, atol=1e-7)
        assert h[name].abs().max() > 0


@pytest.mark.parametrize("participation,alpha,rounds", [(1.0, 1.0, 60), (0.5, 3.0, 100)])
def test_convex_quadratics_reach_the_exact_global_minimiser(participation, alpha, rounds):
    # spec P12: deterministic strongly convex f_i with different minimisers, K = 10 > 1 local steps
    clients = heterogeneous_clients(num_clients=4, dim=5, rows=15)
    w_star = global_minimiser(clients)
    model, store = run_rounds(
        FedDyn(alpha=alpha), clients, rounds, local_steps=10, lr=0.05, participation=participation
    )
    w = model.net.weight.detach().reshape(-1)
    assert (w - w_star).norm() < 1e-7
    if participation == 1.0:  # lambda_i -> grad f_i(w*), mean_i lambda_i -> 0
        for i, client in enumerate(clients):
            lam = store.get(i)["dual/" + W].reshape(-1)
            assert (lam - client_gradient(client, w_star)).norm() < 1e-6
    fedavg, _ = run_rounds(FedAvg(), clients, 20, local_steps=10, lr=0.05)
    assert (fedavg.net.weight.detach().reshape(-1) - w_star).norm() > 0.1  # FedAvg's client-drift bias


def test_feddyn_communicates_one_model_each_way(fit):
    module = make_module(FedDyn(), clients_per_round=2)
    fit(module, rounds=1)
    model_bytes = sum(p.numel() * p.element_size() for p in module.client.parameters())
    assert module.history[0].bytes_down == module.history[0].bytes_up == 2 * model_bytes


def test_duals_and_server_state_survive_a_resume(tmp_path):
    assert_resume_is_identical(
        tmp_path, lambda: make_module(FedDyn(alpha=0.2), participation=0.5, lr_decay=0.9)
    )


def test_bad_alpha_names_the_field():
    with pytest.raises(ConfigError, match="model.strategy.alpha"):
        FedDyn(alpha=0.0)
