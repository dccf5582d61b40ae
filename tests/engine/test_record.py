import torch

from fl_lightning.engine.record import RoundRecord, SimulatedTime, totals


def _record(round: int = 0, **kw) -> RoundRecord:
    base = dict(round=round, clients=3, failed=1, bytes_down=10, bytes_up=6, time_s=0.5, aggregated=2)
    return RoundRecord(**(base | kw))


def test_a_flat_record_of_an_older_checkpoint_reads_as_the_typed_record():
    old = {
        "round": 4,
        "clients": 3,
        "failed": 1,
        "bytes_down": 10,
        "bytes_up": 6,
        "time_s": 0.5,
        "client_lr": 0.05,
        "skipped": False,
        "train_loss": 0.7,
        "strategy": {"privacy/epsilon": 1.5},
        "sim_round_s": 2.0,
        "sim_time_s": 9.0,
        "online_clients": 5,
        "late_clients": 1,
        "partial_clients": 1,
        "discarded_clients": 0,
        "dropped_out": 1,
        "client_steps": {0: 3, 2: 1},
        "this_run": True,
        "global/acc": 0.8,
    }
    record = RoundRecord.from_dict(old)
    assert record.train == {"train_loss": 0.7} and record.metrics == {"global/acc": 0.8}
    assert record.sim == SimulatedTime(round_s=2.0, time_s=9.0, online=5, late=1, partial=1, dropped_out=1)
    assert (record.aggregated, record.client_steps, record.strategy) == (2, {0: 3, 2: 1}, old["strategy"])
    assert RoundRecord.from_dict({k: v for k, v in old.items() if not k.startswith("sim")}).sim is None


def test_a_record_survives_a_checkpoint(tmp_path):
    record = _record(
        sampled=[0, 1, 2],
        failed_ids=[1],
        client_steps={0: 5, 2: 4},
        train={"train_loss": 0.3},
        sim=SimulatedTime(round_s=1.5, time_s=3.0, staleness_max=2),
        metrics={"global/acc": 0.5, "global/group1/acc": 0.25},
    )
    torch.save({"history": [record.to_dict()]}, tmp_path / "c.ckpt")
    (saved,) = torch.load(tmp_path / "c.ckpt", weights_only=True)["history"]
    assert RoundRecord.from_dict(saved) == record


def test_the_tags_follow_from_the_record():
    plain = _record(train={"train_loss": 0.3}, strategy={"privacy/epsilon": 1.0}, client_steps={0: 4})
    tags = plain.scalars()
    assert (
        tags["round/failed_clients"] == 1.0 and tags["train/loss"] == 0.3 and tags["privacy/epsilon"] == 1.0
    )
    assert not any(t.startswith("sim/") or "local_steps" in t or "peak_memory" in t for t in tags)
    clocked = _record(sim=SimulatedTime(round_s=1.0, time_s=2.0, online=4, late=1), client_steps={0: 4, 1: 2})
    tags = clocked.scalars()
    assert tags["sim/time_s"] == 2.0 and tags["round/online_clients"] == 4 and tags["round/local_steps"] == 3
    assert "round/staleness_max" not in tags


def test_totals_count_the_rounds_and_the_clients_fates():
    history = [
        _record(0, sim=SimulatedTime(1.0, 1.0, late=2, partial=1, dropped_out=1), this_run=False),
        _record(1, sim=SimulatedTime(1.0, 2.5, late=1, discarded=3)),
    ]
    out = totals(history)
    assert (out["rounds"], out["rounds_this_run"], out["bytes_total"], out["failed_clients"]) == (2, 1, 32, 2)
    assert (out["sim_time_s"], out["late_clients"], out["partial_clients"]) == (2.5, 3, 1)
    assert (out["discarded_clients"], out["dropped_out"]) == (3, 1)
    assert "sim_time_s" not in totals([_record()]) and "late_clients" not in totals([_record()])
