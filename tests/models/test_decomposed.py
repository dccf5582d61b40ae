"""DecomposedConv2d, the decompose() transform, the Decomposed wrapper, and aggregation of their factors."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fl_lightning.api.client import ClientModule
from fl_lightning.errors import ConfigError
from fl_lightning.functional.decomposition import cross_term_expansion, reconstruct_filters
from fl_lightning.lightning.module import FederatedModule
from fl_lightning.models import Decomposed, LeNet, SmallCNN
from fl_lightning.models.decomposed import (
    DecomposedConv2d,
    atom_names,
    coefficient_names,
    decompose,
    decomposed_layers,
)
from fl_lightning.strategies import STRATEGIES, FastSlow, FedAvg, PersonalAtoms, RoundInfo, get_strategy

from conftest import global_weights, make_data


def test_shapes_and_parameter_names():
    layer = DecomposedConv2d(3, 8, 5, num_atoms=9)
    assert dict((n, tuple(p.shape)) for n, p in layer.named_parameters()) == {
        "coefficients": (8, 3, 9),
        "atoms": (9, 5, 5),
        "bias": (8,),
    }
    assert layer.weight.shape == (8, 3, 5, 5)
    assert sum(p.numel() for p in layer.parameters()) == 8 * 3 * 9 + 9 * 25 + 8
    assert DecomposedConv2d(4, 6, (3, 3), num_atoms=2, groups=2, bias=False).coefficients.shape == (6, 2, 2)


@pytest.mark.parametrize("mode", ["reconstruct", "two_stage"])
@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"stride": 2},
        {"padding": 1},
        {"padding": 2, "stride": 2},
        {"dilation": 2, "padding": 2},
        {"padding": "same"},
        {"groups": 2, "padding": 1},
        {"padding": 1, "padding_mode": "reflect"},
        {"padding": 1, "padding_mode": "circular", "bias": False},
    ],
)
def test_forward_equals_the_dense_conv_on_the_reconstructed_weight(mode, kw):
    torch.manual_seed(0)
    layer = DecomposedConv2d(4, 6, 3, num_atoms=5, mode=mode, **kw)
    dense = nn.Conv2d(4, 6, 3, **kw)
    with torch.no_grad():
        dense.weight.copy_(layer.weight)
        if dense.bias is not None:
            dense.bias.copy_(layer.bias)
    for size in (7, 8):
        x = torch.randn(2, 4, size, size)
        torch.testing.assert_close(layer(x), dense(x), rtol=1e-5, atol=1e-5)


def test_gradients_follow_the_chain_rule_through_the_product():
    torch.manual_seed(0)
    layer = DecomposedConv2d(3, 4, 3, num_atoms=5, padding=1).double()
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    w = layer.weight.detach().requires_grad_()
    F.conv2d(x, w, layer.bias.detach(), padding=1).pow(2).sum().backward()
    layer(x).pow(2).sum().backward()
    torch.testing.assert_close(
        layer.atoms.grad, torch.einsum("oiq,oihw->qhw", layer.coefficients.detach(), w.grad)
    )
    torch.testing.assert_close(
        layer.coefficients.grad, torch.einsum("qhw,oihw->oiq", layer.atoms.detach(), w.grad)
    )


@pytest.mark.parametrize("num_atoms", [9, 12])
@pytest.mark.parametrize("kw", [{"stride": 2, "padding": 1}, {"dilation": 2, "padding": 2, "groups": 3}])
def test_from_conv_is_exact_with_at_least_k_squared_atoms(num_atoms, kw):
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 6, 3, **kw)
    layer = DecomposedConv2d.from_conv(conv, num_atoms=num_atoms)
    assert layer.atoms.shape == (num_atoms, 3, 3)
    torch.testing.assert_close(layer.weight, conv.weight, rtol=1e-5, atol=1e-6)
    x = torch.randn(2, 3, 9, 9)
    torch.testing.assert_close(layer(x), conv(x), rtol=1e-5, atol=1e-5)
    assert (layer.stride, layer.padding, layer.dilation, layer.groups) == (
        conv.stride,
        conv.padding,
        conv.dilation,
        conv.groups,
    )


def test_from_conv_is_the_best_rank_m_approximation_otherwise():
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 6, 5).double()
    s = torch.linalg.svdvals(conv.weight.detach().reshape(24, 25))
    layer = DecomposedConv2d.from_conv(conv, num_atoms=9)
    err = (conv.weight - layer.weight).pow(2).sum()
    torch.testing.assert_close(err, s[9:].pow(2).sum(), rtol=1e-6, atol=1e-9)


def test_random_init_has_the_scale_of_the_dense_default():
    torch.manual_seed(0)
    dense = torch.stack([nn.Conv2d(64, 64, 5).weight.detach() for _ in range(2)]).std()
    for m in (3, 9, 25, 30):
        rec = DecomposedConv2d(64, 64, 5, num_atoms=m).weight.detach().std()
        assert rec == pytest.approx(float(dense), rel=0.1), m


def test_decompose_converts_only_convs_larger_than_one_by_one():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.Sequential(nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4), nn.Conv2d(4, 5, (1, 3))),
        nn.Flatten(),
        nn.Linear(5 * 8 * 6, 2),
    )
    x = torch.randn(2, 3, 8, 8)
    before = model.eval()(x)
    assert decompose(model, num_atoms=9) is model
    assert isinstance(model[0], DecomposedConv2d) and isinstance(model[1][2], DecomposedConv2d)
    assert type(model[1][0]) is nn.Conv2d and type(model[3]) is nn.Linear
    assert model[1][2].atoms.shape == (9, 1, 3)
    torch.testing.assert_close(model(x), before, rtol=1e-5, atol=1e-5)  # m_a >= k*k: exact
    assert atom_names(model) == ["0.atoms", "1.2.atoms"]
    assert coefficient_names(model) == ["0.coefficients", "1.2.coefficients"]


def test_decomposed_wrapper_keeps_the_function_and_names_its_factors():
    torch.manual_seed(0)
    net = SmallCNN(width=4, hidden=16)
    x = torch.randn(3, 1, 8, 8)
    before = net(x)
    wrapped = Decomposed(net, num_atoms=9)
    torch.testing.assert_close(wrapped(x), before, rtol=1e-5, atol=1e-5)
    names = [n for n, _ in wrapped.named_parameters()]
    assert "net.features.0.atoms" in names and "net.features.3.coefficients" in names
    assert not any(n.endswith(".weight") and "features" in n for n in names)
    with pytest.raises(ConfigError, match="no nn.Conv2d"):
        Decomposed(nn.Linear(3, 2))
    with pytest.raises(ConfigError, match="num_atoms"):
        Decomposed(SmallCNN(), num_atoms=0)


def test_decomposed_lenet_parameter_counts():
    """Spec §7.4: FedRep's CIFAR CNNs, m_a = 9 (and the m_a ablation of the CIFAR-100 net)."""

    def count(net):
        return sum(p.numel() for p in net.parameters())

    c100 = {"num_classes": 100, "widths": (64, 128), "hidden": (256, 128)}
    assert count(Decomposed(LeNet(), 9)) == 239_684
    expected = {3: 890_746, 6: 916_048, 9: 941_350, 12: 966_652}
    assert {m: count(Decomposed(LeNet(**c100), m)) for m in expected} == expected


def _decomposed_module(strategy=None, **kw):
    torch.manual_seed(0)
    client = ClientModule(Decomposed(SmallCNN(width=4, hidden=16), num_atoms=9), lr=0.1, momentum=0.0)
    kw.setdefault("local_steps", 2)
    return FederatedModule(client=client, strategy=strategy or FedAvg(), **kw)


def test_server_averages_factors_so_the_filter_is_the_product_of_averages():
    torch.manual_seed(0)
    model = Decomposed(SmallCNN(width=4, hidden=16))
    name = "net.features.0"
    sizes = [10, 30, 60]
    clients = [{n: t + 0.3 * torch.randn_like(t) for n, t in model.state_dict().items()} for _ in sizes]
    strategy = FedAvg()
    agg = strategy.aggregator()
    for local, n in zip(clients, sizes):
        agg.add({"weights": local}, n)
    opt = strategy.configure_server_optimizer(list(model.parameters()))
    strategy.server_update(model, agg.means(), RoundInfo(0, [0, 1, 2], [0, 1, 2], 3))
    opt.step()
    p = [n / sum(sizes) for n in sizes]
    own, cross = cross_term_expansion(
        [c[f"{name}.coefficients"] for c in clients], [c[f"{name}.atoms"] for c in clients], p
    )
    layer = decomposed_layers(model)[name]
    torch.testing.assert_close(layer.weight.detach(), own + cross, rtol=1e-5, atol=1e-6)
    fedavg_on_w = sum(
        pk * reconstruct_filters(c[f"{name}.coefficients"], c[f"{name}.atoms"]) for pk, c in zip(p, clients)
    )
    assert (layer.weight.detach() - fedavg_on_w).abs().max() > 1e-3


def test_fedavg_on_a_decomposed_model_with_one_client_equals_local_training(fit):
    module = _decomposed_module(local_steps=5)
    fit(module, rounds=1, data=make_data(num_clients=1), limit_val_batches=0)
    local = module.worker.state_dict()
    for k, v in global_weights(module).items():
        torch.testing.assert_close(v, local[k], rtol=0, atol=1e-6)


BASES = [n for n in ("fedavg", "fedprox", "scaffold", "feddyn", "feddc") if n in STRATEGIES]


@pytest.mark.parametrize("base", BASES)
def test_decomposition_trains_under_every_base_strategy_and_wrapper(base, fit):
    for strategy in (
        get_strategy(base),
        FastSlow(get_strategy(base), period=2),
        PersonalAtoms(get_strategy(base)),
    ):
        module = _decomposed_module(strategy)
        start = global_weights(module)
        trainer = fit(module, rounds=3)
        end = global_weights(module)
        assert trainer.global_step == 3
        assert all(torch.isfinite(v).all() for v in end.values())
        for name in atom_names(module.client) + coefficient_names(module.client):
            assert not torch.equal(start[name], end[name]), (type(strategy).__name__, name)
