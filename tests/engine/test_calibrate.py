"""fl_lightning.engine.calibrate: a CPU process chooses between batched groups and one client at a time by
timing both on its first clients (never training a client twice), says so once, and records it in every
round and in summary.json. The timings here come from a fake clock, so the choice is deterministic."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch

from fl_lightning.callbacks import FederatedSummary
from fl_lightning.engine import calibrate, executors
from fl_lightning.engine.calibrate import CpuDecision, host_memory_budget
from fl_lightning.errors import ConfigError
from fl_lightning.models import MLP
from fl_lightning.strategies import FedAvg

from conftest import global_weights, make_data, make_module, make_trainer


def test_the_first_clients_train_one_at_a_time_then_a_probe_then_the_rest_in_groups():
    decision = CpuDecision("measure", 100)
    assert decision.to_time == 5 and decision.probe == 5 and decision.measuring and decision.batched is None
    sizes, left, decided = [], 100, []
    while left:
        n = decision.next_group(left)
        sizes.append(n)
        left -= n
        if n == 1:
            decision.add(1, 0.5, 5, round=0)  # 0.1 s per client-step one at a time
        else:  # the probe 0.02 s per client-step, the full group 0.04 s: decided on the full group
            decided.append(decision.add(n, (0.02 if n == 5 else 0.04) * n * 5, n * 5, round=0))
    assert sizes == [1] * 5 + [5, 90] and decided == [False, True]
    assert decision.batched and decision.size == 100 and decision.round == 0
    assert decision.speedup == pytest.approx(2.5)
    assert decision.next_group(100) == 100 and decision.next_group(30) == 30
    assert "ms per client-step batched" in decision.describe()
    assert "on 5 + 90 clients (after a probe of 5)" in decision.describe()


def test_a_probe_that_does_not_pay_is_taken_twice_then_decides():
    """Batching 4x slower: only the two probes' clients run batched, and the decision is on both readings."""
    decision = CpuDecision("measure", 100)
    sizes, left = [], 100
    while left:
        n = decision.next_group(left)
        sizes.append(n)
        left -= n
        decision.add(n, (0.1 if n == 1 else 0.4 * n) * 5, n * 5, round=0)
    assert sizes == ([1] * 5 + [5]) * 2 + [1] * 80 and decision.batched is False and decision.round == 0
    assert decision.readings == [pytest.approx(0.25)] * 2 and decision.speedup == pytest.approx(0.25)
    assert "a first reading 0.25x; 0.25x on average" in decision.describe()


def test_batching_that_does_not_pay_means_one_at_a_time():
    decision = CpuDecision("measure", 10)
    assert decision.to_time == 2
    for reading in range(2):
        for _ in range(2):
            assert not decision.add(1, 1.0, 10, round=reading)
        assert decision.probe == 4 and decision.next_group(8) == 4  # the probe
        assert decision.add(4, 4 * 1.2, 40, round=reading) == (reading == 1)
    assert decision.batched is False and decision.round == 1
    assert decision.size == 1 and decision.next_group(10) == 1 and decision.speedup == pytest.approx(1 / 1.2)


def test_one_low_reading_on_a_busy_machine_does_not_decide_alone():
    """A first reading of 0.8x (another process took the cache), then the steady 2.4x: batched, on 1.6x."""
    decision = CpuDecision("measure", 10)
    for i, (one, group) in enumerate(((1.0, 1.25), (1.2, 0.5))):
        for _ in range(2):
            decision.add(1, one * 10, 10, round=0)
        decision.add(4, group * 40, 40, round=0)  # the probe
        if i == 0:
            assert decision.readings == [pytest.approx(0.8)] and decision.measuring
            assert decision.next_group(10) == 1  # measuring again: clients one at a time first
    assert decision.measuring and decision.next_group(10) == 10  # the second probe paid: a full group
    assert decision.add(10, 0.5 * 100, 100, round=0) and decision.batched
    assert decision.readings == [pytest.approx(0.8), pytest.approx(2.4)]
    assert decision.speedup == pytest.approx(1.6)


def test_a_rule_decides_without_measuring():
    decision = CpuDecision("measure", 10)
    decision.rule("a group would run under vmap")
    assert decision.batched is False and decision.next_group(10) == 1 and decision.round is None
    assert decision.describe() == "a group would run under vmap" and not decision.add(4, 1.0, 4, round=0)
    pinned = CpuDecision("batched", 10)
    pinned.rule("ignored: the choice is pinned")
    assert pinned.batched and pinned.reason is None


def test_a_round_too_small_to_split_is_timed_one_way_then_the_other():
    decision = CpuDecision("measure", 3)
    assert [decision.next_group(n) for n in (3, 2, 1)] == [1, 1, 1]
    for _ in range(3):
        decision.add(1, 1.0, 2, round=0)
    assert decision.measuring and math.isnan(decision.speedup)
    assert decision.next_group(3) == 3  # the next round: a group
    assert decision.add(3, 1.0, 6, round=1) and decision.batched and decision.round == 1


@pytest.mark.parametrize(("mode", "size"), [("batched", 7), ("one_at_a_time", 1)])
def test_a_pinned_choice_measures_nothing(mode, size):
    decision = CpuDecision(mode, 7)
    assert not decision.measuring and decision.size == size and decision.next_group(20) == min(size, 20)
    assert not decision.add(1, 1.0, 1, round=0) and decision.round is None


def test_the_host_budget_is_half_its_available_memory():
    budget = host_memory_budget()
    assert budget is not None and 0 < budget < 2**50


def test_the_option_is_checked():
    with pytest.raises(
        ConfigError, match="model.runtime.vectorize_cpu='fast' must be one of measure, batched"
    ):
        make_module(runtime={"vectorize": 4, "vectorize_cpu": "fast"})


class _Clock:
    """A fake clock that the clients' work advances: ``one`` seconds per client one at a time, ``group``
    seconds per batched client."""

    def __init__(self, one: float, group: float) -> None:
        self.now, self.one, self.group = 0.0, one, group

    def __call__(self) -> float:
        return self.now


def _measured_run(tmp_path, monkeypatch, one: float, group: float, rounds: int = 3):
    clock = _Clock(one, group)

    class Timed(CpuDecision):
        def __init__(self, mode: str, largest: int) -> None:
            super().__init__(mode, largest)
            self.clock = clock

    run_client, train_stacked = executors.run_client, executors.train_stacked

    def one_client(*args, **kwargs):
        clock.now += clock.one
        return run_client(*args, **kwargs)

    def stacked(stack, *args, **kwargs):
        clock.now += clock.group * stack.size
        return train_stacked(stack, *args, **kwargs)

    monkeypatch.setattr(executors, "CpuDecision", Timed)
    monkeypatch.setattr(executors, "run_client", one_client)
    monkeypatch.setattr(executors, "train_stacked", stacked)
    module = make_module(FedAvg(), runtime={"vectorize": 4, "vectorize_cpu": "measure"}, local_steps=2)
    torch.manual_seed(0)
    module.client.net = MLP(in_features=64, num_classes=10, hidden=(16,))
    summary = FederatedSummary()
    trainer = make_trainer(tmp_path, rounds=rounds, callbacks=[summary])
    trainer.fit(module, datamodule=make_data(num_clients=6))
    return module, summary


def test_a_measured_run_trains_batched_where_that_is_faster(tmp_path, monkeypatch, caplog):
    with caplog.at_level(logging.INFO, logger="fl_lightning"):
        module, summary = _measured_run(tmp_path, monkeypatch, one=1.0, group=0.2)
    executor = module.engine.executor
    # round 0: 2 clients one at a time (timed), then 4 batched (6 clients, groups of up to 4); then groups
    assert executor.counts == {"sequential": 2, "vectorised": 4 + 6 + 6} and not executor.notices
    assert [r.vectorised_clients for r in module.history] == [4, 6, 6]
    facts = module.history[-1].vectorize
    assert facts == {
        "vectorize/batched": 1.0,
        "vectorize/group_size": 4.0,
        "vectorize/speedup": pytest.approx(5.0),
        "vectorize/fused_sgd": 1.0,
    }
    said = [r.getMessage() for r in caplog.records if "train batched on this CPU" in r.getMessage()]
    assert len(said) == 1 and "(5.00x)" in said[0] and "round 0 on 2 + 4 clients" in said[0]
    assert summary.summary["vectorize/batched"] == 1.0 and summary.summary[
        "vectorize/speedup"
    ] == pytest.approx(5)


def test_a_measured_run_falls_back_to_one_at_a_time_and_says_so_once(tmp_path, monkeypatch, caplog):
    with caplog.at_level(logging.WARNING, logger="fl_lightning"):
        module, _ = _measured_run(tmp_path, monkeypatch, one=1.0, group=1.5)
    executor = module.engine.executor
    # rounds 0 and 1: 2 clients one at a time, then a group of 4 (measured twice); round 2 one at a time
    assert executor.counts == {"sequential": 2 + 2 + 6, "vectorised": 4 + 4}
    notices = [r.getMessage() for r in caplog.records if "model.runtime.vectorize=4" in r.getMessage()]
    assert (
        len(notices) == 1
        and "clients train one at a time on this CPU, where batching does not pay" in notices[0]
    )
    assert module.history[-1].vectorize["vectorize/batched"] == 0.0
    assert module.history[-1].vectorize["vectorize/group_size"] == 1.0
    assert not executor.stacks  # the stacks are let go
    assert module.history[-1].vectorize["vectorize/speedup"] == pytest.approx(1 / 1.5)


def test_a_network_that_would_run_under_vmap_trains_one_at_a_time_unmeasured(tmp_path, caplog):
    """On a CPU, convolutions (and recurrent layers) batch only through vmap, measured slower: no probe."""
    runtime = {"vectorize": 4, "vectorize_cpu": "measure"}
    module = make_module(FedAvg(), runtime=runtime, local_steps=2)  # the SmallCNN
    with caplog.at_level(logging.WARNING, logger="fl_lightning"):
        make_trainer(tmp_path, rounds=2).fit(module, datamodule=make_data(num_clients=6))
    executor = module.engine.executor
    assert executor.counts == {"sequential": 12, "vectorised": 0} and not executor.stacks
    notices = [r.getMessage() for r in caplog.records if "model.runtime.vectorize=4" in r.getMessage()]
    assert (
        len(notices) == 1 and "clients train one at a time on this CPU: a group would run under" in notices[0]
    )
    assert "its network is not a linear chain" in notices[0] and "vectorize_cpu=batched" in notices[0]
    assert module.history[-1].vectorize == {"vectorize/batched": 0.0, "vectorize/group_size": 1.0}


def test_measured_runs_give_the_weights_of_one_at_a_time(tmp_path, monkeypatch):
    """Whatever the measurement chose, the round's clients each trained once, as one at a time."""
    seq = make_module(FedAvg(), local_steps=2)
    torch.manual_seed(0)
    seq.client.net = MLP(in_features=64, num_classes=10, hidden=(16,))
    make_trainer(tmp_path / "seq", rounds=3).fit(seq, datamodule=make_data(num_clients=6))
    for one, group in ((1.0, 0.2), (1.0, 1.5)):
        vec, _ = _measured_run(tmp_path / f"{group}", monkeypatch, one, group)
        wa, wb = global_weights(seq), global_weights(vec)
        for k in wa:
            torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=1e-5)


def test_the_summary_json_holds_the_decision(tmp_path, monkeypatch):
    module, summary = _measured_run(tmp_path, monkeypatch, one=1.0, group=0.2, rounds=2)
    facts = {k: v for k, v in summary.summary.items() if k.startswith("vectorize/")}
    assert facts == module.history[-1].vectorize
    assert json.loads(json.dumps(summary.summary))["vectorize/group_size"] == 4.0
    assert calibrate.CPU_MODES == ("measure", "batched", "one_at_a_time")
