"""A client in flight (engine/flight.py): its arrival order and its checkpoint record."""

import torch

from fl_lightning.engine.flight import Flight


def test_arrivals_are_ordered_by_time_then_client_then_dispatch():
    a = Flight(3, 0, 0, 0.0, 2.0, 5, 10)
    b = Flight(1, 1, 0, 0.5, 2.0, 5, 10)
    c = Flight(1, 0, 0, 0.0, 2.0, 5, 10)
    d = Flight(0, 0, 0, 0.0, 1.5, 5, 10)
    assert [f.client for f in sorted([a, b, c, d], key=lambda f: f.order)] == [0, 1, 1, 3]
    assert sorted([a, b, c, d], key=lambda f: f.order)[1] is c


def test_a_flight_round_trips_through_its_checkpoint_record(tmp_path):
    held = {"delta": {"w": torch.tensor([1.0, -2.0])}}
    train_state = {"train_loss": {"mean_value": torch.tensor(0.5), "weight": torch.tensor(3.0)}}
    flight = Flight(4, 7, 2, 1.25, 3.5, 12, 40, held, "", {"train_loss": 0.5, "steps": 12.0}, train_state)
    failed = Flight(5, 7, 2, 1.25, 9.0, 12, 40, None, "dropped out mid-round (model.system.dropout)")
    path = tmp_path / "f.pt"
    torch.save([flight.state(), failed.state()], path)
    back = [Flight.from_state(s, torch.device("cpu")) for s in torch.load(path, weights_only=True)]
    assert back[0].order == flight.order and back[0].version == 2 and back[0].steps == 12
    assert torch.equal(back[0].held["delta"]["w"], held["delta"]["w"]) and back[0].metrics == flight.metrics
    assert back[1].held is None and back[1].error.startswith("dropped out")
