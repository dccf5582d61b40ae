"""FedExP: the extrapolated server step by hand, and its 4-byte upload."""

import pytest
import torch
from torch import nn

from fl_lightning.engine import RoundListener
from fl_lightning.errors import ConfigError
from fl_lightning.strategies import FedExP, RoundInfo
from fl_lightning.strategies.fedexp import extrapolation_step

from conftest import make_engine


def test_step_size_formula():
    assert extrapolation_step(10.0, 1.0, 0.0) == pytest.approx(5.0)
    assert extrapolation_step(1.0, 1.0, 0.0) == 1.0  # identical clients: ratio 1/2, clipped to 1
    assert extrapolation_step(4.0, 0.0, 1e-3) == pytest.approx(4.0 / 2e-3)


def test_server_extrapolates_the_average_update():
    model = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 1.0]]))
    strategy = FedExP(eps=1e-3)
    strategy.setup(model, 2)
    opt = strategy.configure_server_optimizer(list(model.parameters()))
    # two equally weighted clients move by +(1, 0) and by (-1, 1): mean update (0, 0.5)
    w1, w2 = torch.tensor([[2.0, 1.0]]), torch.tensor([[0.0, 2.0]])
    sq = (1.0 + 2.0) / 2  # mean of ||Delta_k||^2
    means = {"weights": {"weight": (w1 + w2) / 2}, "fedexp": {"sq_norm": torch.tensor(sq)}}
    strategy.server_update(model, means, RoundInfo(0, [0, 1], [0, 1], 2))
    opt.step()
    eta = sq / (2 * (0.25 + 1e-3))
    assert float(strategy.step_size) == pytest.approx(eta)
    torch.testing.assert_close(model.weight, torch.tensor([[1.0, 1.0 + 0.5 * eta]]))


class Uploads(RoundListener):
    """Keeps a copy of every client's upload and sample count (an upload may alias the worker)."""

    def __init__(self):
        self.seen = []

    def client_end(self, round, index, total, result):
        up = {g: {n: t.detach().clone() for n, t in ts.items()} for g, ts in result.upload.items()}
        self.seen.append((up, result.num_samples))


def test_clients_upload_their_squared_update_norm():
    # mini-batches of 2: the clients' updates disagree, so the step extrapolates (eta > 1)
    engine = make_engine(FedExP(eps=1e-3), num_clients=4, batch_size=2)
    start = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
    uploads = Uploads()
    outcome = engine.run_round(0, listener=uploads)
    assert outcome.result.failed == [] and len(uploads.seen) == 4
    total = sum(n for _, n in uploads.seen)
    mean_sq, mean_delta = 0.0, {n: torch.zeros_like(t) for n, t in start.items()}
    for up, n in uploads.seen:
        delta = {k: start[k] - up["weights"][k] for k in start}
        sq = sum(float(d.double().pow(2).sum()) for d in delta.values())  # ||w^t - w_k||^2, parameters
        assert float(up["fedexp"]["sq_norm"]) == pytest.approx(sq, rel=1e-5)
        assert sq > 0
        mean_sq += n / total * sq
        for k in start:
            mean_delta[k] += n / total * delta[k]
    sq_of_mean = sum(float(d.double().pow(2).sum()) for d in mean_delta.values())
    eta = max(1.0, mean_sq / (2 * (sq_of_mean + 1e-3)))  # Alg. 1, eq. 9, from the uploads by hand
    assert eta > 1.0  # the clients disagree: the step extrapolates
    assert float(engine.strategy.step_size) == pytest.approx(eta, rel=1e-5)
    for n, p in engine.model.named_parameters():  # w^{t+1} = w^t - eta * mean Delta
        torch.testing.assert_close(p.detach(), start[n] - eta * mean_delta[n], rtol=1e-4, atol=1e-6)
    model_bytes = sum(t.numel() * 4 for t in start.values())
    assert engine.history[0].bytes_up == 4 * (model_bytes + 4)


def test_bad_eps_names_the_field():
    with pytest.raises(ConfigError, match="model.strategy.eps"):
        FedExP(eps=0)
