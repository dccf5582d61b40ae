"""FedReg: pseudo data one signed gradient step from the real batch, the slow update, the projections."""

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from fl_lightning.api.types import ClientContext
from fl_lightning.errors import ConfigError
from fl_lightning.strategies import FedAvg, FedReg

from conftest import global_weights, make_module


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"gamma": 0.0}, "gamma"),
        ({"gamma": 1.5}, "gamma"),
        ({"eta_s": -1.0}, "eta_s"),
        ({"iters": 0}, "iters"),
        ({"eta_p": float("nan")}, "eta_p"),
    ],
)
def test_bad_values_are_one_line_config_errors(kw, field):
    with pytest.raises(ConfigError, match=f"model.strategy.{field}"):
        FedReg(**kw)


def _client(strategy):
    module = make_module(strategy).client
    glob = {k: v.detach().clone() for k, v in module.state_dict().items()}
    ctx = ClientContext(0, 0, {"weights": glob}, {}, 32, 2, 0.1)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 1, 8, 8, generator=g), torch.randint(0, 10, (16,), generator=g)
    return module, glob, ctx, x, y


def test_pseudo_data_is_one_fgsm_step_raising_the_global_models_loss():
    strategy = FedReg(eta_s=0.05, eta_p=0.002, iters=1)
    module, glob, ctx, x, y = _client(strategy)
    with torch.no_grad():  # the local model has drifted: the pseudo data must come from theta^t
        for p in module.parameters():
            p.add_(0.3)
    xs, qs, xp = strategy.pseudo_data(module, ctx, x, y)
    xr = x.clone().requires_grad_(True)
    module.eval()
    (grad,) = torch.autograd.grad(F.cross_entropy(functional_call(module, glob, (xr,)), y), [xr])
    torch.testing.assert_close(xs, torch.clamp(x + 0.05 * grad.sign(), x.min(), x.max()))
    torch.testing.assert_close(xp, torch.clamp(x + 0.002 * grad.sign(), x.min(), x.max()))
    with torch.no_grad():
        torch.testing.assert_close(qs, functional_call(module, glob, (xs,)).softmax(-1))
        assert F.cross_entropy(functional_call(module, glob, (xs,)), y) > F.cross_entropy(
            functional_call(module, glob, (x,)), y
        )
    assert all(p.grad is None for p in module.parameters())


def test_local_step_is_the_slow_update_then_the_two_projections():
    gamma, lr = 0.3, 0.1
    strategy = FedReg(gamma=gamma, eta_s=0.05, iters=1)
    module, glob, ctx, x, y = _client(strategy)
    names = [n for n, _ in module.named_parameters()]
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # a later local step: theta != theta^t
        for p in module.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    theta = {n: p.detach().clone() for n, p in module.named_parameters()}
    xs, qs, xp = strategy.pseudo_data(module, ctx, x, y)

    def grad_at(values, inp, loss_fn):
        leaves = {n: v.clone().requires_grad_(True) for n, v in values.items()}
        module.eval()
        out = loss_fn(functional_call(module, leaves, (inp,)))
        module.train()
        return dict(zip(leaves, torch.autograd.grad(out, list(leaves.values()))))

    slow = {n: gamma * theta[n] + (1 - gamma) * glob[n] for n in names}
    leaves = {n: v.clone().requires_grad_(True) for n, v in slow.items()}
    g_real = dict(
        zip(
            names,
            torch.autograd.grad(
                F.cross_entropy(functional_call(module, leaves, (x,)), y), list(leaves.values())
            ),
        )
    )
    fast = {n: theta[n] - lr * g_real[n] for n in names}
    delta = {n: fast[n] - glob[n] for n in names}
    mid = {n: glob[n] + 0.5 * delta[n] for n in names}
    g_s = grad_at(mid, xs, lambda z: -(qs * z.log_softmax(-1)).sum(-1).mean())
    g_p = grad_at(mid, xp, lambda z: F.cross_entropy(z, y))

    def dot(a, b):
        return sum(float((a[n] * b[n]).sum()) for n in names)

    w_s = max(0.0, dot(delta, g_s) / dot(g_s, g_s))
    rest = {n: delta[n] - w_s * g_s[n] for n in names}
    w_p = max(0.0, dot(rest, g_p) / dot(g_p, g_p))
    expected = {n: fast[n] - w_s * g_s[n] - w_p * g_p[n] for n in names}

    optimizer = torch.optim.SGD(module.parameters(), lr=lr)

    def closure():
        optimizer.zero_grad()
        loss = F.cross_entropy(module(x), y)
        loss.backward()
        return loss

    strategy.local_step(module, optimizer, ctx, (x, y), closure)
    assert w_s > 0 or w_p > 0  # the check exercises a correction
    for n, p in module.named_parameters():
        torch.testing.assert_close(p.detach(), expected[n], rtol=1e-4, atol=1e-6)


def test_one_round_fit_trains_and_differs_from_fedavg(fit):
    a, b = make_module(FedAvg()), make_module(FedReg(eta_s=0.05, iters=1))
    fit(a, rounds=1)
    fit(b, rounds=1)
    wa, wb = global_weights(a), global_weights(b)
    assert all(torch.isfinite(v).all() for v in wb.values())
    assert any(not torch.equal(wa[k], wb[k]) for k in wa)
