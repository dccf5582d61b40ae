"""FedBuff's server side (Nguyen et al., AISTATS 2022, Alg. 1): the held update and its staleness scaling."""

import pytest
import torch

from fl_lightning.errors import ConfigError
from fl_lightning.functional.staleness import fedbuff_weight
from fl_lightning.strategies import FedBuff, get_strategy, list_strategies


def test_fedbuff_scales_each_update_by_its_staleness():
    strategy = FedBuff(concurrency=2, buffer_size=1, server_lr=0.5)
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 2.0]]))
    held = strategy.hold(model, {"weights": {"weight": torch.tensor([[0.0, 4.0]])}}, version=0)
    assert torch.equal(held["delta"]["weight"], torch.tensor([[1.0, -2.0]]))  # x^tau - y
    released = strategy.release(model, held, staleness=3)
    assert torch.equal(released["delta"]["weight"], torch.tensor([[0.5, -1.0]]))  # s(3) = 1/2
    assert torch.equal(held["delta"]["weight"], torch.tensor([[1.0, -2.0]]))
    assert fedbuff_weight(3) == 0.5


def test_without_staleness_scaling_every_update_counts_fully():
    strategy = FedBuff(staleness_scaling=False)
    held = {"delta": {"w": torch.tensor([2.0])}}
    assert torch.equal(
        strategy.release(torch.nn.Linear(1, 1), held, staleness=8)["delta"]["w"], held["delta"]["w"]
    )


def test_registered_with_its_arguments():
    assert "FedBuff" in list_strategies()
    s = get_strategy("fedbuff", concurrency=10, buffer_size=4, server_lr=0.5)
    assert (s.concurrency, s.buffer_size, s.server_lr) == (10, 4, 0.5)
    assert s.in_flight(7) == 10 and s.buffer(10) == 4
    d = FedBuff()
    assert d.in_flight(6) == 6 and d.buffer(6) == 3 and d.buffer(1) == 1


def test_k_larger_than_its_concurrency_is_one_line():
    with pytest.raises(ConfigError, match=r"^model\.strategy\.buffer_size=5 is larger than .* concurrency"):
        FedBuff(concurrency=4, buffer_size=5)
    with pytest.raises(ConfigError, match=r"^model\.strategy\.concurrency=0 must be an integer >= 1"):
        FedBuff(concurrency=0)
