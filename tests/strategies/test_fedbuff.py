"""FedBuff's server side (Nguyen et al., AISTATS 2022, Alg. 1): the held update and its staleness scaling,
the server momentum and FLSim's normalisation by hand, and runs whose server steps each consume K arrivals."""

import math

import pytest
import torch

from fl_lightning.api import RoundInfo
from fl_lightning.engine.system import Devices
from fl_lightning.errors import ConfigError
from fl_lightning.functional.staleness import fedbuff_weight
from fl_lightning.lightning.checkpoint import LastRoundCheckpoint
from fl_lightning.strategies import FedBuff, get_strategy, list_strategies

from conftest import global_weights, make_data, make_engine, make_module, make_trainer


def _flush(strategy, model, optimizer, step, arrivals):
    """One server step on ``arrivals`` (``(held, staleness)``), as the asynchronous schedule takes it."""
    agg = strategy.aggregator()
    for client, (held, staleness) in enumerate(arrivals):
        agg.add(strategy.release(model, held, staleness), 10 + client, client)
    clients = list(range(len(arrivals)))
    info = RoundInfo(step, clients, clients, 4, weight_totals=agg.weight_totals)
    optimizer.zero_grad(set_to_none=True)
    strategy.server_update(model, strategy.process_aggregate(agg.means(), info), info)
    optimizer.step()


def _linear(weights):
    model = torch.nn.Linear(2, 1, bias=False, dtype=torch.float64)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([weights], dtype=torch.float64))
    return model


def _upload(weights):
    return {"weights": {"weight": torch.tensor([weights], dtype=torch.float64)}}


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


def test_two_flushes_with_server_momentum_by_hand():
    # x0 = (1, 2), K = 2, eta_g = 0.5, beta = 0.9 (FLSim's Sent140 example: 0.7 and 0.9).
    strategy = FedBuff(concurrency=3, buffer_size=2, server_lr=0.5, server_momentum=0.9)
    model = _linear([1.0, 2.0])
    optimizer = strategy.configure_server_optimizer(list(model.parameters()))
    # Flush t = 0: Delta_a = x0 - (0, 4) = (1, -2), Delta_b = x0 - (3, 2) = (-2, 0), both fresh (s = 1);
    # client c starts from x0 too and arrives in the next flush
    a, b, c = (strategy.hold(model, _upload(y), 0) for y in ([0.0, 4.0], [3.0, 2.0], [1.0, 0.0]))
    _flush(strategy, model, optimizer, 0, [(a, 0), (b, 0)])
    # d1 = mean = (-0.5, -1) = v1;  x1 = x0 - 0.5 v1 = (1.25, 2.5)
    torch.testing.assert_close(model.weight.detach(), torch.tensor([[1.25, 2.5]], dtype=torch.float64))
    # Flush t = 1: Delta_c = (0, 2) at staleness 1 (s = 1/sqrt 2); Delta_d = x1 - (2.25, 2.5) = (-1, 0), fresh
    d = strategy.hold(model, _upload([2.25, 2.5]), 1)
    _flush(strategy, model, optimizer, 1, [(c, 1), (d, 0)])
    # d2 = (-0.5, 1/sqrt 2);  v2 = 0.9 v1 + d2 = (-0.95, -0.9 + 1/sqrt 2);  x2 = x1 - 0.5 v2
    r = math.sqrt(0.5)
    expected = torch.tensor([[1.25 + 0.475, 2.5 - 0.5 * (-0.9 + r)]], dtype=torch.float64)
    torch.testing.assert_close(model.weight.detach(), expected, rtol=0, atol=1e-15)
    # without momentum the second step would be x1 - 0.5 d2 = (1.5, 2.5 - r / 2)
    assert (model.weight.detach() - torch.tensor([[1.5, 2.5 - r / 2]], dtype=torch.float64)).abs().min() > 0.1


def test_flsims_sum_and_staleness_reference_by_hand():
    # FLSim's FedBuffAggregator: x <- x - lr sum_k w_k Delta_k, w_k = ((1 + avg_staleness) / (1 + tau_k))^0.5;
    # avg_staleness = 3: Delta_a = (1, -2) fresh (w = 2), Delta_b = (-2, 0) at staleness 15 (w = 1/2)
    strategy = FedBuff(server_lr=0.5, buffer_reduction="sum", staleness_reference=3)
    assert strategy.staleness_weight(0) == 2.0 and strategy.staleness_weight(15) == 0.5
    model = _linear([1.0, 2.0])
    optimizer = strategy.configure_server_optimizer(list(model.parameters()))
    a, b = (strategy.hold(model, _upload(y), 0) for y in ([0.0, 4.0], [3.0, 2.0]))
    _flush(strategy, model, optimizer, 15, [(a, 0), (b, 15)])
    # sum = (2, -4) + (-1, 0) = (1, -4);  x = (1, 2) - 0.5 (1, -4) = (0.5, 4)  (the mean: (0.75, 3))
    torch.testing.assert_close(model.weight.detach(), torch.tensor([[0.5, 4.0]], dtype=torch.float64))


def test_the_defaults_are_the_papers_mean_without_momentum():
    strategy = FedBuff()
    defaults = (strategy.server_momentum, strategy.buffer_reduction, strategy.staleness_reference)
    assert defaults == (0.0, "mean", 0)
    optimizer = strategy.configure_server_optimizer([torch.nn.Parameter(torch.zeros(1))])
    assert type(optimizer) is torch.optim.SGD and optimizer.param_groups[0]["momentum"] == 0.0
    assert all(strategy.staleness_weight(t) == fedbuff_weight(t) for t in range(6))


class Recorded(FedBuff):
    """FedBuff that records what each server step aggregates: the released updates, one list per step."""

    vectorizable = True

    def __init__(self, **kw):
        super().__init__(**kw)
        self.steps, self.pending = [], []

    def release(self, model, held, staleness):
        out = super().release(model, held, staleness)
        self.pending.append({n: t.detach().clone() for n, t in out["delta"].items()})
        return out

    def server_update(self, model, means, info):
        self.steps.append(self.pending)
        self.pending = []
        super().server_update(model, means, info)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_every_server_step_consumes_exactly_k_arrivals_and_steps_with_momentum(reduction):
    """M = 4, K = 3 on 5 clients of unequal speeds for 4 server steps: each step aggregates K arrivals (its
    record says K clients, none failed), and the global model is x0 - eta_g sum_t v^t with
    v^t = beta v^(t-1) + d^t, d^t the mean (or sum) of the step's K released updates."""
    strategy = Recorded(
        concurrency=4, buffer_size=3, server_lr=0.7, server_momentum=0.9, buffer_reduction=reduction
    )
    engine = make_engine(strategy, num_clients=5, system=Devices(speed_sigma=1.0))
    x = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
    for r in range(4):
        engine.run_round(r)
    assert [(rec.clients, rec.failed) for rec in engine.history] == [(3, 0)] * 4
    assert [len(step) for step in strategy.steps] == [3] * 4
    assert max(rec.sim.staleness_max for rec in engine.history) >= 1  # the buffer mixes model versions
    v = {n: torch.zeros_like(t) for n, t in x.items()}
    for step in strategy.steps:
        for n in x:
            d = sum(u[n] for u in step) / (1 if reduction == "sum" else len(step))
            v[n] = 0.9 * v[n] + d
            x[n] = x[n] - 0.7 * v[n]
    for n, p in engine.model.named_parameters():
        torch.testing.assert_close(p.detach(), x[n], rtol=1e-5, atol=1e-6, msg=n)


def test_a_resume_keeps_the_server_momentum(tmp_path):
    def run(rounds, folder, ckpt=None):
        strategy = FedBuff(concurrency=3, buffer_size=2, server_lr=0.5, server_momentum=0.9)
        module = make_module(strategy, system=Devices(speed_sigma=1.0))
        trainer = make_trainer(
            folder, rounds=rounds, enable_checkpointing=True, callbacks=[LastRoundCheckpoint(folder / "ck")]
        )
        trainer.fit(module, datamodule=make_data(), ckpt_path=ckpt)
        return module

    straight = run(4, tmp_path / "s")
    run(2, tmp_path / "a")
    resumed = run(4, tmp_path / "b", ckpt=str(tmp_path / "a" / "ck" / "last.ckpt"))
    a, b = global_weights(straight), global_weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    state = resumed.trainer.optimizers[0].state_dict()["state"]
    assert state and all("momentum_buffer" in s for s in state.values())


def test_bad_server_settings_are_one_line():
    with pytest.raises(ConfigError, match=r"^model\.strategy\.server_momentum=1\.0 must be in \[0, 1\)"):
        FedBuff(server_momentum=1.0)
    with pytest.raises(
        ConfigError, match=r"^model\.strategy\.buffer_reduction='avg' must be one of mean, sum"
    ):
        FedBuff(buffer_reduction="avg")
    with pytest.raises(ConfigError, match=r"^model\.strategy\.staleness_reference=-1 must be >= 0"):
        FedBuff(staleness_reference=-1)
