"""Per-FedAvg: the MAML-type local step (FO and HF) and the one-step adaptation, by hand on least squares."""

import pytest
import torch
from drift_helpers import least_squares_module, single_client

from fl_lightning.engine.local import LocalConfig, local_training, train_client
from fl_lightning.errors import ConfigError
from fl_lightning.strategies import PerFedAvg

W = "net.weight"
X = torch.tensor([[1.0, 2.0], [0.5, -1.0], [2.0, 0.0]], dtype=torch.float64)
Y = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)
H = X.T @ X / len(Y)  # the Hessian of f(w) = 1/2 mean_j (x_j . w - y_j)^2


def grad(w):
    return ((X @ w.T).squeeze(-1) - Y) @ X / len(Y)


@pytest.mark.parametrize("variant", ["FO", "HF"])
def test_two_local_steps_by_hand(variant):
    # full batches (D, D', D'' all hold the client's 3 rows), alpha 0.2, beta = the client's lr 0.1, K = 2
    alpha, beta = 0.2, 0.1
    worker = least_squares_module(2, lr=beta)
    w = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    res = train_client(
        worker,
        PerFedAvg(alpha=alpha, variant=variant),
        {"weights": {W: w}},
        {},
        single_client(X, Y),
        0,
        LocalConfig(3, local_steps=2),
    )
    for _ in range(2):
        g = grad(w - alpha * grad(w))
        if variant == "HF":
            g = g - alpha * g @ H  # (I - alpha H) g, H symmetric
        w = w - beta * g
    torch.testing.assert_close(res.upload["weights"][W], w)


def test_hf_differs_from_fo():
    ups = {}
    for variant in ("FO", "HF"):
        worker = least_squares_module(2, lr=0.1)
        w = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
        res = train_client(
            worker,
            PerFedAvg(alpha=0.5, variant=variant),
            {"weights": {W: w}},
            {},
            single_client(X, Y),
            0,
            LocalConfig(3, local_steps=1),
        )
        ups[variant] = res.upload["weights"][W]
    assert not torch.allclose(ups["FO"], ups["HF"])


def test_the_deployed_model_is_one_step_of_size_alpha():
    worker = least_squares_module(2, lr=0.1, w0=torch.tensor([1.0, -1.0], dtype=torch.float64))
    w = worker.net.weight.detach().clone()
    PerFedAvg(alpha=0.3).adapt(worker, single_client(X, Y), {}, local_training(LocalConfig(3)))
    torch.testing.assert_close(worker.net.weight.detach(), w - 0.3 * grad(w))


@pytest.mark.parametrize(
    ("kw", "field"), [({"alpha": 0.0}, "alpha"), ({"variant": "SO"}, "variant"), ({"delta": -1.0}, "delta")]
)
def test_bad_arguments_name_the_field(kw, field):
    with pytest.raises(ConfigError, match=rf"^model\.strategy\.{field}=") as err:
        PerFedAvg(**kw)
    assert "\n" not in str(err.value)
