"""Asynchronous and buffered aggregation on the simulated clock (engine/asynchronous.py): arrivals in the
clock's order, clients training on the model of their dispatch, staleness, the server step, the checkpoint
of the clients in flight, and the configurations it refuses."""

from __future__ import annotations

import pytest
import torch

from fl_lightning.api import Aggregator
from fl_lightning.engine.asynchronous import AsyncSchedule
from fl_lightning.engine.system import Devices, RoundPolicy, Stragglers, Trace
from fl_lightning.errors import ConfigError, RunError
from fl_lightning.lightning.checkpoint import LastRoundCheckpoint
from fl_lightning.strategies import DP, FedAsync, FedAvg, FedBuff

from conftest import global_weights, make_data, make_engine, make_module, make_trainer


class FailingBuff(FedBuff):
    """FedBuff whose clients in ``fail`` raise."""

    def __init__(self, fail, **kwargs) -> None:
        super().__init__(**kwargs)
        self.fail = set(fail)

    def on_client_start(self, module, ctx):
        super().on_client_start(module, ctx)
        if ctx.client_id in self.fail:
            raise RuntimeError("deliberate failure")


def trace(tmp_path, speeds):
    path = tmp_path / "devices.csv"
    lines = ["client,speed,download_mbps,upload_mbps,availability"]
    lines += [f"{c},{s},1000,1000,1" for c, s in enumerate(speeds)]
    path.write_text("\n".join(lines) + "\n")
    return Trace(str(path))


def test_arrivals_follow_the_clock_and_each_client_trains_on_the_model_of_its_dispatch(tmp_path):
    """Clients 0..3 at speeds 400, 200, 100, 50: with M = 4 and K = 2 the fast ones arrive first, come back,
    and arrive again while the slow ones are still in flight (their staleness grows)."""
    engine = make_engine(
        FedBuff(concurrency=4, buffer_size=2), num_clients=4, system=trace(tmp_path, [400, 200, 100, 50])
    )
    schedule = engine.schedule
    assert isinstance(schedule, AsyncSchedule) and schedule.in_flight == 4 and schedule.buffer == 2
    engine.run_round(0)
    first = engine.history[0]
    assert first.sim.staleness_max == 0 and sorted(first.client_steps) == [0, 1]
    # client 0's place was refilled at once (by client 0, the only one not in flight), client 1's (the K-th
    # arrival) is refilled after the server step, when the next step starts
    assert first.sim.dispatched == 5 and first.sim.in_flight == 3
    assert {f.client: f.version for f in schedule.flights} == {0: 0, 2: 0, 3: 0}
    engine.run_round(1)
    assert {f.client: f.version for f in schedule.flights if f.client == 1} == {1: 1}  # on the new model
    for r in range(2, 6):
        engine.run_round(r)
    records = engine.history
    assert max(r.sim.staleness_max for r in records) >= 2  # the slow clients' updates are stale
    clock = [r.sim.time_s for r in records]
    assert clock == sorted(clock)
    assert sum(r.sim.round_s for r in records) == pytest.approx(engine.clock)
    assert all(len(r.client_steps) <= 2 and r.clients == 2 for r in records)


def test_fedbuffs_first_step_with_every_client_in_the_buffer_is_the_uniform_mean():
    """M = K = 4, no staleness, server lr 1: x - (1/4) sum_k (x - y_k) = mean_k y_k, the first round of FedAvg
    with uniform weights (the clients train on the same RNG streams: dispatch 0 is round 0)."""

    class UniformAvg(FedAvg):
        def aggregator(self):
            return Aggregator(weighting="uniform")

    buff = make_engine(FedBuff(concurrency=4, buffer_size=4), num_clients=4)
    avg = make_engine(UniformAvg(), num_clients=4)
    buff.run_round(0)
    avg.run_round(0)
    a, b = buff.model.state_dict(), avg.model.state_dict()
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_fedasync_takes_a_server_step_per_arrival():
    engine = make_engine(FedAsync(concurrency=3), num_clients=4)
    engine.run_round(0)
    assert engine.schedule.buffer == 1 and engine.history[0].clients == 1


def test_a_resume_with_clients_in_flight_is_bit_exact(tmp_path):
    def run(rounds, folder, ckpt=None):
        module = make_module(FedBuff(concurrency=3, buffer_size=2), system=Devices(dropout=0.2))
        trainer = make_trainer(
            folder, rounds=rounds, enable_checkpointing=True, callbacks=[LastRoundCheckpoint(folder / "ck")]
        )
        trainer.fit(module, datamodule=make_data(), ckpt_path=ckpt)
        return module

    straight = run(4, tmp_path / "s")
    first = run(2, tmp_path / "a")
    saved = torch.load(tmp_path / "a" / "ck" / "last.ckpt", weights_only=True)["fl_lightning"]["schedule"]
    assert len(saved["async"]["flights"]) == 2 and saved["clock"] == first.engine.clock  # in flight, held
    resumed = run(4, tmp_path / "b", ckpt=str(tmp_path / "a" / "ck" / "last.ckpt"))
    a, b = global_weights(straight), global_weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)

    def kept(r):
        return (r.sim.time_s, r.sim.staleness_max, r.client_steps, r.failed)

    assert [kept(r) for r in straight.history] == [kept(r) for r in resumed.history]


def test_one_training_step_is_one_server_step(fit):
    module = make_module(FedBuff(buffer_size=1), participation=0.5)
    trainer = fit(module, rounds=3)
    assert trainer.global_step == 3 and [r.clients for r in module.history] == [1, 1, 1]


@pytest.mark.parametrize(
    ("strategy", "config", "message"),
    [
        (
            lambda: FedBuff(concurrency=2, buffer_size=3),
            {},
            r"^model\.strategy\.buffer_size=3 is larger than",
        ),
        (lambda: FedBuff(buffer_size=3), {"participation": 0.5}, r"larger than the 2 clients in flight"),
        (
            lambda: FedBuff(concurrency=9),
            {},
            r"^model\.strategy\.concurrency=9 is larger than data\.num_clients=4",
        ),
        (
            lambda: FedBuff(),
            {"system": Devices(), "round_policy": RoundPolicy(deadline_s=100.0)},
            r"^model\.round_policy\.deadline_s shapes synchronous",
        ),
        (lambda: FedBuff(), {"system": Stragglers()}, r"^model\.system=Stragglers shapes synchronous rounds"),
        (lambda: DP(FedBuff()), {}, r"^model\.strategy: DP cannot wrap FedBuff, an asynchronous strategy"),
    ],
    ids=["k-over-m", "k-over-cohort", "m-over-clients", "deadline", "stragglers", "plug-in"],
)
def test_what_an_asynchronous_strategy_cannot_run_is_one_line_before_the_first_step(
    strategy, config, message
):
    with pytest.raises(ConfigError, match=message) as info:
        make_engine(strategy(), num_clients=4, **config)
    assert "\n" not in str(info.value)


def test_failed_arrivals_stop_the_run_after_max_failed_rounds_times_the_clients_in_flight():
    strategy = FailingBuff(range(6), concurrency=3, buffer_size=1)
    engine = make_engine(strategy, num_clients=6, max_failed_rounds=2)
    with pytest.raises(RunError) as info:
        engine.run_round(0)
    msg = str(info.value)
    assert msg.startswith("server step 0: every sampled client failed for 6 consecutive arrivals")
    assert "(last error: client " in msg and "deliberate failure" in msg
    assert msg.endswith("model.max_failed_rounds=2 (the limit is it times the 3 clients in flight)")


def test_an_accepted_arrival_ends_the_failure_streak_and_a_resume_restores_it():
    """Clients 0 and 1 fail: on equal devices at most two failed arrivals come in a row (each wave of three
    arrivals ends with an accepted one), under a limit of 3; the streak is 0 after every server step, and a
    resume takes it from the history."""
    strategy = FailingBuff({0, 1}, concurrency=3, buffer_size=1)
    engine = make_engine(strategy, num_clients=6, max_failed_rounds=1)
    for r in range(8):
        engine.run_round(r)
        assert engine.failed_streak == 0
    assert sum(r.failed for r in engine.history) >= 3
    engine.failed_streak = 2
    engine.load_schedule_state(engine.schedule_state())
    assert engine.failed_streak == 0
