"""The round policy (``model.round_policy``, engine/system/policy.py): its one-line checks, its forms, and the
former spellings inside ``model.system`` read as it (a config section, a checkpoint's flat hparams)."""

import dataclasses

import pytest

from fl_lightning.engine.system.policy import (
    FIELDS,
    RoundPolicy,
    as_round_policy,
    upgrade_flat,
    upgrade_model,
)
from fl_lightning.errors import ConfigError


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"deadline_s": 0.0}, "model.round_policy.deadline_s"),
        ({"deadline_s": float("nan")}, "model.round_policy.deadline_s"),
        ({"policy": "cut"}, "model.round_policy.policy"),
        ({"over_selection": -0.1}, "model.round_policy.over_selection"),
        ({"target_accuracy": 1.5}, "model.round_policy.target_accuracy"),
        ({"max_sim_time_s": 0}, "model.round_policy.max_sim_time_s"),
    ],
)
def test_bad_policy_values_are_one_line_naming_the_field(kw, field):
    with pytest.raises(ConfigError) as info:
        RoundPolicy(**kw)
    assert str(info.value).startswith(f"{field}=") and "\n" not in str(info.value)


def test_the_policy_is_one_frozen_object_of_five_fields():
    assert FIELDS == ("deadline_s", "policy", "over_selection", "target_accuracy", "max_sim_time_s")
    policy = RoundPolicy(deadline_s=30.0, policy="partial")
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.deadline_s = 1.0  # type: ignore[misc]
    assert policy.given() == ["model.round_policy.deadline_s=30", "model.round_policy.policy=partial"]
    assert RoundPolicy().given() == []


def test_as_round_policy_takes_the_object_a_mapping_or_none():
    policy = RoundPolicy(max_sim_time_s=100.0)
    assert as_round_policy(policy) is policy
    assert as_round_policy(None) == RoundPolicy()
    assert as_round_policy({"max_sim_time_s": 100.0}) == policy
    with pytest.raises(ConfigError, match=r"^model\.round_policy\.deadline is not a field .*deadline_s"):
        as_round_policy({"deadline": 3})
    with pytest.raises(ConfigError, match=r"^model\.round_policy=3 must be a RoundPolicy"):
        as_round_policy(3)  # type: ignore[arg-type]


def test_upgrade_model_moves_the_policy_fields_out_of_the_system_model():
    devices = "fl_lightning.engine.system.devices.Devices"
    old = {
        "participation": 0.5,
        "system": {
            "class_path": devices,
            "init_args": {"speed": 50.0, "deadline_s": 3.0, "policy": "partial"},
        },
    }
    assert upgrade_model(old) == {
        "participation": 0.5,
        "system": {"class_path": devices, "init_args": {"speed": 50.0}},
        "round_policy": {"deadline_s": 3.0, "policy": "partial"},
    }
    # given beside class_path (no init_args); round_policy's own fields win over the former ones
    mixed = {"system": {"class_path": "Stragglers", "policy": "drop"}, "round_policy": {"policy": "partial"}}
    assert upgrade_model(mixed) == {
        "system": {"class_path": "Stragglers"},
        "round_policy": {"policy": "partial"},
    }
    for unchanged in ({"system": None}, {"system": {"class_path": devices, "init_args": {"speed": 1.0}}}, {}):
        assert upgrade_model(unchanged) == unchanged


def test_upgrade_flat_renames_a_checkpoints_saved_hparams():
    saved = {"model.system.deadline_s": 3.0, "model.system.speed": 50.0, "model.system.policy": "drop"}
    assert upgrade_flat(saved) == {
        "model.round_policy.deadline_s": 3.0,
        "model.system.speed": 50.0,
        "model.round_policy.policy": "drop",
    }
