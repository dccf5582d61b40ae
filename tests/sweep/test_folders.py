"""A run folder against the run the sweep would start now: finished, resume, rerun."""

from __future__ import annotations

import json

import pytest
from sweep_helpers import (
    checkpoint,
    craft_run,
    expected,
    summary,
)

from fl_lightning.sweep import (
    config_changes,
    config_digest,
    inspect_run,
)

pytest_plugins = ["sweep_helpers"]  # its fixtures (a plugin: not autouse, it would apply to every test)
pytestmark = pytest.mark.usefixtures("in_tmp_with_fake_resolver")  # each test in its own folder


def test_a_run_is_finished_only_when_it_is_the_run_the_sweep_would_start_now(tmp_path):
    assert inspect_run(tmp_path / "nothing", expected()).kind == "new"
    run = tmp_path / "run"
    craft_run(run, summary(0.9, 0.9), max_steps=3, label="r-seed0")  # labelled as a sweep labels its runs
    state = inspect_run(run, expected(3))
    assert (state.kind, state.version) == ("finished", run / "lightning_logs" / "version_0-r-seed0")

    # a shorter smoke run of the same config is not finished: it resumes to the sweep's rounds
    smoke = tmp_path / "smoke"
    v0 = craft_run(smoke, summary(0.1, 0.1) | {"rounds": 2, "max_steps": 2}, max_steps=2)
    assert inspect_run(smoke, expected(10)).kind == "rerun"  # no checkpoint to resume from
    ckpt = checkpoint(v0, 2)
    state = inspect_run(smoke, expected(10))
    assert (state.kind, state.ckpt, state.why) == ("resume", ckpt, "2 of 10 rounds done")
    assert inspect_run(smoke, expected(2)).kind == "finished"  # what it was run for
    # resumed to 10 and killed at round 7: config.yaml says 10, the summary is still the smoke run's
    (v0 / "config.yaml").write_text(json.dumps(expected(10).config))
    checkpoint(v0, 7)
    state = inspect_run(smoke, expected(10))
    assert (state.kind, state.why) == ("resume", "7 of 10 rounds done")
    # a run that went further than the sweep's rounds is not its run either
    state = inspect_run(smoke, expected(5))
    assert state.kind == "rerun" and "it ran 7 rounds; the sweep's trainer.max_steps is 5" in state.why

    # another config (a changed default or row argument): run again beside it, saying what changed
    state = inspect_run(run, expected(3, model={"client.lr": 0.05}))
    assert state.kind == "rerun" and state.why == "its config differs: model.client.lr: <unset> -> 0.05"
    # ... which, once run, is finished, and the older version still counts for the older config
    craft_run(run, summary(0.8, 0.8), model={"client.lr": 0.05}, version=1, label="r-seed0")
    assert inspect_run(run, expected(3, model={"client.lr": 0.05})).version.name == "version_1-r-seed0"
    assert inspect_run(run, expected(3)).version.name == "version_0-r-seed0"

    # an interrupted start's summary: resume from its checkpoint
    cut = tmp_path / "cut"
    v0 = craft_run(cut, summary(0.5, 0.5) | {"rounds": 1, "max_steps": 3, "interrupted": True})
    checkpoint(v0, 1)
    assert inspect_run(cut, expected(3)).kind == "resume"
    (v0 / "summary.json").write_text('{"rounds": 3')  # cut short while written
    assert inspect_run(cut, expected(3)).kind == "resume"

    # a summary written before summaries recorded max_steps: its rounds must be the sweep's, or the
    # sweep saw its fit exit 0 (stopped early by EarlyStopping)
    old = tmp_path / "old"
    v0 = craft_run(
        old, {k: v for k, v in summary(0.9, 0.9).items() if k != "max_steps"} | {"rounds": 2}, label="o-seed0"
    )
    checkpoint(v0, 2)
    assert inspect_run(old, expected(3)).kind == "resume"
    (old / "sweep.json").write_text(json.dumps({"returncode": 0, "version": "version_0-o-seed0"}))
    assert inspect_run(old, expected(3)).kind == "finished"

    failed = tmp_path / "failed"
    failed.mkdir()
    (failed / "sweep.json").write_text(json.dumps({"returncode": 2, "error": "error: x"}))
    state = inspect_run(failed, expected())
    assert (state.kind, state.error) == ("failed", "error: x")


def test_config_digest_leaves_out_where_a_run_writes_and_how_the_sweep_runs_it():
    config = {
        "seed_everything": 1,
        "trainer": {"max_steps": 5, "default_root_dir": "a", "enable_progress_bar": False},
        "model": {"runtime": {"threads_per_process": 1}, "client": {"init_args": {"lr": 0.1}}},
        "data": {"root": "x", "download": False, "num_clients": 4},
        "ckpt_path": None,
    }
    same = json.loads(json.dumps(config))
    same["trainer"].update(max_steps=50, default_root_dir="b", enable_progress_bar=True)
    same["model"]["runtime"]["threads_per_process"] = 2
    same["data"].update(root="y", download=True)
    same["ckpt_path"] = "last.ckpt"
    assert config_digest(same) == config_digest(config)
    for field in ("seed_everything", "model.client.init_args.lr", "data.num_clients"):
        other = json.loads(json.dumps(config))
        *parents, leaf = field.split(".")
        node = other
        for key in parents:
            node = node[key]
        node[leaf] = 7
        assert config_digest(other) != config_digest(config), field
        assert config_changes(config, other) == f"{field}: {_get(config, field)} -> 7"


def _get(config: dict, field: str):
    for key in field.split("."):
        config = config[key]
    return config
