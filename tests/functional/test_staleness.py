"""Staleness weights of FedBuff and FedAsync against hand-computed values (functional/staleness.py)."""

import math

import pytest
import torch

from fl_lightning.functional.staleness import (
    fedbuff_weight,
    hinge_weight,
    polynomial_weight,
    scaled_difference,
    staleness_weight,
)


def test_fedbuff_weight_is_one_over_sqrt_one_plus_tau():
    assert [fedbuff_weight(t) for t in (0, 3, 8)] == [1.0, 0.5, pytest.approx(1 / 3)]


def test_fedasync_staleness_functions():
    assert polynomial_weight(0, 0.5) == 1.0 and polynomial_weight(3, 0.5) == 0.5
    assert polynomial_weight(1, 2.0) == 0.25
    assert hinge_weight(4, 10.0, 4.0) == 1.0 and hinge_weight(5, 10.0, 4.0) == pytest.approx(1 / 11)
    assert staleness_weight("constant", 7) == 1.0
    assert staleness_weight("polynomial", 3, a=0.5) == 0.5
    assert staleness_weight("hinge", 6, a=1.0, b=4.0) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="one of"):
        staleness_weight("linear", 1)
    with pytest.raises(ValueError, match=">= 0"):
        staleness_weight("constant", -1)


def test_scaled_difference():
    x = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([3.0])}
    y = {"w": torch.tensor([0.0, 4.0]), "b": torch.tensor([1.0])}
    d = scaled_difference(x, y, 0.5)
    assert torch.equal(d["w"], torch.tensor([0.5, -1.0])) and torch.equal(d["b"], torch.tensor([1.0]))
    assert torch.equal(x["w"], torch.tensor([1.0, 2.0]))  # inputs untouched
    # FedAsync: x - alpha (x - x_new) = (1 - alpha) x + alpha x_new
    alpha = 0.3
    step = scaled_difference(x, y, alpha)
    assert torch.allclose(x["w"] - step["w"], (1 - alpha) * x["w"] + alpha * y["w"])
    assert scaled_difference(x, {}, 2.0) == {}
    assert math.isclose(float(scaled_difference(x, y, 1.0)["b"]), 2.0)
