"""The two-pass local step of SharpnessAware (the math is tested in tests/functional/test_sharpness.py)."""

import torch
from torch import nn

from fl_lightning.api.client import ClientModule
from fl_lightning.api.types import ClientContext
from fl_lightning.models import MLP
from fl_lightning.strategies import FedAvg, FedSAM
from fl_lightning.strategies.mixins.sharpness import SAM_PASS, SharpnessAware

from conftest import global_weights, make_data, make_module


class Quadratic(nn.Module):
    """f(w; x) = 0.5 * sum((x * w)^2) per sample, mean over the batch: grad = mean(x^2) * w."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor([1.0, -2.0]))
        self.v = nn.Parameter(torch.tensor([0.5]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * ((x * self.w).pow(2).sum(1) + (x[:, :1] * self.v).pow(2).sum(1))


def _one_sam_step(strategy, lr=0.1, wd=0.0):
    net = Quadratic()
    opt = torch.optim.SGD(net.parameters(), lr=lr, weight_decay=wd)
    x = torch.tensor([[1.0, 2.0], [3.0, 1.0]])
    ctx = ClientContext(0, 0, {}, {}, 2, 1, lr)
    seen = []

    def closure():
        opt.zero_grad(set_to_none=True)
        loss = net(x).mean()
        seen.append((ctx.scratch.get(SAM_PASS), net.w.detach().clone()))
        loss.backward()
        return loss

    strategy.local_step(net, opt, ctx, (x, None), closure)
    return net, x, seen


def test_sam_step_takes_the_gradient_at_the_perturbed_point_and_restores_w():
    rho, lr, wd = 0.3, 0.1, 0.01
    net, x, seen = _one_sam_step(FedSAM(rho=rho, clip_norm=None), lr=lr, wd=wd)
    w0, v0 = torch.tensor([1.0, -2.0]), torch.tensor([0.5])
    cw = (x**2).mean(0)  # diagonal curvature of w
    cv = (x[:, :1] ** 2).mean(0)
    g = [cw * w0, cv * v0]
    norm = torch.cat(g).norm()  # one norm over both parameters
    e = [t * (rho / (norm + 1e-7)) for t in g]
    g_hat = [cw * (w0 + e[0]), cv * (v0 + e[1])]
    torch.testing.assert_close(net.w.detach(), w0 - lr * (g_hat[0] + wd * w0))
    torch.testing.assert_close(net.v.detach(), v0 - lr * (g_hat[1] + wd * v0))
    # two passes, both flagged, the second one at w + e
    assert [s[0] for s in seen] == [True, True]
    torch.testing.assert_close(seen[1][1], w0 + e[0])


def test_sam_clipping_clips_the_gradient_but_not_the_weight_decay():
    lr, wd, clip = 0.1, 0.5, 0.01
    net, x, _ = _one_sam_step(FedSAM(rho=0.0, clip_norm=clip), lr=lr, wd=wd)
    w0, v0 = torch.tensor([1.0, -2.0]), torch.tensor([0.5])
    g = torch.cat([(x**2).mean(0) * w0, (x[:, :1] ** 2).mean(0) * v0])
    g = g * (clip / (g.norm() + 1e-6))  # clip_grad_norm_'s scale
    torch.testing.assert_close(net.w.detach(), w0 - lr * (g[:2] + wd * w0))
    torch.testing.assert_close(net.v.detach(), v0 - lr * (g[2:] + wd * v0))


class Corrected(FedAvg):
    """A base strategy with a local term 0.5 ||w||^2 (gradient w) and a gradient hook adding 1."""

    def local_loss(self, module, ctx, batch, outputs):
        return 0.5 * sum(p.pow(2).sum() for p in module.parameters())

    def on_before_optimizer_step(self, module, optimizer, ctx):
        for p in module.parameters():
            p.grad.add_(1.0)


class CorrectedSAM(SharpnessAware, Corrected):
    def __init__(self):
        super().__init__()
        self.rho, self.clip_norm = 0.3, None


def test_base_corrections_are_off_in_both_passes_and_applied_at_w():
    rho, lr = 0.3, 0.1
    net, x, _ = _one_sam_step(CorrectedSAM(), lr=lr)
    w0, v0 = torch.tensor([1.0, -2.0]), torch.tensor([0.5])
    cw, cv = (x**2).mean(0), (x[:, :1] ** 2).mean(0)
    g = [cw * w0, cv * v0]  # the task gradient only: not g + w + 1
    norm = torch.cat(g).norm()
    e = [t * (rho / (norm + 1e-7)) for t in g]
    g_hat = [cw * (w0 + e[0]), cv * (v0 + e[1])]
    # corrections at the restored w: + w (local term) + 1 (hook)
    torch.testing.assert_close(net.w.detach(), w0 - lr * (g_hat[0] + w0 + 1.0))
    torch.testing.assert_close(net.v.detach(), v0 - lr * (g_hat[1] + v0 + 1.0))


class Recording(ClientModule):
    """Records every training batch (to check that both SAM passes see the same one)."""

    def __init__(self, **kw):
        super().__init__(MLP(in_features=64, num_classes=10, hidden=[8]), lr=0.1, **{"momentum": 0.0, **kw})
        self.batches: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        self.batches.append(batch[0].clone())
        return super().training_step(batch, batch_idx)


def test_both_passes_use_the_same_minibatch_and_steps_cost_two_passes(fit):
    torch.manual_seed(0)
    module = make_module(FedSAM(rho=0.05), local_steps=3)
    module.client = Recording()
    fit(module, rounds=1, data=make_data(num_clients=1, batch_size=8), limit_val_batches=0)
    seen = module.worker.batches
    assert len(seen) == 6  # K = 3 steps x 2 passes
    for first, second in zip(seen[0::2], seen[1::2]):
        assert torch.equal(first, second)
    assert not torch.equal(seen[0], seen[2])


def test_train_statistics_report_the_loss_at_w(fit):
    from fl_lightning.strategies import FedAvg

    a = make_module(FedAvg())
    b = make_module(FedSAM(rho=0.0, clip_norm=None))
    fit(a, rounds=1)
    fit(b, rounds=1)
    assert a.history[0].train["train_loss"] == b.history[0].train["train_loss"]
    assert all(torch.equal(global_weights(a)[k], global_weights(b)[k]) for k in global_weights(a))
