"""Synchronous rounds on the simulated clock (engine/round.py with model.system): the executors run exactly
the steps the engine decides, FedNova counts them, the clock is recorded, logged and resumed, and a system
model that changes nothing changes no weight."""

from __future__ import annotations

import pytest
import torch

from fl_lightning.api import ClientModule, Vectorizable
from fl_lightning.data import IID
from fl_lightning.engine import Engine, EngineConfig, LocalConfig, default_executor
from fl_lightning.engine.system import Devices, RoundPolicy, Stragglers
from fl_lightning.errors import RunError
from fl_lightning.lightning.checkpoint import LastRoundCheckpoint
from fl_lightning.models import MLP
from fl_lightning.strategies import FedAvg, FedNova
from fl_lightning.strategies.fednova import GROUP, MOMENTUM, STEPS

from conftest import global_weights, make_data, make_engine, make_module, make_trainer


class CountingNova(FedNova):
    """FedNova recording each client's ``||a_k||_1`` (its steps, for plain SGD) and its context's steps."""

    vectorizable = Vectorizable(scratch=(STEPS, MOMENTUM))

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[tuple[int, int], tuple[float, int]] = {}

    def upload(self, module, ctx):
        up = super().upload(module, ctx)
        self.seen[(ctx.round, ctx.client_id)] = (float(up[GROUP]["a"]), ctx.num_steps)
        return up


def vectorised_engine(strategy, vectorize: int, **config) -> Engine:
    """An engine over 6 IID digits clients training an MLP (it stacks), ``vectorize`` clients at a time."""
    data = make_data(num_clients=6, partition=IID(), batch_size=8, local_test_fraction=0.0)
    data.setup("fit")
    torch.manual_seed(0)
    client = ClientModule(MLP(in_features=64, num_classes=10, hidden=(16,)), lr=0.1, momentum=0.0)
    local = LocalConfig(batch_size=8, local_steps=12, vectorize=vectorize)
    engine = Engine(client, strategy, EngineConfig(local, **config))
    engine.setup(data.clients, data.task, data.num_classes, executor=default_executor(local))
    return engine


@pytest.mark.parametrize("vectorize", [1, 4])
def test_partial_work_runs_exactly_the_planned_steps_and_fednova_counts_them(vectorize):
    system = Devices(speed=60.0, speed_sigma=0.8)
    policy = RoundPolicy(deadline_s=1.5, policy="partial")
    engine = vectorised_engine(CountingNova(), vectorize, system=system, round_policy=policy)
    for r in range(3):
        engine.run_round(r)
    cut = 0
    for record in engine.history:
        for cid, steps in record.client_steps.items():
            a, num_steps = engine.strategy.seen[(record.round, cid)]
            assert a == steps == num_steps  # FedNova's tau_k is the number of steps actually run
            cut += steps < 12
        assert record.sim.partial == sum(s < 12 for s in record.client_steps.values())
    assert cut > 0
    if vectorize > 1:
        assert engine.executor.counts["vectorised"] > 0


def test_drop_and_partial_give_different_models_and_the_same_clock(fit):
    weights, clocks = {}, {}
    for policy in ("drop", "partial"):
        module = make_module(
            local_steps=None,
            local_epochs=3,
            system=Stragglers(fraction=0.5),
            round_policy=RoundPolicy(policy=policy),
        )
        fit(module, rounds=3)
        weights[policy] = global_weights(module)
        clocks[policy] = [r.sim.time_s for r in module.history]
        assert all(getattr(r.sim, "late" if policy == "drop" else "partial") == 2 for r in module.history)
    assert any(not torch.equal(weights["drop"][k], weights["partial"][k]) for k in weights["drop"])
    assert clocks["drop"] == clocks["partial"] and clocks["drop"][0] > 0


def test_a_system_model_that_changes_nothing_changes_no_weight(fit):
    plain = make_module()
    fit(plain, rounds=2)
    timed = make_module(system=Devices())  # every client online, no deadline, no dropout: full work
    fit(timed, rounds=2)
    a, b = global_weights(plain), global_weights(timed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert plain.history[-1].sim is None and timed.history[-1].sim.time_s > 0
    assert plain.engine.schedule_state() is None


def test_unavailable_clients_are_not_sampled_and_the_draw_stays_seeded():
    engine = make_engine(num_clients=8, participation=0.5, system=Devices(availability=0.5))
    for r in range(6):
        start = engine.system.next_online_s(engine.clock)
        online = engine.system.online(r, start)
        sampled = engine.sample(r)
        assert set(sampled) <= set(online) and len(sampled) == min(4, len(online))
        assert sampled == engine.sample(r)
        engine.run_round(r)
        assert engine.history[-1].sim.online == len(online)
    everyone = make_engine(num_clients=8, participation=0.5, system=Devices())
    plain = make_engine(num_clients=8, participation=0.5)
    assert [everyone.sample(r) for r in range(5)] == [plain.sample(r) for r in range(5)]


def test_a_mid_round_dropout_is_a_failed_client():
    engine = make_engine(num_clients=6, system=Devices(dropout=0.5))
    for r in range(4):
        engine.run_round(r)
    records = engine.history
    assert sum(r.sim.dropped_out for r in records) > 0
    assert [r.failed for r in records] == [r.sim.dropped_out for r in records]
    strict = make_engine(num_clients=6, system=Devices(dropout=0.5), tolerate_client_failures=False)
    with pytest.raises(RunError, match=r"dropped out mid-round .* model\.tolerate_client_failures=false"):
        for r in range(4):
            strict.run_round(r)
    gone = make_engine(num_clients=3, system=Devices(dropout=1.0), max_failed_rounds=2)
    gone.run_round(0)
    with pytest.raises(RunError, match="every sampled client failed for 2 consecutive rounds"):
        gone.run_round(1)


def test_over_selection_keeps_the_first_to_finish():
    engine = make_engine(
        num_clients=8, participation=0.5, system=Devices(), round_policy=RoundPolicy(over_selection=0.5)
    )
    engine.run_round(0)
    record = engine.history[0]
    assert record.clients == 6 and record.sim.discarded == 2 and len(record.client_steps) == 4


def test_a_day_night_cycle_waits_for_a_client_to_come_online():
    engine = make_engine(num_clients=4, system=Devices(day_s=1000.0, online_fraction=0.05))
    for r in range(3):
        engine.run_round(r)
    assert all(r.sim.online >= 1 for r in engine.history)
    assert sum(r.sim.round_s for r in engine.history) == pytest.approx(engine.clock)


def test_the_simulated_time_budget_ends_the_run_cleanly(fit):
    module = make_module(system=Devices(), round_policy=RoundPolicy(max_sim_time_s=1.0))
    trainer = fit(module, rounds=10)
    assert trainer.global_step < 10 and module.history[-1].sim.time_s >= 1.0
    assert all(r.sim.time_s < 1.0 for r in module.history[:-1])


def test_a_resume_continues_the_clock_exactly(tmp_path):
    def run(rounds, folder, ckpt=None):
        module = make_module(participation=0.5, system=Devices(availability=0.7, dropout=0.2))
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
    assert [r.sim.time_s for r in straight.history] == [r.sim.time_s for r in resumed.history]
    assert resumed.engine.clock == straight.engine.clock


def test_the_round_logs_the_clock_to_tensorboard(tmp_path):
    from lightning.pytorch.loggers import TensorBoardLogger

    from fl_lightning.runs import read_scalars

    policy = RoundPolicy(policy="partial")
    module = make_module(
        system=Stragglers(fraction=0.5), round_policy=policy, local_steps=None, local_epochs=2
    )
    trainer = make_trainer(tmp_path, rounds=2, logger=TensorBoardLogger(str(tmp_path), name="tb"))
    trainer.fit(module, datamodule=make_data())
    scalars = read_scalars(trainer.log_dir)
    assert [s for s, _ in scalars["sim/time_s"]] == [1, 2]
    assert scalars["round/sim_time_s"][0][1] == pytest.approx(module.history[0].sim.round_s, rel=1e-6)
    assert {"round/partial_clients", "round/local_steps", "round/online_clients"} <= set(scalars)
    assert any(tag.startswith("z_client/") and tag.endswith("/steps") for tag in scalars)


def test_no_system_model_no_clock():
    engine = make_engine(FedAvg())
    engine.run_round(0)
    assert not engine.system.clocked and engine.history[0].sim is None and engine.clock == 0


def test_a_round_with_every_client_late_is_skipped_without_counting_as_failed():
    engine = make_engine(num_clients=4, local_steps=4, system=Stragglers(fraction=1.0), max_failed_rounds=1)
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    for r in range(3):
        engine.run_round(r)
    assert all(r.skipped and r.failed == 0 and r.sim.late == 4 for r in engine.history)
    assert all(torch.equal(before[k], v) for k, v in engine.model.state_dict().items())
    assert engine.clock > 0  # the rounds took their time all the same


def test_a_setting_that_cannot_act_says_so_once(caplog):
    with caplog.at_level("WARNING", logger="fl_lightning"):
        make_engine(
            num_clients=4, participation=1.0, system=Devices(), round_policy=RoundPolicy(over_selection=0.5)
        )
        make_engine(
            num_clients=4, participation=0.5, system=Devices(), round_policy=RoundPolicy(deadline_s=1e6)
        )
    said = [r.message for r in caplog.records if "cannot act" in r.message]
    assert len(said) == 2
    assert said[0].startswith("model.round_policy.over_selection=0.5 cannot act: every round samples all 4")
    assert said[1].startswith("model.round_policy.deadline_s=1e+06 cannot act: every client's full round")
    caplog.clear()
    with caplog.at_level("WARNING", logger="fl_lightning"):
        policy = RoundPolicy(over_selection=0.5, deadline_s=0.2)
        engine = make_engine(num_clients=8, participation=0.5, system=Devices(), round_policy=policy)
        engine.run_round(0)
    assert not any("cannot act" in r.message for r in caplog.records)
