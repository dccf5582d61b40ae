"""TDPFed (Wang et al.): round protocol, factor step, AFM/ACT server updates, bytes, personalisation."""

import copy
import itertools

import pytest
import torch
from torch.func import functional_call
from torch.optim.optimizer import register_optimizer_step_post_hook

from fl_lightning.api.client import ClientModule
from fl_lightning.api.strategy import Strategy
from fl_lightning.api.types import ClientContext
from fl_lightning.data import FederatedDataModule, Pathological
from fl_lightning.engine.round import num_sampled, sample_clients
from fl_lightning.errors import ConfigError
from fl_lightning.functional.cp import act_tensor, afm, cp_als, cp_factor_grads, cp_reconstruct
from fl_lightning.functional.tensor import load_tensors, payload_bytes, shared_state
from fl_lightning.lightning.module import FederatedModule
from fl_lightning.models import DNN
from fl_lightning.models.cp import cp_layers, dense_weights
from fl_lightning.strategies import FedAvg, PFedMe, RoundInfo, TDPFed
from fl_lightning.strategies.mixins.moreau import SCRATCH, THETA, fit_loss

from conftest import global_weights


def cp_client(optimizer="adam", lr=1e-2, hidden=12, in_features=64, ratio=2.0):
    torch.manual_seed(0)
    return ClientModule(
        DNN(in_features=in_features, hidden=hidden, ratio=ratio), optimizer=optimizer, lr=lr, momentum=0.0
    )


def batches(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(10, 1, 8, 8, generator=g), torch.randint(0, 10, (10,), generator=g)) for _ in range(n)
    ]


def run_client(strategy, model, data, state=None):
    """One client's round through the strategy hooks, as the loop runs it; returns (ctx, upload, worker)."""
    worker = copy.deepcopy(model)
    message = strategy.message(model, 0, 0)
    load_tensors(worker, message["weights"])
    ctx = ClientContext(0, 0, message, dict(state or {}), 100, len(data), 0.0)
    strategy.on_client_start(worker, ctx)
    opt = strategy.configure_client_optimizer(worker, ctx)
    ctx.lr = opt.param_groups[0]["lr"]
    for b in data:
        strategy.local_step(worker, opt, ctx, b, None)
    return ctx, strategy.upload(worker, ctx), worker


def fed_data(**kw):
    args = {"num_clients": 4, "partition": Pathological(classes_per_client=2), "batch_size": 20}
    args.update(kw)
    return FederatedDataModule(**args)


def test_round_reset_starts_from_the_global_factors_and_their_reconstruction():
    model = cp_client()
    strategy = TDPFed()
    strategy.setup(model, 1)
    worker = copy.deepcopy(model)
    load_tensors(worker, strategy.message(model, 0, 0)["weights"])
    stale = {THETA + n: torch.randn_like(t) for n, t in dense_weights(model).items()}
    ctx = ClientContext(0, 3, strategy.message(model, 0, 3), stale, 10, 1, 0.01)
    strategy.on_client_start(worker, ctx)
    theta = ctx.scratch[SCRATCH].theta
    recon = {n: t.detach() for n, t in dense_weights(model).items()}
    assert all(torch.equal(theta[n].detach(), recon[n]) for n in recon)
    assert all(torch.equal(a, b) for a, b in zip(worker.state_dict().values(), model.state_dict().values()))


def test_theta_steps_then_factor_steps_tau_times():
    counts = {"SGD": 0, "Adam": 0}

    def hook(opt, args, kwargs):
        counts[type(opt).__name__] += 1

    model = cp_client()
    strategy = TDPFed(personal_steps=3, factor_steps=4)
    strategy.setup(model, 1)
    handle = register_optimizer_step_post_hook(hook)
    try:
        run_client(strategy, model, batches(5))
    finally:
        handle.remove()
    assert counts == {"SGD": 5 * 3, "Adam": 5 * 4}  # tau*s theta steps, tau*s' factor steps


def test_factor_step_is_the_closed_form_gradient_step_on_theta():
    model = cp_client(optimizer="sgd", lr=0.01)
    strategy = TDPFed(lam=3.0, factor_steps=1)
    strategy.setup(model, 1)
    ctx, _, worker = run_client(strategy, model, batches(1))
    # replay: theta~ from the client, factors of the global model, one SGD step of lr 0.01
    theta = ctx.state[THETA + "net.fc1.dense_weight"]
    a = [f.detach() for f in cp_layers(model)["net.fc1"].factors]
    expected = [f - 0.01 * g for f, g in zip(a, cp_factor_grads(theta, a, 3.0))]
    for f, e in zip(cp_layers(worker)["net.fc1"].factors, expected):
        torch.testing.assert_close(f.detach(), e, rtol=1e-5, atol=1e-7)


def test_factor_update_does_not_depend_on_the_batch():
    strategy, worker, ctx, personal = factor_fit_setup(factor_steps=5)
    with torch.no_grad():
        for t in personal.theta.values():
            t.add_(0.1 * torch.randn_like(t))
    results = []
    for _ in range(2):
        w = copy.deepcopy(worker)
        w.forward = None  # any data pass would fail
        opt = w.configure_optimizers()
        view = type(personal.view)(w)
        strategy.outer_step(w, opt, ctx, type(personal)(personal.theta, view))
        results.append(shared_state(w))
    assert all(torch.equal(results[0][n], results[1][n]) for n in results[0])
    assert any(not torch.equal(results[0][n], shared_state(worker)[n]) for n in results[0])


def test_lambda_zero_leaves_the_global_model_unchanged_and_trains_theta(fit):
    module = FederatedModule(client=cp_client(), strategy=TDPFed(lam=0.0, beta=1.7), local_steps=2)
    start = global_weights(module)
    fit(module, data=fed_data(num_clients=2), rounds=1)
    end = global_weights(module)
    assert all(torch.equal(start[k], end[k]) for k in start)
    theta = {k: v for k, v in module.store.get(0).items() if k.startswith(THETA)}
    assert theta and any(
        not torch.equal(v, dense_weights(module.client)[k[len(THETA) :]]) for k, v in theta.items()
    )


def make_upload(model, seed):
    torch.manual_seed(seed)
    return {"weights": {n: t + 0.1 * torch.randn_like(t) for n, t in shared_state(model).items()}}


def server_round(strategy, model, uploads, sizes):
    agg = strategy.aggregator()
    for up, n in zip(uploads, sizes):
        agg.add(up, n)
    opt = strategy.configure_server_optimizer(list(model.parameters()))
    opt.zero_grad()
    strategy.server_update(model, agg.means(), RoundInfo(0, [0, 1], [0, 1], 2))
    opt.step()


def factors_of(payload, name, n=2):
    return [payload[f"{name}.factors.{i}"] for i in range(n)]


def test_afm_server_update_is_eq_20_with_batch_weights():
    model = cp_client()
    strategy = TDPFed(beta=1.4)
    strategy.setup(model, 2)
    before = {n: t.detach().clone() for n, t in shared_state(model).items()}
    ups = [make_upload(model, 1), make_upload(model, 2)]
    server_round(strategy, model, ups, [30, 10])  # |D_k| differ; |B_k| equal: uniform weights
    for name in ("net.fc1", "net.fc2"):
        expected = afm(factors_of(before, name), [factors_of(u["weights"], name) for u in ups], [20, 20], 1.4)
        for got, e in zip(cp_layers(model)[name].factors, expected):
            torch.testing.assert_close(got.detach(), e, rtol=1e-5, atol=1e-6)
    bias = (1 - 1.4) * before["net.fc1.bias"] + 1.4 * (
        ups[0]["weights"]["net.fc1.bias"] + ups[1]["weights"]["net.fc1.bias"]
    ) / 2
    torch.testing.assert_close(model.net.fc1.bias.detach(), bias)


def test_act_server_update_composes_averages_by_data_size_and_refits():
    model = cp_client()
    strategy = TDPFed(aggregation="act", beta=1.0, act_sweeps=3)
    strategy.setup(model, 2)
    before = {n: t.detach().clone() for n, t in shared_state(model).items()}
    ups = [make_upload(model, 1), make_upload(model, 2)]
    server_round(strategy, model, ups, [30, 10])
    name = "net.fc1"
    clients = [factors_of(u["weights"], name) for u in ups]
    omega = act_tensor(factors_of(before, name), clients, [30, 10], 1.0)
    torch.testing.assert_close(strategy.message(model, 0, 1)["tensor"][f"{name}.dense_weight"], omega)
    refit = cp_als(omega, afm(factors_of(before, name), clients, [30, 10], 1.0), 3)
    for got, e in zip(cp_layers(model)[name].factors, refit):
        torch.testing.assert_close(got.detach(), e, rtol=1e-4, atol=1e-6)


def test_act_is_invariant_to_a_client_permuting_its_columns_and_afm_is_not():
    results = {}
    for aggregation in ("afm", "act"):
        model = cp_client()
        strategy = TDPFed(aggregation=aggregation, act_sweeps=0)
        strategy.setup(model, 2)
        up = make_upload(model, 1)
        perm = torch.randperm(cp_layers(model)["net.fc1"].rank)
        permuted = {"weights": dict(up["weights"])}
        for i in range(2):
            key = f"net.fc1.factors.{i}"
            permuted["weights"][key] = up["weights"][key][:, perm]
        common = cp_reconstruct(factors_of(up["weights"], "net.fc1"))
        server_round(strategy, model, [up, permuted], [20, 20])
        results[aggregation] = (strategy, model, common)
    strategy, model, common = results["act"]
    torch.testing.assert_close(strategy.act_tensor__net__fc1, common)
    _, model, common = results["afm"]
    assert (model.net.fc1.reconstruct().detach() - common).norm() > 0.05 * common.norm()


def test_uplink_is_in_factor_form_within_one_percent_of_the_target_ratio():
    for ratio in (1.5, 2.0):
        cp = cp_client(hidden=100, in_features=784, ratio=ratio)
        dense = cp_client(hidden=100, in_features=784, ratio=None)
        strategy = TDPFed()
        strategy.setup(cp, 1)
        ctx = ClientContext(0, 0, strategy.message(cp, 0, 0), {}, 10, 0, 0.01)
        strategy.on_client_start(cp, ctx)
        up = payload_bytes(strategy.upload(cp, ctx))
        assert up == 4 * sum(p.numel() for p in cp.parameters())
        assert payload_bytes(FedAvg().upload(dense, ctx)) / up == pytest.approx(ratio, rel=0.01)


def test_bytes_per_round_afm_and_act(fit):
    sizes = {}
    for aggregation in ("afm", "act"):
        module = FederatedModule(client=cp_client(), strategy=TDPFed(aggregation=aggregation), local_steps=1)
        fit(module, data=fed_data(), rounds=1, limit_val_batches=0)
        sizes[aggregation] = module.history[-1]
    factors = 4 * sum(p.numel() for p in cp_client().parameters())
    dense_cp = 4 * sum(layer.weight.numel() for layer in cp_layers(cp_client()).values())
    assert sizes["afm"].bytes_up == sizes["act"].bytes_up == 4 * factors
    assert sizes["afm"].bytes_down == 4 * factors
    assert sizes["act"].bytes_down == 4 * (factors + dense_cp)


@pytest.mark.parametrize("aggregation", ["afm", "act"])
def test_personalised_evaluation_runs_theta_on_the_local_test_split(aggregation, fit):
    module = FederatedModule(client=cp_client(), strategy=TDPFed(aggregation=aggregation), local_steps=3)
    trainer = fit(module, data=fed_data(local_test_fraction=0.25), rounds=2)
    assert {"global/acc", "personal/acc"} <= set(trainer.callback_metrics)
    assert set(module.client_eval) == {0, 1, 2, 3}
    state = module.store.get(1)
    theta = {k[len(THETA) :]: v for k, v in state.items() if k.startswith(THETA)}
    worker = module.worker
    load_tensors(worker, shared_state(module.client))
    module.strategy.personalize(worker, 1, state)
    x = torch.randn(5, 1, 8, 8)
    torch.testing.assert_close(worker(x), functional_call(module.client, theta, (x,)))
    load_tensors(worker, shared_state(module.client))  # as evaluate_clients does before every client
    module.strategy.personalize(worker, 9, {})  # a client that never trained deploys the global model
    torch.testing.assert_close(worker(x), module.client(x))


def test_tdpfed_on_a_dense_model_with_one_sgd_factor_step_is_pfedme():
    ups = []
    for strategy in (
        PFedMe(lam=5.0, personal_lr=0.05, personal_steps=2),
        TDPFed(lam=5.0, personal_lr=0.05, personal_steps=2, factor_steps=1, personal_momentum=0.0),
    ):
        model = cp_client(optimizer="sgd", lr=0.02, ratio=None)
        strategy.setup(model, 1)
        ups.append(run_client(strategy, model, batches(3))[1]["weights"])
    for n in ups[0]:
        torch.testing.assert_close(ups[0][n], ups[1][n], rtol=1e-6, atol=1e-7)


def test_theta_steps_are_plain_gradient_descent_by_default_and_nesterov_only_on_request():
    """The paper gives no momentum for its Nesterov solver: the default is GD; 0.5 is an explicit option."""
    model = cp_client()
    data = batches(1)
    plain = TDPFed(lam=5.0, personal_lr=0.05, personal_steps=3)
    plain.setup(model, 1)
    ctx, _, worker = run_client(plain, model, data)
    group = ctx.scratch[SCRATCH].optimizer.param_groups[0]
    assert group["momentum"] == 0.0 and not group["nesterov"]
    # by hand: theta <- theta - eta_p (grad f(theta; B) + lam (theta - [[A_0]])), s times, A_0 fixed
    ref = {n: t.detach() for n, t in dense_weights(model).items()}
    theta = {n: t.clone() for n, t in ref.items()}
    x, y = data[0]
    for _ in range(3):
        th = {n: t.clone().requires_grad_(True) for n, t in theta.items()}
        loss = worker.task_loss(functional_call(worker, th, (x,)), y)
        loss = loss + 0.5 * 5.0 * sum((th[n] - ref[n]).pow(2).sum() for n in th)
        grads = torch.autograd.grad(loss, list(th.values()))
        theta = {n: t - 0.05 * g for (n, t), g in zip(theta.items(), grads)}
    for n, t in ctx.scratch[SCRATCH].theta.items():
        torch.testing.assert_close(t.detach(), theta[n], rtol=1e-5, atol=1e-6)
    nesterov = TDPFed(lam=5.0, personal_lr=0.05, personal_steps=3, personal_momentum=0.5)
    nesterov.setup(model, 1)
    group = run_client(nesterov, model, data)[0].scratch[SCRATCH].optimizer.param_groups[0]
    assert group["momentum"] == 0.5 and group["nesterov"]


def test_the_default_aggregator_averages_the_upload_as_sent():
    agg = Strategy().aggregator()
    assert agg.receive is None and not agg.buffered
    assert TDPFed(aggregation="act").aggregator().receive is not None  # ACT composes on the server


def test_bad_arguments_name_the_field():
    with pytest.raises(ConfigError, match="model.strategy.aggregation"):
        TDPFed(aggregation="mean")
    with pytest.raises(ConfigError, match="model.strategy.lam"):
        TDPFed(lam=-1)
    with pytest.raises(ConfigError, match="model.strategy.beta"):
        TDPFed(beta=0)
    with pytest.raises(ConfigError, match="model.strategy.factor_steps"):
        TDPFed(factor_steps=0)
    with pytest.raises(ConfigError, match="model.strategy.personal_momentum"):
        TDPFed(personal_momentum=1.0)


# ------------------------------------------------------------------ spec §8 items 9, 10, 15, 16, 18
def factor_fit_setup(target_rank=None, seed=0, **tdpfed):
    """A client at the round reset whose theta~ is replaced by ``[[B]]`` (rank ``target_rank``) or kept."""
    model = cp_client()
    strategy = TDPFed(**{"lam": 2.0, **tdpfed})
    strategy.setup(model, 1)
    worker = copy.deepcopy(model)
    ctx = ClientContext(0, 0, strategy.message(model, 0, 0), {}, 10, 1, 0.01)
    strategy.on_client_start(worker, ctx)
    personal = ctx.scratch[SCRATCH]
    if target_rank is not None:
        g = torch.Generator().manual_seed(seed)
        for name, layer in cp_layers(worker).items():
            b = [0.5 * torch.randn(n, target_rank, generator=g) for n in layer.weight_shape]
            with torch.no_grad():
                personal.theta[f"{name}.dense_weight"].copy_(cp_reconstruct(b))
    return strategy, worker, ctx, personal


def test_factor_steps_fit_an_exact_rank_theta_and_leave_an_exact_fit_unchanged():
    # theta~ = [[A]] (the round reset, no theta step): the factor gradient is 0, Adam leaves A as is
    strategy, worker, ctx, personal = factor_fit_setup()
    before = {n: t.detach().clone() for n, t in shared_state(worker).items()}
    strategy.outer_step(worker, worker.configure_optimizers(), ctx, personal)
    assert all(torch.equal(before[n], t) for n, t in shared_state(worker).items())
    # theta~ = [[B]] with rank(B) <= R: the fit loss of the factor steps (Adam) goes to ~0
    strategy, worker, ctx, personal = factor_fit_setup(target_rank=2)
    start = fit_loss(worker, personal.theta, strategy.lam).item()
    strategy.factor_steps = 300
    strategy.outer_step(worker, torch.optim.Adam(worker.parameters(), lr=3e-2), ctx, personal)
    assert fit_loss(worker, personal.theta, strategy.lam).item() < 1e-5 * start


def test_plain_gd_factor_steps_never_increase_the_fit_loss():
    strategy, worker, ctx, personal = factor_fit_setup(target_rank=6, seed=1)
    strategy.factor_steps = 1
    opt = torch.optim.SGD(worker.parameters(), lr=1e-3)
    losses = []
    for _ in range(40):
        losses.append(fit_loss(worker, personal.theta, strategy.lam).item())
        strategy.outer_step(worker, opt, ctx, personal)
    assert all(b <= a for a, b in itertools.pairwise(losses))
    assert losses[-1] < 0.97 * losses[0]


def test_each_local_round_runs_theta_steps_then_factor_steps_on_that_rounds_theta():
    events = []

    def hook(opt, args, kwargs):
        events.append(type(opt).__name__)

    model = cp_client()
    strategy = TDPFed(personal_steps=2, factor_steps=3)
    strategy.setup(model, 1)
    seen = []
    outer = strategy.outer_step

    def spy(module, optimizer, ctx, personal):
        seen.append({n: t.detach().clone() for n, t in personal.theta.items()})
        outer(module, optimizer, ctx, personal)

    strategy.outer_step = spy
    handle = register_optimizer_step_post_hook(hook)
    try:
        ctx, _, _ = run_client(strategy, model, batches(3))
    finally:
        handle.remove()
    assert events == (["SGD"] * 2 + ["Adam"] * 3) * 3
    # the factors of round t' are fitted to that round's theta~ (which then keeps moving)
    w = "net.fc1.dense_weight"
    assert len(seen) == 3 and not torch.equal(seen[0][w], seen[2][w])
    torch.testing.assert_close(seen[-1][w], ctx.state[THETA + w])


def test_afm_weights_samples_uses_data_sizes():
    model = cp_client()
    strategy = TDPFed(afm_weights="samples")
    strategy.setup(model, 2)
    before = {n: t.detach().clone() for n, t in shared_state(model).items()}
    ups = [make_upload(model, 1), make_upload(model, 2)]
    server_round(strategy, model, ups, [30, 10])
    clients = [factors_of(u["weights"], "net.fc1") for u in ups]
    expected = afm(factors_of(before, "net.fc1"), clients, [30, 10], 1.0)
    for got, e in zip(cp_layers(model)["net.fc1"].factors, expected):
        torch.testing.assert_close(got.detach(), e, rtol=1e-5, atol=1e-6)


def test_full_participation_samples_every_client_every_round():
    assert num_sampled(20, 1.0, None) == 20
    for r in range(3):
        assert sample_clients(20, num_sampled(20, 1.0, None), seed=0, round=r) == list(range(20))
