"""The asynchronous strategy base (api/asynchronous.py): its schedule's sizes and its server step."""

import pytest
import torch
from torch import nn

from fl_lightning.api import DELTA, AsyncStrategy, RoundInfo
from fl_lightning.api.asynchronous import check_buffer
from fl_lightning.errors import ConfigError


class Plain(AsyncStrategy):
    name = ""

    def release(self, model, held, staleness):
        return held


def test_in_flight_and_buffer_default_to_the_cohort_and_half_of_it():
    assert Plain().in_flight(8) == 8 and Plain().buffer(8) == 4 and Plain().buffer(1) == 1
    assert Plain(concurrency=5, buffer_size=2).in_flight(8) == 5 and Plain(buffer_size=3).buffer(8) == 3


def test_the_server_step_follows_the_delta_parameters_by_the_optimizer_buffers_directly():
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    strategy = Plain(server_lr=0.5)
    state = model.state_dict()
    delta = {n: torch.ones_like(t) for n, t in state.items() if t.is_floating_point()}
    before = {n: t.clone() for n, t in state.items()}
    strategy.server_update(model, {DELTA: delta}, RoundInfo(0, [0], [0], 1))
    params = dict(model.named_parameters())
    assert all(torch.equal(p.grad, torch.ones_like(p)) for p in params.values())
    after = model.state_dict()
    assert torch.equal(after["1.running_mean"], before["1.running_mean"] - 0.5)  # b - server_lr * delta
    assert strategy.hold(model, {"weights": {}}, 0) == {"weights": {}}
    assert strategy.aggregator().weight("delta", {}, 100) == 1.0  # each arrival counts once


def test_k_above_m_is_one_line():
    check_buffer(3, 3, "X")
    with pytest.raises(ConfigError, match=r"^model\.strategy\.buffer_size=4 is larger than the 3 clients"):
        check_buffer(4, 3, "X")
    with pytest.raises(ConfigError, match=r"^model\.strategy\.buffer_size=True must be an integer"):
        Plain(buffer_size=True)
