"""FedGen / FedReg / VHL math: ensemble heads, signed input steps, projections, virtual data, calibration."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fl_lightning.functional.synthetic import (
    ensemble_logits,
    generator_input,
    label_weighted_heads,
    projection_coefficient,
    signed_gradient_steps,
    train_generator,
    virtual_contrastive_loss,
    virtual_dataset,
)


def test_label_weighted_heads_equal_the_count_weighted_ensemble_of_logits():
    g = torch.Generator().manual_seed(0)
    c, d, k = 3, 4, 2
    heads = [(torch.randn(c, d, generator=g), torch.randn(c, generator=g)) for _ in range(k)]
    counts = [torch.tensor([5.0, 0.0, 1.0]), torch.tensor([1.0, 2.0, 3.0])]
    w_sum = sum(n[:, None, None] * w[None] for n, (w, _) in zip(counts, heads))
    b_sum = sum(n[:, None] * b[None] for n, (_, b) in zip(counts, heads))
    weights, biases = label_weighted_heads(sum(counts), w_sum, b_sum)
    z = torch.randn(6, d, generator=g)
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    got = ensemble_logits(z, y, weights, biases)
    total = sum(counts)
    for i in range(6):
        expected = sum(n[y[i]] / total[y[i]] * (w @ z[i] + b) for n, (w, b) in zip(counts, heads))
        torch.testing.assert_close(got[i], expected)


def test_trained_generator_samples_are_classified_as_their_label_by_the_ensemble():
    g = torch.Generator().manual_seed(0)
    c, d, noise = 5, 8, 4
    weights = torch.randn(c, c, d, generator=g).expand(c, c, d).clone()  # a random classifier per label
    biases = torch.zeros(c, c)
    torch.manual_seed(0)
    gen = nn.Sequential(nn.Linear(noise + c, 32), nn.ReLU(), nn.Linear(32, d))
    prior = torch.full((c,), 1.0 / c)
    rng = torch.Generator().manual_seed(1)
    losses = train_generator(gen, weights, biases, prior, noise, 200, 64, 1e-2, rng)
    assert losses[-1] < 0.2 * losses[0]
    y = torch.arange(c).repeat(20)
    with torch.no_grad():
        z = gen(generator_input(torch.randn(len(y), noise, generator=rng), y, c))
    acc = (ensemble_logits(z, y, weights, biases).argmax(1) == y).float().mean()
    assert acc >= 0.95


def test_signed_gradient_step_raises_the_loss_fgsm_direction():
    torch.manual_seed(0)
    net = nn.Linear(6, 3)
    x, y = torch.randn(4, 6), torch.tensor([0, 1, 2, 0])
    xs = signed_gradient_steps(net, x, y, eta=0.01, steps=1)
    xr = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(F.cross_entropy(net(xr), y), [xr])
    torch.testing.assert_close(xs, torch.clamp(x + 0.01 * grad.sign(), x.min(), x.max()))
    assert F.cross_entropy(net(xs), y) > F.cross_entropy(net(x), y)  # FedReg Sec. 3: adversarial (FGSM)
    assert net.weight.grad is None


def test_projection_leaves_the_update_orthogonal_to_the_gradient_and_keeps_descent_directions():
    delta = [torch.tensor([1.0, 2.0]), torch.tensor([[3.0]])]
    g = [torch.tensor([1.0, 0.0]), torch.tensor([[1.0]])]
    w = projection_coefficient(delta, g)
    assert float(w) == pytest.approx(4.0 / 2.0)
    after = [d - w * gi for d, gi in zip(delta, g)]
    assert float(sum((a * gi).sum() for a, gi in zip(after, g))) == pytest.approx(0.0, abs=1e-6)
    assert float(projection_coefficient([-d for d in delta], g)) == 0.0  # descent: no correction


def test_virtual_dataset_is_deterministic_in_its_seed_and_labelled_in_blocks():
    x1, y1 = virtual_dataset(3, 4, (1, 8, 8), seed=7)
    x2, y2 = virtual_dataset(3, 4, (1, 8, 8), seed=7)
    x3, _ = virtual_dataset(3, 4, (1, 8, 8), seed=8)
    assert x1.shape == (12, 1, 8, 8) and torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not torch.equal(x1, x3)
    assert y1.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    # classes are separated: each sample is nearer its own class mean than any other
    means = torch.stack([x1[y1 == c].flatten(1).mean(0) for c in range(3)])
    assert (torch.cdist(x1.flatten(1), means).argmin(1) == y1).all()


def test_virtual_contrastive_loss_by_hand_and_pulls_to_the_own_class():
    z = torch.tensor([[1.0, 0.0]], requires_grad=True)
    zv = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    loss = virtual_contrastive_loss(z, torch.tensor([0]), zv, torch.tensor([0, 1]), temperature=1.0)
    assert float(loss.detach()) == pytest.approx(-math.log(math.e / (math.e + 1.0)))
    # an anchor whose class is absent from the virtual batch is left out
    none = virtual_contrastive_loss(z, torch.tensor([2]), zv, torch.tensor([0, 1]), temperature=1.0)
    assert float(none.detach()) == 0.0
    z2 = torch.tensor([[1.0, 1.0]], requires_grad=True)
    virtual_contrastive_loss(z2, torch.tensor([1]), zv, torch.tensor([0, 1]), 0.5).backward()
    moved = F.normalize(z2.detach() - 0.1 * z2.grad, dim=-1)
    assert float(moved[0, 1]) > float(F.normalize(z2.detach(), dim=-1)[0, 1])
