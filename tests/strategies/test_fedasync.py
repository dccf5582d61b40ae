"""FedAsync (Xie, Koyejo & Gupta, 2019): the staleness-weighted mixing and the local proximal term."""

import pytest
import torch

from fl_lightning.api import ClientContext
from fl_lightning.errors import ConfigError
from fl_lightning.strategies import FedAsync


def test_fedasync_mixes_each_arrival_with_a_staleness_weighted_alpha():
    strategy = FedAsync(alpha=0.8, staleness="polynomial", a=1.0)
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 2.0]]))
    y = {"weights": {"weight": torch.tensor([[3.0, 0.0]])}}
    assert strategy.hold(model, y, 0) is y
    assert strategy.mixing_weight(0) == 0.8 and strategy.mixing_weight(3) == pytest.approx(0.2)
    released = strategy.release(model, y, staleness=1)  # alpha_t = 0.8 / 2 = 0.4
    new = model.weight - released["delta"]["weight"]
    assert torch.allclose(new, 0.6 * torch.tensor([[1.0, 2.0]]) + 0.4 * torch.tensor([[3.0, 0.0]]))


def test_the_local_proximal_term_is_rho_over_two_times_the_distance():
    module = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        module.weight.copy_(torch.tensor([[1.0, 2.0]]))
    anchor = {"weight": torch.tensor([[0.0, 0.0]])}
    ctx = ClientContext(0, 0, {"weights": anchor}, {}, 10, 1, 0.1)
    strategy = FedAsync(rho=0.5)
    strategy.on_client_start(module, ctx)
    assert float(strategy.local_loss(module, ctx, None, None)) == pytest.approx(0.5 * 0.5 * 5.0)
    assert FedAsync(rho=0.0).local_loss(module, ctx, None, None) is None


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"alpha": 0.0}, "alpha"),
        ({"alpha": 1.5}, "alpha"),
        ({"staleness": "linear"}, "staleness"),
        ({"a": -1.0}, "a"),
        ({"b": -1.0}, "b"),
        ({"rho": -0.1}, "rho"),
    ],
)
def test_bad_values_are_one_line(kw, field):
    with pytest.raises(ConfigError, match=rf"^model\.strategy\.{field}="):
        FedAsync(**kw)
