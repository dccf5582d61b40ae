"""FedAdam: the first two server steps by hand (Reddi et al.'s Alg. 2, with and without bias correction)."""

import math

import pytest
import torch
from drift_helpers import assert_resume_is_identical
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

from fl_lightning.errors import ConfigError
from fl_lightning.strategies import FedAdam, RoundInfo
from fl_lightning.strategies.fedadam import FedAdamOptimizer

from conftest import make_data, make_module, make_trainer


def test_first_two_server_steps_by_hand():
    eta, (b1, b2), tau = 0.1, (0.9, 0.99), 1e-3
    strategy = FedAdam(server_lr=eta, betas=(b1, b2), eps=tau)
    model = nn.Linear(2, 1, bias=False)
    nn.init.zeros_(model.weight)
    strategy.setup(model, 2)
    opt = strategy.configure_server_optimizer(list(model.parameters()))
    info = RoundInfo(0, [0, 1], [0, 1], 2)
    x, m, v = [0.0, 0.0], [0.0, 0.0], [tau**2, tau**2]  # m_{-1} = 0, v_{-1} = tau^2
    for mean in ([1.0, -2.0], [0.5, 0.25]):
        opt.zero_grad(set_to_none=True)
        strategy.server_update(model, {"weights": {"weight": torch.tensor([mean])}}, info)
        opt.step()
        for j in range(2):  # Delta = mean - x; m, v without bias correction; x += eta m / (sqrt(v) + tau)
            delta = mean[j] - x[j]
            m[j] = b1 * m[j] + (1 - b1) * delta
            v[j] = b2 * v[j] + (1 - b2) * delta**2
            x[j] += eta * m[j] / (math.sqrt(v[j]) + tau)
        torch.testing.assert_close(model.weight.detach(), torch.tensor([x]))
    # first step: 0.1 * 0.1 * 1 / (sqrt(0.99e-6 + 0.01) + 1e-3) = 0.0990 (~ eta (1 - b1) / sqrt(1 - b2))
    # the optimizer's moments are those of the pseudo-gradient -Delta: exp_avg = -m
    state = opt.state[model.weight]
    torch.testing.assert_close(state["exp_avg"].neg(), torch.tensor([m]))
    torch.testing.assert_close(state["exp_avg_sq"], torch.tensor([v]))
    assert isinstance(opt, FedAdamOptimizer) and opt.param_groups[0]["lr"] == eta


def test_first_two_server_steps_with_bias_correction_by_hand():
    eta, (b1, b2), tau = 0.1, (0.9, 0.99), 1e-3
    strategy = FedAdam(server_lr=eta, betas=(b1, b2), eps=tau, bias_correction=True)
    model = nn.Linear(2, 1, bias=False)
    nn.init.zeros_(model.weight)
    strategy.setup(model, 2)
    opt = strategy.configure_server_optimizer(list(model.parameters()))
    info = RoundInfo(0, [0, 1], [0, 1], 2)
    x, m, v = [0.0, 0.0], [0.0, 0.0], [tau**2, tau**2]
    for t, mean in enumerate(([1.0, -2.0], [0.5, 0.25]), start=1):
        opt.zero_grad(set_to_none=True)
        strategy.server_update(model, {"weights": {"weight": torch.tensor([mean])}}, info)
        opt.step()
        eta_t = eta * math.sqrt(1 - b2**t) / (1 - b1**t)  # Kingma & Ba's alpha_t; tau on sqrt(v) as is
        for j in range(2):
            delta = mean[j] - x[j]
            m[j] = b1 * m[j] + (1 - b1) * delta
            v[j] = b2 * v[j] + (1 - b2) * delta**2
            x[j] += eta_t * m[j] / (math.sqrt(v[j]) + tau)
        torch.testing.assert_close(model.weight.detach(), torch.tensor([x]))
        assert opt.state[model.weight]["step"].item() == t
        if t == 1:  # eta_1 = eta sqrt(1 - b2) / (1 - b1) = eta: x moves ~ eta sign(Delta), as Adam does
            assert abs(x[0] - eta) < 0.002 and abs(x[1] + eta) < 0.002


def test_bias_corrected_step_approaches_torch_adam():
    """With a tiny tau both are Adam: ours differs only by v_{-1} = tau^2 and where tau is added."""
    torch.manual_seed(0)
    w0 = torch.randn(5, 3)
    a, b = nn.Parameter(w0.clone()), nn.Parameter(w0.clone())
    ours = FedAdamOptimizer([a], lr=0.05, betas=(0.9, 0.99), eps=1e-12, bias_correction=True)
    adam = torch.optim.Adam([b], lr=0.05, betas=(0.9, 0.99), eps=1e-12)
    for _ in range(4):
        g = torch.randn(5, 3)
        a.grad, b.grad = g.clone(), g.clone()
        ours.step()
        adam.step()
    torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-5, atol=1e-6)
    assert not torch.equal(a.detach(), w0)


def test_optimizer_state_dict_round_trip_is_bit_exact():
    """Two steps, save, load into a fresh optimizer, one step == three uninterrupted steps."""
    torch.manual_seed(0)
    w0, grads = torch.randn(4, 3), [torch.randn(4, 3) for _ in range(3)]
    for bias_correction in (False, True):
        full = nn.Parameter(w0.clone())
        opt = FedAdamOptimizer([full], bias_correction=bias_correction)
        for g in grads:
            full.grad = g.clone()
            opt.step()
        first = nn.Parameter(w0.clone())
        opt = FedAdamOptimizer([first], bias_correction=bias_correction)
        for g in grads[:2]:
            first.grad = g.clone()
            opt.step()
        saved = opt.state_dict()
        resumed = nn.Parameter(first.detach().clone())
        opt = FedAdamOptimizer([resumed], bias_correction=bias_correction)
        opt.load_state_dict(saved)
        resumed.grad = grads[2].clone()
        opt.step()
        assert torch.equal(resumed, full)
        assert opt.state[resumed]["step"].item() == 3


def test_parameters_without_gradient_are_left_alone():
    a, b = nn.Parameter(torch.ones(2)), nn.Parameter(torch.ones(3))
    opt = FedAdamOptimizer([a, b], bias_correction=True)
    a.grad = torch.tensor([1.0, -1.0])
    opt.step()
    assert torch.equal(b, torch.ones(3)) and b not in opt.state
    a.grad, b.grad = torch.tensor([1.0, -1.0]), torch.ones(3)  # now a at step 2, b at step 1
    opt.step()
    assert opt.state[a]["step"].item() == 2 and opt.state[b]["step"].item() == 1
    # b's first bias-corrected step is eta * m / (sqrt(v) + tau) with eta_1 = eta sqrt(1-b2) / (1-b1)
    m, v = 0.1, 0.99e-6 + 0.01
    expected = 1.0 - 0.1 * (math.sqrt(0.01) / 0.1) * m / (math.sqrt(v) + 1e-3)
    torch.testing.assert_close(b.detach(), torch.full((3,), expected))


def test_moments_survive_a_resume(tmp_path):
    make = lambda: make_module(FedAdam(), participation=0.5, lr_decay=0.9)  # noqa: E731
    assert_resume_is_identical(tmp_path, make, client_state=False, strategy_state=False)


def test_moments_are_in_the_checkpoint(tmp_path):
    module = make_module(FedAdam(bias_correction=True))
    ckpt = ModelCheckpoint(dirpath=tmp_path, filename="{step}")
    make_trainer(tmp_path, rounds=2, callbacks=[ckpt], enable_checkpointing=True).fit(
        module, datamodule=make_data()
    )
    saved = torch.load(tmp_path / "step=2.ckpt", weights_only=False)["optimizer_states"][0]
    assert saved["param_groups"][0]["bias_correction"] is True
    state = next(iter(saved["state"].values()))
    assert state["step"].item() == 2 and {"exp_avg", "exp_avg_sq"} <= state.keys()


def test_bad_arguments_name_the_field():
    with pytest.raises(ConfigError, match="model.strategy.betas"):
        FedAdam(betas=(0.9, 1.0))
    with pytest.raises(ConfigError, match="model.strategy.eps"):
        FedAdam(eps=0.0)
