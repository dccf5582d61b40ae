"""The simulated clock's math against hand-computed values (functional/system.py)."""

import math

import pytest
import torch

from fl_lightning.functional.system import (
    bernoulli,
    client_seconds,
    compute_seconds,
    cycle_online,
    first_to_finish,
    lognormal,
    next_online,
    over_selected,
    steps_within,
    straggler_count,
    straggler_work,
    transfer_seconds,
)


def test_a_clients_time_is_download_computation_and_upload():
    assert transfer_seconds(1_000_000, 8.0) == pytest.approx(1.0)  # 8 Mbit at 8 Mbit/s
    assert compute_seconds(20, 10, 50.0) == pytest.approx(4.0)  # 200 samples at 50 samples/s
    assert client_seconds(20, 10, 50.0, 1.0, 0.5) == pytest.approx(5.5)


def test_steps_within_a_deadline_are_what_fits_after_the_transfers():
    # 10 s budget, 1 s down, 1 s up: 8 s of computation at 50 samples/s in batches of 10 -> 40 steps
    assert steps_within(10.0, 10, 50.0, 1.0, 1.0) == 40
    assert steps_within(10.0, 10, 50.0, 1.0, 1.01) == 39
    assert steps_within(2.0, 10, 50.0, 1.0, 1.0) == 0  # the transfers alone fill it
    assert steps_within(1.5, 10, 50.0, 1.0, 1.0) == 0
    # exactly the time of k steps fits k steps despite float rounding
    for k in range(1, 200):
        assert steps_within(client_seconds(k, 7, 31.0, 0.3, 0.7), 7, 31.0, 0.3, 0.7) == k


def test_fedprox_stragglers_count_as_its_code_rounds():
    """flearn/trainers/fedprox.py keeps round(K (1 - drop_percent)) devices active."""
    assert [straggler_count(10, f) for f in (0.0, 0.5, 0.9, 1.0)] == [0, 5, 9, 10]
    assert straggler_count(5, 0.5) == 3  # round(2.5) = 2 active (Python's round): 3 stragglers
    assert straggler_count(3, 0.5) == 1  # round(1.5) = 2 active


def test_straggler_work_is_uniform_in_one_to_e_exclusive():
    g = torch.Generator().manual_seed(0)
    draws = straggler_work(4000, 20, g)
    assert min(draws) == 1 and max(draws) == 19 and set(draws) == set(range(1, 20))
    counts = [draws.count(e) for e in range(1, 20)]
    assert max(counts) / min(counts) < 1.5  # about 4000 / 19 each
    with pytest.raises(ValueError, match="high >= 2"):
        straggler_work(1, 1, g)


def test_over_selection_and_the_first_to_finish():
    assert over_selected(10, 0.3) == 13 and over_selected(10, 0.0) == 10 and over_selected(3, 0.1) == 4
    assert first_to_finish({5: 2.0, 1: 3.0, 7: 1.0, 2: 2.0}, 2) == [2, 7]  # 7, then 2 and 5 tied: 2 first
    assert first_to_finish({5: 2.0, 1: 3.0, 7: 1.0, 2: 2.0}, 3) == [2, 5, 7]


def test_a_day_night_cycle():
    day, frac = 100.0, 0.25
    assert cycle_online(0.0, day, frac, 0.0) and cycle_online(24.0, day, frac, 0.0)
    assert not cycle_online(25.0, day, frac, 0.0) and cycle_online(125.0 - 0.001, day, frac, 0.9)
    assert cycle_online(50.0, day, 1.0, 0.3)  # always online
    t = next_online(30.0, day, frac, 0.0)
    assert t == pytest.approx(100.0) and t >= 100.0 and cycle_online(t, day, frac, 0.0)
    assert next_online(10.0, day, frac, 0.0) == 10.0
    t = next_online(30.0, day, frac, 0.5)  # phase 0.5: online in [50, 75) of each day
    assert t == pytest.approx(50.0) and cycle_online(t, day, frac, 0.5)


def test_seeded_draws():
    a = lognormal(100.0, 0.7, 20001, torch.Generator().manual_seed(1))
    assert sorted(a)[10000] == pytest.approx(100.0, rel=0.05)  # the median
    logs = torch.tensor([math.log(v) for v in a])
    assert float(logs.std()) == pytest.approx(0.7, rel=0.05)
    assert lognormal(3.0, 0.0, 4, torch.Generator().manual_seed(1)) == [3.0] * 4
    assert lognormal(5.0, 1.0, 3, torch.Generator().manual_seed(2)) == lognormal(
        5.0, 1.0, 3, torch.Generator().manual_seed(2)
    )
    flags = bernoulli([1.0, 0.0, 0.5] * 2000, torch.Generator().manual_seed(3))
    assert all(flags[0::3]) and not any(flags[1::3]) and 0.45 < sum(flags[2::3]) / 2000 < 0.55
