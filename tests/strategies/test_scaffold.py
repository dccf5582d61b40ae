"""SCAFFOLD: round 0 is FedAvg bit for bit; option-II variates by hand; c = mean of all c_i (decomposed
factors); 2x communication; resume."""

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

from fl_lightning import ClientModule, FederatedModule
from fl_lightning.engine.local import LocalConfig, train_client
from fl_lightning.engine.system import RoundPolicy, Stragglers
from fl_lightning.errors import ConfigError
from fl_lightning.functional.sampling import sample_clients
from fl_lightning.models import Decomposed, LeNet
from fl_lightning.strategies import FedAvg, RoundInfo, Scaffold
from fl_lightning.strategies import scaffold as scaffold_module

from conftest import global_weights, make_data, make_engine, make_module

W = "net.weight"


def _equal(a, b):
    wa, wb = global_weights(a), global_weights(b)
    return all(torch.equal(wa[k], wb[k]) for k in wa)


def test_first_round_with_zero_variates_is_fedavg_bit_for_bit(fit):
    a = make_module(FedAvg(), clients_per_round=3, local_steps=3)
    b = make_module(Scaffold(), clients_per_round=3, local_steps=3)
    fit(a, rounds=1)
    fit(b, rounds=1)
    assert _equal(a, b)
    assert any(v.abs().max() > 0 for _, v in b.strategy.control.items())  # c moved after round 0
    a2 = make_module(FedAvg(), clients_per_round=3, local_steps=3)
    b2 = make_module(Scaffold(), clients_per_round=3, local_steps=3)
    fit(a2, rounds=2)  # from round 1 on the variates correct the steps
    fit(b2, rounds=2)
    assert not _equal(a2, b2)


def test_option_two_control_variates_by_hand():
    # f(w) = 1/2 (w - 3)^2, x = 1, c = 0.5, c_i = 0.2, lr 0.1, K = 2: y <- y - lr (g + c - c_i)
    strategy = Scaffold()
    worker = least_squares_module(1, lr=0.1)
    strategy.setup(worker, 4)
    f64 = {"dtype": torch.float64}
    data = single_client(torch.ones(1, 1, **f64), torch.tensor([3.0], **f64))
    message = {"weights": {W: torch.tensor([[1.0]], **f64)}, "control": {W: torch.tensor([[0.5]], **f64)}}
    state = {"control/" + W: torch.tensor([[0.2]], **f64)}
    res = train_client(worker, strategy, message, state, data, 0, LocalConfig(batch_size=1, local_steps=2))
    # y1 = 1 - 0.1 (-2 + 0.3) = 1.17;  y2 = 1.17 - 0.1 (-1.83 + 0.3) = 1.323
    # c_i+ = c_i - c + (x - y2) / (K lr) = 0.2 - 0.5 - 0.323 / 0.2 = -1.915;  Delta c_i = -2.115
    torch.testing.assert_close(res.upload["weights"][W], torch.tensor([[1.323]], **f64))
    torch.testing.assert_close(res.state["control/" + W], torch.tensor([[-1.915]], **f64))
    torch.testing.assert_close(res.upload["control"][W], torch.tensor([[-2.115]], **f64))


def test_with_momentum_the_variate_is_the_mean_local_gradient_by_hand():
    # As above with heavy-ball momentum 0.9 (buffers b): option II's (x - y)/(K lr) would be 0.476/0.2 = 2.38,
    # not the mean corrected gradient 1.615; the variate is the mean raw gradient (-2 - 1.83)/2 = -1.915.
    strategy = Scaffold()
    worker = least_squares_module(1, lr=0.1)
    worker.momentum = 0.9
    strategy.setup(worker, 4)
    f64 = {"dtype": torch.float64}
    data = single_client(torch.ones(1, 1, **f64), torch.tensor([3.0], **f64))
    message = {"weights": {W: torch.tensor([[1.0]], **f64)}, "control": {W: torch.tensor([[0.5]], **f64)}}
    state = {"control/" + W: torch.tensor([[0.2]], **f64)}
    res = train_client(worker, strategy, message, state, data, 0, LocalConfig(batch_size=1, local_steps=2))
    # b1 = -2 + 0.3 = -1.7, y1 = 1.17;  b2 = 0.9 b1 + (-1.83 + 0.3) = -3.06, y2 = 1.17 + 0.306 = 1.476
    torch.testing.assert_close(res.upload["weights"][W], torch.tensor([[1.476]], **f64))
    torch.testing.assert_close(res.state["control/" + W], torch.tensor([[-1.915]], **f64))
    torch.testing.assert_close(res.upload["control"][W], torch.tensor([[-2.115]], **f64))


@pytest.mark.parametrize(
    ("variate", "correction", "y2", "c_new"),
    [
        # b1 = -2 + 0.3 = -1.7, y1 = 1.085;  b2 = 0.9 b1 + (-1.915 + 0.3) = -3.145, y2 = 1.085 + 0.15725
        ("mean_gradient", "in_gradient", 1.24225, -1.9575),  # (g1 + g2) / 2 = (-2 - 1.915) / 2
        ("option_ii", "in_gradient", 1.24225, -2.7225),  # 0.2 - 0.5 + (1 - 1.24225) / (2 * 0.05)
        # NIID-Bench: b1 = -2, y1 = 1.1 - 0.05 * 0.3 = 1.085;  b2 = 0.9 b1 - 1.915 = -3.715,
        # y2 = 1.085 + 0.18575 - 0.015 = 1.25575
        ("option_ii", "after_step", 1.25575, -2.8575),  # 0.2 - 0.5 + (1 - 1.25575) / (2 * 0.05)
        ("mean_gradient", "after_step", 1.25575, -1.9575),
    ],
)
def test_variates_and_corrections_under_momentum_and_lr_decay_by_hand(variate, correction, y2, c_new):
    # f(w) = 1/2 (w - 3)^2, x = 1, c = 0.5, c_i = 0.2, momentum 0.9, K = 2, round 1 with lr 0.1 and
    # lr_decay 0.5: eta_l = 0.05 in the steps and in option II; g1 = -2, g2 = y1 - 3 = -1.915
    strategy = Scaffold(variate=variate, correction=correction)
    worker = least_squares_module(1, lr=0.1)
    worker.momentum = 0.9
    strategy.setup(worker, 4)
    f64 = {"dtype": torch.float64}
    data = single_client(torch.ones(1, 1, **f64), torch.tensor([3.0], **f64))
    message = {"weights": {W: torch.tensor([[1.0]], **f64)}, "control": {W: torch.tensor([[0.5]], **f64)}}
    state = {"control/" + W: torch.tensor([[0.2]], **f64)}
    config = LocalConfig(batch_size=1, local_steps=2, lr_decay=0.5)
    res = train_client(worker, strategy, message, state, data, 1, config)
    torch.testing.assert_close(res.upload["weights"][W], torch.tensor([[y2]], **f64))
    torch.testing.assert_close(res.state["control/" + W], torch.tensor([[c_new]], **f64))
    torch.testing.assert_close(res.upload["control"][W], torch.tensor([[c_new - 0.2]], **f64))


def test_option_two_is_the_mean_raw_gradient_under_plain_sgd(monkeypatch):
    # Plain SGD with weight decay 0, 3 steps on 2-row batches of a 3-d least squares, random c and c_i: option
    # II's closed form equals the running mean of the raw gradients (forced by calling every optimizer "not
    # plain SGD"), with either placement of the correction.
    g = torch.Generator().manual_seed(1)
    f64 = {"dtype": torch.float64}
    x, y = torch.randn(6, 3, generator=g, **f64), torch.randn(6, generator=g, **f64)
    message = {
        "weights": {W: torch.randn(1, 3, generator=g, **f64)},
        "control": {W: torch.randn(1, 3, generator=g, **f64)},
    }
    state = {"control/" + W: torch.randn(1, 3, generator=g, **f64)}

    def variate(strategy, forced):
        if forced:
            monkeypatch.setattr(scaffold_module, "plain_sgd", lambda optimizer: False)
        worker = least_squares_module(3, lr=0.1)
        strategy.setup(worker, 4)
        config = LocalConfig(batch_size=2, local_steps=3, lr_decay=0.9)
        res = train_client(worker, strategy, message, dict(state), single_client(x, y), 2, config)
        monkeypatch.undo()
        return res.state["control/" + W]

    for correction in ("in_gradient", "after_step"):
        closed = variate(Scaffold(variate="option_ii", correction=correction), forced=False)
        mean = variate(Scaffold(variate="mean_gradient", correction=correction), forced=True)
        assert not torch.equal(closed, state["control/" + W])
        torch.testing.assert_close(closed, mean, rtol=1e-12, atol=1e-12)


def test_the_held_plain_sgd_runs_are_unchanged_by_the_choice_of_variate(fit):
    # Under plain SGD both variates are option II's closed form: the runs are bit-identical (the parity held
    # for plain SGD keeps its meaning whatever the recipe chooses).
    a = make_module(Scaffold(), clients_per_round=3, local_steps=3)
    b = make_module(Scaffold(variate="option_ii"), clients_per_round=3, local_steps=3)
    fit(a, rounds=3)
    fit(b, rounds=3)
    assert _equal(a, b)
    ca, cb = a.strategy.control.as_dict(), b.strategy.control.as_dict()
    assert all(torch.equal(ca[k], cb[k]) for k in ca)


def test_option_two_divides_by_the_steps_each_client_ran_under_partial_work():
    # FedProx's stragglers with policy partial and K = 6: half the clients run U{1..5} steps. In round 0
    # (c = c_i = 0) option II is c_i+ = (x - y_i) / (K_i eta_l), K_i the steps the round's record says client
    # i ran.
    seen = {}

    class Seen(Scaffold):
        vectorizable = Scaffold.vectorizable

        def upload(self, module, ctx):
            y = {n: p.detach().clone() for n, p in module.named_parameters()}
            payload = super().upload(module, ctx)
            seen[ctx.client_id] = (y, {n: ctx.state["control/" + n].clone() for n in y}, ctx.lr)
            return payload

    strategy = Seen(variate="option_ii", correction="after_step")
    system, policy = Stragglers(fraction=0.5), RoundPolicy(policy="partial")
    engine = make_engine(strategy, num_clients=4, local_steps=6, system=system, round_policy=policy)
    x = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
    engine.run_round(0)
    steps = engine.history[0].client_steps
    assert sorted(steps) == sorted(seen) and min(steps.values()) < 6 == max(steps.values())
    for cid, (y, control, lr) in seen.items():
        for n in x:
            torch.testing.assert_close(control[n], (x[n] - y[n]) / (steps[cid] * lr), msg=f"{cid} {n}")


def test_unknown_choices_are_one_line():
    with pytest.raises(ConfigError, match=r"^model\.strategy\.variate='option_i' must be one of mean_grad"):
        Scaffold(variate="option_i")
    with pytest.raises(ConfigError, match=r"^model\.strategy\.correction='x' must be one of in_gradient"):
        Scaffold(correction="x")


def test_server_control_update_by_hand():
    # N = 4 clients, 2 aggregated with Delta c = 1 and 3 (uniform mean 2): c <- c + 2/4 * 2 = c + 1
    strategy = Scaffold()
    model = nn.Linear(1, 1, bias=False)
    nn.init.zeros_(model.weight)
    strategy.setup(model, 4)
    strategy.control["weight"].fill_(0.5)
    opt = strategy.configure_server_optimizer(list(model.parameters()))
    info = RoundInfo(0, [0, 1], [0, 1], 4, weight_totals={"weights": 30.0, "control": 2.0})
    means = {"weights": {"weight": torch.tensor([[2.0]])}, "control": {"weight": torch.tensor([[2.0]])}}
    strategy.server_update(model, means, info)
    opt.step()
    torch.testing.assert_close(strategy.control["weight"], torch.tensor([[1.5]]))
    torch.testing.assert_close(model.weight.detach(), torch.tensor([[2.0]]))  # x + mean(y_i - x)
    agg = strategy.aggregator()  # c's updates uniformly, x by sample count
    assert agg.weight("control", {}, 7) == 1.0 and agg.weight("weights", {}, 7) == 7.0


def test_decomposed_factors_keep_c_the_mean_of_all_client_variates(fit):
    # Alg. 1 line 17 with every c_i zero at the start keeps c = (1/N) sum_i c_i. The atoms and
    # coefficients of a decomposed network are separate parameters, each with its own variates: the
    # invariant holds for them too, with partial participation (a client sampled twice uploads
    # Delta c_i = c_i+ - c_i; one never sampled has c_i = 0).
    torch.manual_seed(0)
    lenet = LeNet(
        in_channels=1, num_classes=10, widths=[4, 8], hidden=[16, 8], dropout=0.3, input_size=8, padding=2
    )
    client = ClientModule(Decomposed(lenet, num_atoms=3), lr=0.03, momentum=0.0)
    module = FederatedModule(client=client, strategy=Scaffold(), participation=0.25, local_steps=3)
    num_clients = 8
    fit(module, make_data(num_clients=num_clients), rounds=4)  # 4 x 2 draws of 8 clients
    control = module.strategy.control.as_dict()
    assert any(n.endswith(".atoms") for n in control) and any(n.endswith(".coefficients") for n in control)
    draws = [sample_clients(num_clients, 2, 0, r) for r in range(4)]
    sampled = [c for d in draws for c in d]
    assert len(set(sampled)) < len(sampled) and len(set(sampled)) < num_clients  # repeats and never-sampled
    states = [module.store.get(i) for i in range(num_clients)]
    assert {i for i, s in enumerate(states) if s} == set(sampled)
    for name, c in control.items():
        assert c.abs().max() > 0, name
        mean = sum(s.get("control/" + name, torch.zeros_like(c)) for s in states) / num_clients
        torch.testing.assert_close(c, mean, rtol=1e-5, atol=1e-7, msg=name)


def test_scaffold_communicates_two_models_each_way(fit):
    module = make_module(Scaffold(), clients_per_round=3)
    fit(module, rounds=2)
    model_bytes = sum(p.numel() * p.element_size() for p in module.client.parameters())
    assert [r.bytes_down for r in module.history] == [2 * 3 * model_bytes] * 2
    assert [r.bytes_up for r in module.history] == [2 * 3 * model_bytes] * 2


def test_convex_quadratics_reach_the_exact_global_minimiser():
    clients = heterogeneous_clients(num_clients=4, dim=5, rows=15)
    model, _ = run_rounds(Scaffold(), clients, 80, local_steps=10, lr=0.05)
    assert (model.net.weight.detach().reshape(-1) - global_minimiser(clients)).norm() < 1e-7


@pytest.mark.parametrize("niid_bench", [False, True])
def test_control_variates_survive_a_resume(tmp_path, niid_bench):
    # NIID-Bench's way (option II after the step, under momentum) keeps the same state: one c_i per parameter
    kw = {"variate": "option_ii", "correction": "after_step"} if niid_bench else {}
    client_kw = {"momentum": 0.9} if niid_bench else {}
    assert_resume_is_identical(
        tmp_path,
        lambda: make_module(Scaffold(**kw), participation=0.5, lr_decay=0.9, client_kw=client_kw),
    )


def test_the_checkpointed_state_has_one_variate_per_parameter_whatever_the_choice(fit):
    for kw in ({}, {"variate": "option_ii", "correction": "after_step"}):
        module = make_module(Scaffold(**kw), participation=0.5, client_kw={"momentum": 0.9})
        fit(module, rounds=2)
        params = {n: p.shape for n, p in module.client.named_parameters()}
        assert {n: c.shape for n, c in module.strategy.control.items()} == params
        expected = {"control/" + n: shape for n, shape in params.items()}
        states = [module.store.get(i) for i in range(module.strategy.num_clients)]
        assert any(states)
        assert all({k: v.shape for k, v in s.items()} == expected for s in states if s)
