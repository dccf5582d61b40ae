"""Unseen clients (``data.unseen_clients``, :attr:`Engine.unseen`): never sampled, on every sampling path."""

from __future__ import annotations

import pytest

from fl_lightning.engine.system import Devices
from fl_lightning.strategies import FedAvg, FedBuff

from conftest import make_engine


@pytest.mark.parametrize(
    ("strategy", "system"),
    [
        (FedAvg, None),
        (FedAvg, Devices(speed_sigma=0.5)),
        (lambda: FedBuff(concurrency=3, buffer_size=2), None),
    ],
    ids=["rounds", "system", "asynchronous"],
)
def test_unseen_clients_are_never_sampled(strategy, system):
    engine = make_engine(strategy(), num_clients=6, participation=0.5, system=system)
    engine.unseen = frozenset({1, 4})
    for r in range(4):
        engine.run_round(r)
    sampled = {c for rec in engine.history for c in rec.sampled} | {
        c for rec in engine.history for c in rec.client_steps
    }
    assert sampled and not sampled & {1, 4}
    assert engine.eligible(range(6)) == [0, 2, 3, 5]


def test_without_unseen_clients_the_draw_is_the_one_before():
    """The eligible clients are mapped in id order: with none held out the sample is select_clients' own."""
    engine = make_engine(FedAvg(), num_clients=6, participation=0.5)
    assert engine.sample(3) == sorted(FedAvg().select_clients(6, 3, 3, engine.config.seed))
