"""The personalised baselines' update rules, each against its formula."""

import math

import torch
import torch.nn.functional as F

from fl_lightning.functional.personalized import (
    ala_mix,
    ala_weight_step,
    apfl_mixture,
    balanced_softmax_loss,
    hessian_free_direction,
    std_below,
)


def test_apfl_mixture_and_its_gradients():
    v = {"w": torch.tensor([1.0, 2.0], requires_grad=True)}
    w = {"w": torch.tensor([3.0, -1.0])}
    alpha = torch.tensor(0.25, requires_grad=True)
    mixed = apfl_mixture(v, w, alpha)["w"]
    assert torch.allclose(mixed, torch.tensor([2.5, -0.25]))
    g = torch.tensor([0.5, -2.0])
    (mixed * g).sum().backward()  # f linear in v_bar with gradient g
    assert torch.allclose(v["w"].grad, 0.25 * g)
    assert math.isclose(float(alpha.grad), float(((v["w"] - w["w"]) * g).sum()), rel_tol=1e-6)


def test_balanced_softmax_is_the_cross_entropy_of_the_prior_weighted_softmax():
    logits = torch.tensor([[1.0, 0.5, -1.0], [0.2, 0.1, 2.0]])
    target = torch.tensor([0, 1])
    prior = torch.tensor([0.6, 0.4, 0.0])
    weighted = prior * logits.exp()
    expected = -(weighted[torch.arange(2), target] / weighted.sum(1)).log().mean()
    assert torch.allclose(balanced_softmax_loss(logits, target, prior.log()), expected)
    assert torch.allclose(balanced_softmax_loss(logits, target, (10 * prior).log()), expected)  # counts work
    uniform = balanced_softmax_loss(logits, target, torch.zeros(3))
    assert torch.allclose(uniform, F.cross_entropy(logits, target))


def test_ala_weights_step_by_the_gradient_times_the_difference_and_stay_in_the_unit_box():
    local, glob = [torch.tensor([0.0, 1.0, 2.0])], [torch.tensor([1.0, 1.0, 0.0])]
    weights = [torch.tensor([0.5, 0.5, 0.9])]
    assert torch.allclose(ala_mix(local, glob, weights)[0], torch.tensor([0.5, 1.0, 0.2]))
    grads = [torch.tensor([-0.2, 3.0, 0.1])]
    new = ala_weight_step(weights, grads, local, glob, eta=1.0)[0]
    assert torch.allclose(new, torch.tensor([0.7, 0.5, 1.0]))  # 0.9 - 0.1 * (-2) = 1.1, clipped


def test_hessian_free_direction_is_exact_on_a_quadratic():
    a = torch.tensor([[2.0, 0.5], [0.5, 1.0]], dtype=torch.float64)

    def grad(w):
        return a @ w

    w, g = torch.tensor([1.0, -2.0], dtype=torch.float64), torch.tensor([0.3, 0.7], dtype=torch.float64)
    alpha, delta = 0.1, 1e-3
    d = hessian_free_direction([g], [grad(w + delta * g)], [grad(w - delta * g)], alpha, delta)[0]
    assert torch.allclose(d, g - alpha * a @ g)


def test_the_first_weight_learning_stops_on_a_small_deviation_of_enough_losses():
    assert not std_below([1.0, 1.0], window=2, threshold=0.1)  # not more than the window yet
    assert std_below([5.0, 1.0, 1.05], window=2, threshold=0.1)
    assert not std_below([1.0, 1.0, 2.0], window=2, threshold=0.1)  # population std of (1, 2) is 0.5
