"""The bi-level client math shared by pFedMe and TDPFed (spec §8 items 7, 8, 11, 12)."""

import pytest
import torch
from torch import nn

from fl_lightning.functional.cp import cp_factor_grads
from fl_lightning.functional.moreau import personal_steps, squared_distance
from fl_lightning.models.cp import CPLinear, DenseView
from fl_lightning.strategies.mixins.moreau import fit_loss


class Net(nn.Module):
    """A CP layer, a dense layer and a switchable task loss (``zero``: f = 0)."""

    def __init__(self, zero: bool = False) -> None:
        super().__init__()
        self.fc1 = CPLinear(6, 5, rank=2)
        self.fc2 = nn.Linear(5, 3)
        self.zero = zero

    def forward(self, x):
        return self.fc2(self.fc1(x).relu())

    def task_loss(self, outputs, y):
        loss = nn.functional.cross_entropy(outputs, y)
        return 0.0 * loss if self.zero else loss


def setup(zero=False, seed=0):
    torch.manual_seed(seed)
    net = Net(zero)
    reference = {n: t.detach().clone() for n, t in DenseView(net)().items()}
    batch = (torch.randn(8, 6), torch.randint(0, 3, (8,)))
    return net, reference, batch


def leaves(d, noise=0.0):
    return {n: (t + noise * torch.randn_like(t)).requires_grad_() for n, t in d.items()}


def test_prox_only_inner_steps_contract_geometrically():
    net, ref, batch = setup(zero=True)
    theta = leaves(ref, noise=1.0)
    start = {n: t.detach().clone() for n, t in theta.items()}
    lam, lr, s = 4.0, 0.1, 5
    personal_steps(net, theta, ref, batch, torch.optim.SGD(theta.values(), lr=lr), lam, s)
    for n in theta:  # theta_s - W = (1 - lr*lam)^s (theta_0 - W)
        torch.testing.assert_close(theta[n].detach() - ref[n], (1 - lr * lam) ** s * (start[n] - ref[n]))


def test_theta_starting_at_the_reference_stays_there_without_data_loss():
    net, ref, batch = setup(zero=True)
    theta = leaves(ref)
    personal_steps(net, theta, ref, batch, torch.optim.SGD(theta.values(), lr=0.1, momentum=0.5), 12.0, 5)
    assert all(torch.equal(theta[n].detach(), ref[n]) for n in ref)


def test_lambda_zero_is_plain_local_training_of_the_dense_model():
    net, ref, batch = setup()
    theta = leaves(ref)
    personal_steps(net, theta, ref, batch, torch.optim.SGD(theta.values(), lr=0.1), 0.0, 3)
    dense = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
    with torch.no_grad():
        dense[0].weight.copy_(ref["fc1.dense_weight"])
        dense[0].bias.copy_(ref["fc1.bias"])
        dense[2].weight.copy_(ref["fc2.weight"])
        dense[2].bias.copy_(ref["fc2.bias"])
    opt = torch.optim.SGD(dense.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        nn.functional.cross_entropy(dense(batch[0]), batch[1]).backward()
        opt.step()
    torch.testing.assert_close(theta["fc1.dense_weight"].detach(), dense[0].weight.detach())
    torch.testing.assert_close(theta["fc2.weight"].detach(), dense[2].weight.detach())


def test_large_lambda_keeps_theta_at_the_local_model():
    def drift(lam, lr):
        net, ref, batch = setup()
        theta = leaves(ref)
        personal_steps(net, theta, ref, batch, torch.optim.SGD(theta.values(), lr=lr), lam, 5)
        return float(squared_distance({n: t.detach() for n, t in theta.items()}, ref).sqrt())

    free, pulled = drift(0.0, 0.5), drift(1e4, 1e-4)  # lr * lam = 1: the exact prox step
    assert pulled < 1e-3 * free


def test_fit_loss_gradient_is_the_closed_form_and_needs_no_data():
    net, ref, _ = setup()
    theta = leaves(ref, noise=0.5)
    net.forward = None  # the factor step must not run the network on data
    loss = fit_loss(net, theta, 3.0)
    loss.backward()
    a = [f.detach() for f in net.fc1.factors]
    closed = cp_factor_grads(theta["fc1.dense_weight"].detach(), a, 3.0)
    for f, g in zip(net.fc1.factors, closed):
        torch.testing.assert_close(f.grad, g, rtol=1e-5, atol=1e-6)
    # dense parameters: the identity parameterisation, grad = lam (w - theta)
    torch.testing.assert_close(
        net.fc2.weight.grad, 3.0 * (net.fc2.weight.detach() - theta["fc2.weight"].detach())
    )
    assert theta["fc2.weight"].grad is None  # theta is a constant of the outer problem
    assert loss.item() == pytest.approx(1.5 * squared_distance(theta, DenseView(net)()).item(), rel=1e-5)
