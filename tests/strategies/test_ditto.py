"""Ditto: the global model is FedAvg's, the personal model follows its proximal objective."""

import pytest
import torch
from drift_helpers import least_squares_module, single_client
from personal_helpers import personal_model

from fl_lightning.api.client import ClientModule
from fl_lightning.api.strategy import PERSONAL
from fl_lightning.engine.local import LocalConfig, train_client
from fl_lightning.errors import ConfigError
from fl_lightning.lightning.module import FederatedModule
from fl_lightning.models import LeNet
from fl_lightning.strategies import Ditto, FedAvg, Local
from fl_lightning.strategies.ditto import DITTO

from conftest import global_weights, make_module

W = "net.weight"


def _dropout_module(strategy):
    torch.manual_seed(0)
    net = LeNet(in_channels=1, widths=(4, 8), hidden=(16, 16), input_size=8, padding=2, dropout=0.5)
    return FederatedModule(client=ClientModule(net, lr=0.1, momentum=0.5), strategy=strategy, local_steps=3)


def test_global_model_is_bit_identical_to_fedavg(fit):
    plain, ditto = _dropout_module(FedAvg()), _dropout_module(Ditto(lam=0.75))
    fit(plain, rounds=2)
    fit(ditto, rounds=2)
    a, b = global_weights(plain), global_weights(ditto)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(k.startswith(DITTO) for k in ditto.store.get(0))


def test_two_personal_steps_by_hand():
    # F(v) = 1/2 mean_j (x_j . v - y_j)^2, full batch; w^t = 0, v_0 = (1, -1), lambda = 0.5, lr 0.1, K = 2
    x = torch.tensor([[1.0, 2.0], [0.5, -1.0], [2.0, 0.0]], dtype=torch.float64)
    y = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)
    lam, lr = 0.5, 0.1
    worker = least_squares_module(2, lr=lr)
    strategy = Ditto(lam=lam)
    strategy.setup(worker, 1)
    w_t = torch.zeros(1, 2, dtype=torch.float64)
    v = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    state = {DITTO + W: v.clone()}
    res = train_client(
        worker, strategy, {"weights": {W: w_t}}, state, single_client(x, y), 0, LocalConfig(3, local_steps=2)
    )

    def grad(w):
        return ((x @ w.T).squeeze(-1) - y) @ x / len(y)

    w = w_t.clone()
    for _ in range(2):  # both prox terms pull towards the received w^t, not the moving w_k
        v = v - lr * (grad(v) + lam * (v - w_t))
        w = w - lr * grad(w)
    torch.testing.assert_close(res.state[DITTO + W], v)
    torch.testing.assert_close(res.upload["weights"][W], w)  # the global model's local work: FedAvg's


def test_lambda_zero_personal_model_is_local_training(fit):
    ditto, local = make_module(Ditto(lam=0.0)), make_module(Local())
    fit(ditto, rounds=2)
    fit(local, rounds=2)
    for c in range(4):
        d, lo = ditto.store.get(c), local.store.get(c)
        for n in global_weights(local):
            torch.testing.assert_close(d[DITTO + n], lo[PERSONAL + n], rtol=0, atol=1e-6)


def test_deployed_model_is_the_personal_model(fit):
    module = make_module(Ditto())
    fit(module, rounds=2)
    glob = global_weights(module)
    deployed = {c: personal_model(module, c) for c in range(2)}
    for c, model in deployed.items():
        state = module.store.get(c)
        assert all(torch.equal(model[n], state[DITTO + n]) for n in glob)
        assert any(not torch.equal(model[n], glob[n]) for n in glob)
    assert any(not torch.equal(deployed[0][n], deployed[1][n]) for n in glob)
    assert "acc" in module.client_eval[0]


def test_bad_lambda_names_the_field():
    with pytest.raises(ConfigError, match="model.strategy.lam"):
        Ditto(lam=-1)
