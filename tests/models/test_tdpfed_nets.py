"""TDPFed's DNN and VGG8: exact parameter counts of the spec (§4) and the Table I ranks."""

import pytest
import torch
from torch.func import functional_call

from fl_lightning.functional.cp import cp_factor_grads
from fl_lightning.models import DNN, VGG8, create_model
from fl_lightning.models.cp import DENSE, clear_dense_weights, cp_layers, dense_weights, set_dense_weights
from fl_lightning.strategies.mixins.moreau import fit_loss


def weight_count(model):
    layers = cp_layers(model)
    if layers:
        return sum(layer.num_factor_params for layer in layers.values())
    return sum(p.numel() for n, p in model.named_parameters() if n.endswith("weight"))


def bias_count(model):
    return sum(p.numel() for n, p in model.named_parameters() if n.endswith("bias"))


@pytest.mark.parametrize(
    ("cls", "ratio", "weights", "ranks"),
    [
        (DNN, None, 79_400, {}),
        (DNN, 1.5, 52_816, {"fc1": 59, "fc2": 6}),
        (DNN, 2.0, 39_446, {"fc1": 44, "fc2": 5}),
        (VGG8, None, 1_111_392, {}),
        (
            VGG8,
            1.5,
            740_276,
            {
                "conv1": 14,
                "conv2": 120,
                "conv3": 248,
                "conv4": 504,
                "conv5": 759,
                "fc1": 85,
                "fc2": 85,
                "fc3": 6,
            },
        ),
        (
            VGG8,
            2.0,
            555_487,
            {
                "conv1": 11,
                "conv2": 90,
                "conv3": 186,
                "conv4": 378,
                "conv5": 569,
                "fc1": 64,
                "fc2": 64,
                "fc3": 5,
            },
        ),
    ],
)
def test_parameter_counts_and_ranks_are_the_papers(cls, ratio, weights, ranks):
    model = cls(ratio=ratio)
    assert weight_count(model) == weights
    assert bias_count(model) == (110 if cls is DNN else 1_258)
    assert {n: m.rank for n, m in cp_layers(model).items()} == ranks


def test_uplink_ratio_vs_dense_is_within_one_percent_of_the_target():
    for cls, ratio in [(DNN, 1.5), (DNN, 2.0), (VGG8, 1.5), (VGG8, 2.0)]:
        dense = sum(p.numel() for p in cls().parameters())
        cp = sum(p.numel() for p in cls(ratio=ratio).parameters())
        assert dense / cp == pytest.approx(ratio, rel=0.01)


def test_forward_shapes_and_the_digits_sizes():
    assert DNN(ratio=2.0)(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    assert VGG8(ratio=2.0)(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    small = create_model("vgg8", in_channels=1, input_size=8, widths=(4, 8, 8, 8, 8), hidden=16, ratio=2.0)
    assert small(torch.randn(2, 1, 8, 8)).shape == (2, 10)
    assert create_model("dnn", in_features=64, ratio=2.0)(torch.randn(2, 1, 8, 8)).shape == (2, 10)


def test_dense_and_cp_vgg8_have_the_same_scale_at_init():
    torch.manual_seed(0)
    x = torch.randn(8, 3, 32, 32)
    dense, cp = VGG8()(x), VGG8(ratio=2.0)(x)
    assert 0.2 < cp.std().item() / dense.std().item() < 5


def test_cp_vgg8_dense_view_is_the_dense_vgg8_and_its_fit_gradient_is_eq_25():
    # theta (the personalised model) of a CP VGG8 runs as the dense VGG8 with the same weights, and the
    # factor gradient of lam/2 ||theta - [[A]]||^2 on a conv layer is the closed form (N = 4)
    torch.manual_seed(0)
    kw = {"in_channels": 1, "input_size": 8, "widths": (4, 8, 8, 8, 8), "hidden": 16}
    cp, dense = VGG8(ratio=2.0, **kw), VGG8(**kw)
    theta = {n: t.detach() + 0.05 * torch.randn_like(t) for n, t in dense_weights(cp).items()}
    dense.load_state_dict({n.replace(DENSE, "weight"): t for n, t in theta.items()})
    x = torch.randn(3, 1, 8, 8)
    torch.testing.assert_close(functional_call(cp, theta, (x,)), dense(x))
    set_dense_weights(cp, theta)
    torch.testing.assert_close(cp(x), dense(x))
    clear_dense_weights(cp)
    fit_loss(cp, theta, 3.0).backward()
    a = [f.detach() for f in cp.conv2.factors]
    for f, g in zip(cp.conv2.factors, cp_factor_grads(theta["conv2.dense_weight"], a, 3.0)):
        torch.testing.assert_close(f.grad, g, rtol=1e-4, atol=1e-5)
