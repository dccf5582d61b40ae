"""fl_lightning.engine.runtime: how a run executes (``model.runtime``), one object apart from the algorithm's
arguments; its checks, and its fields as spelled before (at the model's own level) read as it."""

from __future__ import annotations

import dataclasses

import pytest

from fl_lightning import Runtime
from fl_lightning.engine.local import LocalConfig
from fl_lightning.engine.runtime import FIELDS, as_runtime, upgrade_flat, upgrade_model
from fl_lightning.errors import ConfigError

#: The knobs and the defaults they had as arguments of FederatedModule itself.
FORMER_DEFAULTS = {
    "state_memory_mb": None,
    "state_dir": None,
    "threads_per_process": None,
    "compile": False,
    "vectorize": 1,
    "vectorize_memory_gb": None,
    "vectorize_cpu": "measure",
}


def test_the_runtime_holds_exactly_the_former_knobs_with_their_defaults():
    assert dataclasses.asdict(Runtime()) == FORMER_DEFAULTS
    assert tuple(FORMER_DEFAULTS) == FIELDS
    with pytest.raises(dataclasses.FrozenInstanceError):
        Runtime().vectorize = 2  # type: ignore[misc]  # frozen: a shared default is safe


@pytest.mark.parametrize(
    ("field", "bad", "message"),
    [
        (
            "state_memory_mb",
            -1.0,
            r"model\.runtime\.state_memory_mb=-1\.0 must be >= 0; or null for no limit",
        ),
        ("state_memory_mb", float("nan"), r"model\.runtime\.state_memory_mb=nan"),
        ("threads_per_process", 0, r"model\.runtime\.threads_per_process=0 must be >= 1 \(or null\)"),
        ("threads_per_process", True, r"model\.runtime\.threads_per_process=True must be >= 1"),
        ("compile", "fast", r"model\.runtime\.compile='fast' must be true, false or a torch\.compile mode"),
        ("vectorize", 0, r"model\.runtime\.vectorize=0 must be an integer >= 1 \(1: one client at a time\)"),
        ("vectorize", "all", r"model\.runtime\.vectorize='all' must be an integer >= 1"),
        ("vectorize", True, r"model\.runtime\.vectorize=True must be an integer >= 1"),
        (
            "vectorize_memory_gb",
            0.0,
            r"model\.runtime\.vectorize_memory_gb=0\.0 must be > 0; or null: automatic",
        ),
        ("vectorize_cpu", "fast", r"model\.runtime\.vectorize_cpu='fast' must be one of measure, batched"),
    ],
)
def test_each_field_is_checked_in_one_line_naming_model_runtime(field, bad, message):
    with pytest.raises(ConfigError, match=f"^{message}") as err:
        Runtime(**{field: bad})
    assert "\n" not in str(err.value)


def test_good_values_pass():
    Runtime(state_memory_mb=0, state_dir="s", threads_per_process=2, compile="max-autotune")
    Runtime(compile=True, vectorize="auto", vectorize_memory_gb=0.5, vectorize_cpu="one_at_a_time")


def test_the_engines_local_config_checks_the_runtime_fields_it_takes_as_the_runtime_does():
    with pytest.raises(ConfigError, match=r"^model\.runtime\.compile='fast'"):
        LocalConfig(8, compile="fast")
    with pytest.raises(ConfigError, match=r"^model\.runtime\.vectorize=0 "):
        LocalConfig(8, vectorize=0)


def test_as_runtime_takes_a_runtime_a_mapping_or_none():
    runtime = Runtime(vectorize=4)
    assert as_runtime(runtime) is runtime
    assert as_runtime(None) == Runtime()
    assert as_runtime({"vectorize": "auto", "threads_per_process": 1}) == Runtime(
        vectorize="auto", threads_per_process=1
    )
    with pytest.raises(
        ConfigError, match=r"^model\.runtime\.vectorise is not a field of the runtime; use one"
    ):
        as_runtime({"vectorise": 4})
    with pytest.raises(ConfigError, match=r"^model\.runtime=4 must be a Runtime"):
        as_runtime(4)  # type: ignore[arg-type]


def test_upgrade_model_moves_the_fields_given_at_the_models_level_into_runtime():
    old = {"participation": 0.5, "vectorize": "auto", "threads_per_process": 1, "compile": False}
    assert upgrade_model(old) == {
        "participation": 0.5,
        "runtime": {"vectorize": "auto", "threads_per_process": 1, "compile": False},
    }
    # runtime's own fields win over the former ones; the others join them
    mixed = {"vectorize": 2, "state_dir": "s", "runtime": {"vectorize": 4}}
    assert upgrade_model(mixed) == {"runtime": {"vectorize": 4, "state_dir": "s"}}
    for unchanged in ({}, {"runtime": {"vectorize": 4}, "participation": 1.0}, {"runtime": None}):
        assert upgrade_model(unchanged) == unchanged


def test_upgrade_flat_renames_a_checkpoints_saved_hparams():
    saved = {
        "model.vectorize": 4,
        "model.participation": 0.5,
        "model.state_dir": None,
        "model.client.lr": 0.1,
    }
    assert upgrade_flat(saved) == {
        "model.runtime.vectorize": 4,
        "model.participation": 0.5,
        "model.runtime.state_dir": None,
        "model.client.lr": 0.1,
    }
    assert upgrade_flat({"model.runtime.vectorize": 4}) == {"model.runtime.vectorize": 4}
