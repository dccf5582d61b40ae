"""FedNova (Wang et al., NeurIPS 2020): ||a_i||_1 by hand and against torch's SGD, a round by hand, FedAvg
when the steps are equal, not when they differ, vectorised as sequential."""

import pytest
import torch
from torch import nn

from fl_lightning.__main__ import main
from fl_lightning.api import ClientModule, RoundInfo, RunSpec, Task
from fl_lightning.api.types import ClientContext
from fl_lightning.errors import ConfigError
from fl_lightning.functional.corrections import fednova_norm
from fl_lightning.strategies import FedAvg, FedNova, list_strategies
from fl_lightning.strategies.fednova import MOMENTUM, STEPS

from conftest import global_weights, make_data, make_module, make_trainer


def _sgd_norm(steps: int, momentum: float, mu: float, lr: float) -> float:
    """``sum_k a_k`` measured with torch's SGD: on ``f(x) = x + mu/2 (x - x0)^2`` every stochastic gradient
    ``g_k`` of the task part is 1, so ``(x0 - x_tau) / lr = sum_k a_k``."""
    x0 = torch.zeros((), dtype=torch.float64)
    x = nn.Parameter(x0.clone())
    opt = torch.optim.SGD([x], lr=lr, momentum=momentum)
    for _ in range(steps):
        opt.zero_grad()
        (x + mu / 2 * (x - x0) ** 2).backward()
        opt.step()
    return float((x0 - x.detach()) / lr)


@pytest.mark.parametrize("steps", [1, 2, 7, 30])
def test_norm_of_a_is_the_papers_closed_form_and_what_torchs_sgd_does(steps):
    rho, lr, mu = 0.9, 0.05, 0.4
    alpha = lr * mu
    assert fednova_norm(steps) == steps  # plain SGD: a = [1, ..., 1]
    momentum = (steps - rho * (1 - rho**steps) / (1 - rho)) / (1 - rho)
    assert fednova_norm(steps, momentum=rho) == pytest.approx(momentum, rel=1e-12)
    prox = (1 - (1 - alpha) ** steps) / alpha
    assert fednova_norm(steps, prox=alpha) == pytest.approx(prox, rel=1e-12)
    for m, p in [(0.0, 0.0), (rho, 0.0), (0.0, mu), (rho, mu), (0.5, mu)]:
        measured = _sgd_norm(steps, m, p, lr)
        assert fednova_norm(steps, momentum=m, prox=lr * p) == pytest.approx(measured, rel=1e-9), (m, p)


@pytest.mark.parametrize("rho", [0.0, 0.5])
def test_a_server_round_by_hand(rho):
    """x^t = (1, 1); client A (n=1, tau=2) moved by (1, 0), client B (n=3, tau=4) by (0, 2)."""
    model = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    strategy = FedNova()
    strategy.setup(model, 2)
    opt = strategy.configure_server_optimizer(list(model.parameters()))
    agg = strategy.aggregator()
    for cid, (n, tau, moved) in enumerate([(1, 2, [1.0, 0.0]), (3, 4, [0.0, 2.0])]):
        client = nn.Linear(2, 1, bias=False)
        with torch.no_grad():
            client.weight.copy_(torch.tensor([[1.0, 1.0]]) - torch.tensor([moved]))
        ctx = ClientContext(cid, 0, strategy.message(model, cid, 0), {}, n, tau, 0.1)
        ctx.scratch.update({STEPS: tau, MOMENTUM: rho})
        agg.add(strategy.upload(client, ctx), n, cid)
    info = RoundInfo(0, [0, 1], [0, 1], 2, agg.weight_totals)
    opt.zero_grad()
    strategy.server_update(model, agg.means(), info)
    opt.step()
    # by hand: ||a|| = tau (plain) or [tau - rho (1 - rho^tau)/(1 - rho)] / (1 - rho)
    a_A, a_B = (2.0, 4.0) if rho == 0 else ((2 - 0.5 * 0.75 / 0.5) / 0.5, (4 - 0.5 * 0.9375 / 0.5) / 0.5)
    assert (a_A, a_B) == ((2.0, 4.0) if rho == 0 else (2.5, 6.125))
    p_A, p_B = 0.25, 0.75
    tau_eff = p_A * a_A + p_B * a_B
    expected = torch.tensor([[1 - tau_eff * p_A * 1 / a_A, 1 - tau_eff * p_B * 2 / a_B]])
    torch.testing.assert_close(model.weight.detach(), expected, rtol=0, atol=1e-6)
    if rho == 0:  # (1 - 3.5 * 0.125, 1 - 3.5 * 0.375)
        hand = torch.tensor([[0.5625, -0.3125]])
        torch.testing.assert_close(model.weight.detach(), hand, rtol=0, atol=1e-6)


class Recording(FedNova):
    """FedNova that records each client's trained model, steps, momentum and lr at its upload."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.seen: dict[int, tuple[dict[str, torch.Tensor], int, float, float]] = {}

    def upload(self, module, ctx):
        weights = {n: t.detach().clone() for n, t in module.state_dict().items()}
        self.seen[ctx.client_id] = (weights, ctx.scratch[STEPS], ctx.scratch[MOMENTUM], ctx.lr)
        return super().upload(module, ctx)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_a_round_of_two_clients_with_their_own_steps_by_hand(tmp_path, momentum):
    """The engine counts the steps each client ran (one local epoch: more data, more steps) and the server
    step is x^t - tau_eff sum_i p_i (x^t - x_i) / ||a_i||_1 with the paper's ||a_i||_1."""
    strategy = Recording()
    module = make_module(strategy, local_steps=None, local_epochs=1, client_kw={"momentum": momentum})
    data = make_data(num_clients=2, batch_size=16)
    start = global_weights(module)
    make_trainer(tmp_path, rounds=1).fit(module, datamodule=data)
    clients = data.clients
    steps = {c: clients[c].steps_per_epoch(16) for c in (0, 1)}
    assert steps[0] != steps[1] and {c: strategy.seen[c][1] for c in (0, 1)} == steps
    n = {c: clients[c].num_samples for c in (0, 1)}
    p = {c: n[c] / (n[0] + n[1]) for c in (0, 1)}
    rho = momentum
    a = {c: (steps[c] - rho * (1 - rho ** steps[c]) / (1 - rho)) / (1 - rho) for c in n}  # tau_i if rho = 0
    assert all(strategy.seen[c][2] == rho for c in n)
    tau_eff = sum(p[c] * a[c] for c in n)
    end = global_weights(module)
    for name, x in start.items():
        if not x.is_floating_point():
            continue
        d = {c: (x.double() - strategy.seen[c][0][name].double()) / a[c] for c in n}
        expected = x.double() - tau_eff * sum(p[c] * d[c] for c in n)
        torch.testing.assert_close(end[name].double(), expected, rtol=0, atol=2e-6)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_equal_to_fedavg_when_every_client_takes_the_same_plain_sgd_steps(fit, momentum):
    kw = {"local_steps": 4, "client_kw": {"momentum": momentum}}
    a, b = make_module(FedAvg(), **kw), make_module(FedNova(), **kw)
    fit(a, rounds=3)
    fit(b, rounds=3)
    wa, wb = global_weights(a), global_weights(b)
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=1e-6)


def test_different_from_fedavg_when_the_steps_differ(fit):
    data = make_data(batch_size=16)
    data.setup("fit")
    assert len({c.steps_per_epoch(16) for c in data.clients}) > 1  # unequal data, one local epoch each
    kw = {"local_steps": None, "local_epochs": 1}
    a, b = make_module(FedAvg(), **kw), make_module(FedNova(), **kw)
    fit(a, data=make_data(batch_size=16), rounds=2)
    fit(b, data=make_data(batch_size=16), rounds=2)
    wa, wb = global_weights(a), global_weights(b)
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) > 1e-3


def test_vectorised_clients_equal_sequential_clients(tmp_path):
    """Unequal steps in one stacked group: each client's own step count, momentum and the proximal term."""

    def run(vectorize):
        module = make_module(
            FedNova(mu=0.1),
            local_steps=None,
            local_epochs=1,
            lr_decay=0.9,
            runtime={"vectorize": vectorize},
            client_kw={"momentum": 0.9, "weight_decay": 1e-3},
        )
        make_trainer(tmp_path / str(vectorize), rounds=2).fit(module, datamodule=make_data(batch_size=16))
        return module

    seq, vec = run(1), run(4)
    assert vec.engine.executor.counts["vectorised"] > 0 and not vec.engine.executor.notices
    wa, wb = global_weights(seq), global_weights(vec)
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=1e-5)


def test_registered_listed_and_refusing_a_local_optimizer_it_cannot_normalise(capsys):
    assert "FedNova" in list_strategies()
    main(["list", "strategies"])
    assert "FedNova" in capsys.readouterr().out
    spec = RunSpec(task=Task("multiclass"), num_classes=10, num_clients=4, input_shape=(1, 8, 8))
    FedNova().check(ClientModule(optimizer="sgd", momentum=0.9), spec)
    with pytest.raises(ConfigError, match="model.strategy=FedNova .* not of Adam; set model.client") as err:
        FedNova().check(ClientModule(optimizer="adam"), spec)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="model.strategy.mu"):
        FedNova(mu=-1.0)
