"""Devices drawn from seeded distributions (engine/system/devices.py)."""

import math

import pytest

from fl_lightning.engine.system import Devices, RoundPolicy, Setup


def test_a_clients_device_is_a_function_of_the_seed_and_the_client():
    a = Devices().profiles(50, seed=3)
    assert a == Devices().profiles(50, seed=3)
    more = Devices().profiles(80, seed=3)
    assert more.speed[:50] == a.speed and more.upload_mbps[:50] == a.upload_mbps  # growing keeps them
    assert Devices().profiles(50, seed=4).speed != a.speed


def test_speed_and_bandwidth_are_lognormal_around_their_medians():
    p = Devices(speed=80.0, speed_sigma=0.5, download_mbps=10.0, bandwidth_sigma=1.0).profiles(4001, 0)
    assert sorted(p.speed)[2000] == pytest.approx(80.0, rel=0.06)
    logs = [math.log(v) for v in p.download_mbps]
    mean = sum(logs) / len(logs)
    std = math.sqrt(sum((v - mean) ** 2 for v in logs) / len(logs))
    assert mean == pytest.approx(math.log(10.0), abs=0.06) and std == pytest.approx(1.0, rel=0.06)
    assert max(p.speed) / min(p.speed) > 10  # heavy-tailed: the slowest are many times slower
    flat = Devices(speed_sigma=0.0, bandwidth_sigma=0.0).profiles(5, 0)
    assert set(flat.speed) == {100.0} and set(flat.download_mbps) == {20.0} and set(flat.upload_mbps) == {5.0}


def test_availability_dropout_and_the_cycle():
    p = Devices(availability=0.7, dropout=0.1).profiles(3, 0)
    assert p.availability == (0.7,) * 3 and p.dropout == (0.1,) * 3 and not p.cycle
    c = Devices(day_s=86400.0, online_fraction=0.4).profiles(3, 0)
    assert c.cycle and len(c.phase) == 3 and all(0 <= ph < 1 for ph in c.phase) and c.day_s == 86400.0


def test_describe_names_the_spread():
    d = Devices(availability=0.8)
    d.bind(Setup(20, 0, 10, (5,) * 20, (5,) * 20, 1, None, 1000, 1000), RoundPolicy(30.0, "partial"))
    text = d.describe()
    assert text.startswith("Devices: speed") and "10%-90%" in text and "deadline 30 s (partial)" in text


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"speed": 0.0}, "model.system.speed"),
        ({"speed_sigma": -1.0}, "model.system.speed_sigma"),
        ({"download_mbps": float("inf")}, "model.system.download_mbps"),
        ({"upload_mbps": -5.0}, "model.system.upload_mbps"),
        ({"bandwidth_sigma": float("nan")}, "model.system.bandwidth_sigma"),
        ({"availability": 1.2}, "model.system.availability"),
        ({"availability": -0.1}, "model.system.availability"),
        ({"availability": 0.0}, "model.system.availability"),
        ({"dropout": 1.5}, "model.system.dropout"),
        ({"dropout": -0.5}, "model.system.dropout"),
        ({"day_s": 0.0}, "model.system.day_s"),
        ({"online_fraction": 0.0}, "model.system.online_fraction"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_field(kw, field):
    from fl_lightning.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        Devices(**kw)
    assert str(info.value).startswith(f"{field}=") and "\n" not in str(info.value)
