"""fl_lightning.config.legacy: data.dataset as spelled before datasets were classes, the round policy as
spelled inside model.system before it was its own object (model.round_policy), and the runtime's knobs as
spelled at the model's own level before they were one object (model.runtime), keep working."""

from __future__ import annotations

from dataclasses import asdict

import pytest
import yaml

from fl_lightning.config.legacy import Option, options, upgrade_args, upgrade_config, upgrade_data
from fl_lightning.engine.runtime import Runtime

FPS_DEFAULTS = {
    "alpha": 1.0,
    "beta": 1.0,
    "iid": False,
    "num_devices": 30,
    "dimension": 60,
    "num_classes": 10,
    "train_fraction": 0.9,
    "seed": 0,
}


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["fit", "--data.dataset=shakespeare", "--data.shakespeare.max_windows=500"],
            ["fit", "--data.dataset=Shakespeare", "--data.dataset.max_windows=500"],
        ),
        (  # options before the dataset: moved after it, so that they apply to it
            ["--data.fedprox_synthetic.alpha", "1", "--data.dataset", "fedprox_synthetic", "--x=1"],
            ["--data.dataset=FedProxSynthetic", "--data.dataset.alpha=1", "--x=1"],
        ),
        (
            ["--data.dataset=synthetic:cifar100", "--data.synthetic.train_size=64"],
            ["--data.dataset=Synthetic", "--data.dataset.like=cifar100", "--data.dataset.train_size=64"],
        ),
        (  # options of a dataset the command line does not choose were ignored: they still are
            ["--data.dataset=digits", "--data.shakespeare.max_windows=5"],
            ["--data.dataset=Digits"],
        ),
        (  # the dataset comes from a config file: the options apply to it
            ["--config=c.yaml", "--data.fedprox_synthetic.beta=0"],
            ["--config=c.yaml", "--data.dataset.beta=0"],
        ),
        (["--data.synthetic=null", "--data.dataset=Digits"], ["--data.dataset=Digits"]),
        (
            ["--data.dataset=FCUBE", "--data.dataset.seed=5"],
            ["--data.dataset=FCUBE", "--data.dataset.seed=5"],
        ),
        (["--data.dataset=nosuch"], ["--data.dataset=nosuch"]),  # the data module's one line names it
    ],
)
def test_command_lines(args, expected):
    assert upgrade_args(args) == expected


def test_a_former_config_yaml_data_section_is_the_class_with_its_arguments_in_full():
    old = {
        "dataset": "fedprox_synthetic",
        "root": "data",
        "synthetic": None,
        "shakespeare": None,
        "leaf": None,
        "fedprox_synthetic": {**FPS_DEFAULTS, "alpha": 0.5},
    }
    assert upgrade_data(old) == {
        "dataset": {
            "class_path": "fl_lightning.data.FedProxSynthetic",
            "init_args": {**FPS_DEFAULTS, "alpha": 0.5},
        },
        "root": "data",
    }
    assert upgrade_data({"dataset": "digits", "synthetic": None}) == {
        "dataset": {"class_path": "fl_lightning.data.Digits"}
    }
    short = upgrade_data({"dataset": "synthetic:digits", "synthetic": {"train_size": 200}})["dataset"]
    assert short["class_path"] == "fl_lightning.data.Synthetic"
    assert short["init_args"]["like"] == "digits" and short["init_args"]["train_size"] == 200
    assert short["init_args"]["noise"] == 2.0  # the defaults written out, as a new config.yaml has them
    # under a subcommand's section of a root-level file too; the class form is left as it is
    assert upgrade_config({"fit": {"data": {"dataset": "fcube"}}})["fit"]["data"]["dataset"] == {
        "class_path": "fl_lightning.data.FCUBE",
        "init_args": {"samples_per_party": 1000, "test_size": 1000, "seed": 0},
    }
    new = {"data": {"dataset": {"class_path": "fl_lightning.data.Digits"}}}
    assert upgrade_config(new) == new


def test_former_spellings_build_the_same_run_as_the_classes(tmp_path):
    """A former config.yaml and command line resolve to the class form, with the checkpoint fingerprint that
    checkpoints written before the classes recorded (so they resume), and a sweep finds its old runs."""
    from fl_lightning.config import build_run, resolver
    from fl_lightning.sweep.folders import config_digest

    resolve = resolver()
    new_args = ["--data.dataset=FedProxSynthetic", "--data.dataset.alpha=0.5"]
    new = resolve(new_args, False)
    assert new["data"]["dataset"] == {
        "class_path": "fl_lightning.data.FedProxSynthetic",
        "init_args": {**FPS_DEFAULTS, "alpha": 0.5},
    }
    assert resolve(["--data.dataset=fedprox_synthetic", "--data.fedprox_synthetic.alpha=0.5"], False) == new
    old = {**new, "data": {**new["data"], "dataset": "fedprox_synthetic", "synthetic": None, "leaf": None}}
    old["data"]["shakespeare"] = None
    old["data"]["fedprox_synthetic"] = {**FPS_DEFAULTS, "alpha": 0.5}
    assert config_digest(old) == config_digest(new)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(old))
    assert resolve([f"--config={path}"], False) == new
    facts = build_run([f"--config={path}"], trainer=False).datamodule.fingerprint()
    assert facts["data.dataset"] == "fedprox_synthetic"
    assert facts["data.fedprox_synthetic"] == (
        "FedProxSyntheticData(alpha=0.5, beta=1.0, iid=False, num_devices=30, dimension=60, num_classes=10, "
        "train_fraction=0.9, seed=0)"
    )


# ---------------------------------------------------------------------------------------- the round policy
DEVICES = "fl_lightning.engine.system.Devices"
STRAGGLERS = "fl_lightning.engine.system.Stragglers"
POLICY_DEFAULTS = {
    "deadline_s": None,
    "policy": "drop",
    "over_selection": 0.0,
    "target_accuracy": None,
    "max_sim_time_s": None,
}


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["fit", "--model.system=Devices", "--model.system.init_args.policy=partial", "--x=1"],
            ["fit", "--model.system=Devices", "--model.round_policy.policy=partial", "--x=1"],
        ),
        (
            ["--model.system.deadline_s", "30", "--model.system.speed=5"],
            ["--model.round_policy.deadline_s=30", "--model.system.speed=5"],
        ),
        (
            ['--model.system={"class_path": "Devices", "init_args": {"speed": 5, "max_sim_time_s": 100}}'],
            [
                '--model.system={"class_path": "Devices", "init_args": {"speed": 5}}',
                "--model.round_policy.max_sim_time_s=100",
            ],
        ),
        (
            ["--model.system.init_args={over_selection: 0.3, target_accuracy: null}"],
            [
                "--model.system.init_args={}",
                "--model.round_policy.over_selection=0.3",
                "--model.round_policy.target_accuracy=null",
            ],
        ),
        (  # the current spelling, and a system option that is not the policy's: as they are
            ["--model.system.speed=5", "--model.round_policy.deadline_s=3", "--model.system=Trace"],
            ["--model.system.speed=5", "--model.round_policy.deadline_s=3", "--model.system=Trace"],
        ),
    ],
)
def test_policy_command_lines(args, expected):
    assert upgrade_args(args) == expected


def test_a_former_config_with_the_policy_inside_the_system_model_is_the_round_policy():
    old = {
        "fit": {
            "model": {
                "system": {"class_path": STRAGGLERS, "init_args": {"fraction": 0.9, "policy": "partial"}}
            }
        }
    }
    assert upgrade_config(old) == {
        "fit": {
            "model": {
                "system": {"class_path": STRAGGLERS, "init_args": {"fraction": 0.9}},
                "round_policy": {"policy": "partial"},
            }
        }
    }


def test_former_policy_spellings_resolve_as_the_round_policy_and_a_sweep_finds_old_runs(tmp_path):
    """The recipes' flags, a config file with the policy inside model.system and the config.yaml of a run
    written before model.round_policy resolve to the config of the current spelling (the same run), and
    the sweep's digest of such a config.yaml is the current one's (it finds the runs it did before)."""
    from fl_lightning.config import resolver
    from fl_lightning.sweep.folders import config_digest

    resolve = resolver()
    new_args = [
        "--model.system=Devices",
        "--model.round_policy.deadline_s=30",
        "--model.round_policy.policy=partial",
    ]
    new = resolve(new_args, False)
    assert new["model"]["round_policy"] == {**POLICY_DEFAULTS, "deadline_s": 30.0, "policy": "partial"}
    assert "deadline_s" not in new["model"]["system"]["init_args"]
    old_args = [
        "--model.system=Devices",
        "--model.system.init_args.deadline_s=30",
        "--model.system.policy=partial",
    ]
    assert resolve(old_args, False) == new
    # a run's config.yaml from before: the policy's fields among the system model's init_args, no round_policy
    old = {**new, "model": {k: v for k, v in new["model"].items() if k != "round_policy"}}
    system = new["model"]["system"]
    old["model"]["system"] = {**system, "init_args": {**system["init_args"], **new["model"]["round_policy"]}}
    assert config_digest(old) == config_digest(new)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(old))
    assert resolve([f"--config={path}"], False) == new
    # without a system model, a former config.yaml has no policy at all: the default policy, the same digest
    plain = resolve([], False)
    assert plain["model"]["round_policy"] == POLICY_DEFAULTS
    before = {**plain, "model": {k: v for k, v in plain["model"].items() if k != "round_policy"}}
    assert config_digest(before) == config_digest(plain)
    assert config_digest(before) != config_digest(
        resolve(["--model.round_policy.target_accuracy=0.5"], False)
    )
    # FedProx's stragglers as the recipes spell them
    stragglers = ["--model.system=Stragglers", "--model.system.fraction=0.9"]
    assert resolve([*stragglers, "--model.system.init_args.policy=partial"], False) == resolve(
        [*stragglers, "--model.round_policy.policy=partial"], False
    )


# ---------------------------------------------------------------------------------------- the runtime
RUNTIME_DEFAULTS = asdict(Runtime())  # the knobs at their defaults (tests/engine/test_runtime.py: as before)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["fit", "--model.vectorize=auto", "--model.threads_per_process", "1", "--x=1"],
            ["fit", "--model.runtime.vectorize=auto", "--model.runtime.threads_per_process=1", "--x=1"],
        ),
        (
            ["--model.vectorize_cpu", "batched", "--model.vectorize_memory_gb=0.5", "--model.compile=true"],
            [
                "--model.runtime.vectorize_cpu=batched",
                "--model.runtime.vectorize_memory_gb=0.5",
                "--model.runtime.compile=true",
            ],
        ),
        (
            ["--model.state_memory_mb=64", "--model.state_dir", "/tmp/s", "--model.local_steps", "3"],
            [
                "--model.runtime.state_memory_mb=64",
                "--model.runtime.state_dir=/tmp/s",
                "--model.local_steps",
                "3",
            ],
        ),
        (  # with the other former spellings: each rewritten, in place
            [
                "--data.dataset=fedprox_synthetic",
                "--model.system.deadline_s",
                "30",
                "--model.vectorize",
                "4",
                "--data.fedprox_synthetic.alpha=1",
            ],
            [
                "--data.dataset=FedProxSynthetic",
                "--data.dataset.alpha=1",
                "--model.round_policy.deadline_s=30",
                "--model.runtime.vectorize=4",
            ],
        ),
        (  # the current spelling, a name that only starts like a field, and a value: as they are
            ["--model.runtime.vectorize=4", "--model.vectorized=2", "--name", "--model.compile"],
            ["--model.runtime.vectorize=4", "--model.vectorized=2", "--name", "--model.runtime.compile"],
        ),
    ],
)
def test_runtime_command_lines(args, expected):
    assert upgrade_args(args) == expected


def test_the_command_lines_options_are_read_by_one_iterator():
    args = ["fit", "--model.vectorize", "4", "--model.system=Devices", "--model.compile", "--data.x", "1"]
    assert list(options(args, ("--model.",))) == [
        Option(("fit",)),
        Option(("--model.vectorize", "4"), "model.vectorize", "4"),
        Option(("--model.system=Devices",), "model.system", "Devices"),
        Option(("--model.compile",), "model.compile", None),
        Option(("--data.x",)),
        Option(("1",)),
    ]


def test_a_former_config_with_the_runtime_at_the_models_level_is_model_runtime():
    old = {"fit": {"model": {"vectorize": "auto", "participation": 0.5}}, "model": {"threads_per_process": 1}}
    assert upgrade_config(old) == {
        "fit": {"model": {"participation": 0.5, "runtime": {"vectorize": "auto"}}},
        "model": {"runtime": {"threads_per_process": 1}},
    }
    new = {"model": {"runtime": {"vectorize": 4}, "participation": 0.5}}
    assert upgrade_config(new) == new


def test_former_runtime_spellings_resolve_as_model_runtime_and_a_sweep_finds_old_runs(tmp_path):
    """The former flags (``=`` and space forms), a config file with the knobs at the model's level and the
    config.yaml of a run written before model.runtime resolve to the config of the current spelling (the same
    run), and the sweep's digest of such a config.yaml is the current one's (it finds the runs it did
    before)."""
    from fl_lightning.config import resolver
    from fl_lightning.sweep.folders import config_digest

    resolve = resolver()
    given = {"vectorize": 4, "vectorize_cpu": "batched", "threads_per_process": 1, "state_memory_mb": 64.0}
    new = resolve([f"--model.runtime.{k}={v}" for k, v in given.items()], False)
    assert new["model"]["runtime"] == {**RUNTIME_DEFAULTS, **given}
    assert not set(RUNTIME_DEFAULTS) & set(new["model"])
    assert resolve([f"--model.{k}={v}" for k, v in given.items()], False) == new
    assert resolve([a for k, v in given.items() for a in (f"--model.{k}", str(v))], False) == new
    # a config file written with the former spelling
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump({"model": given}))
    assert resolve([f"--config={path}"], False) == new
    # a run's config.yaml from before: every knob at the model's level, no model.runtime
    old = {
        **new,
        "model": {**{k: v for k, v in new["model"].items() if k != "runtime"}, **new["model"]["runtime"]},
    }
    assert config_digest(old) == config_digest(new)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(old))
    assert resolve([f"--config={path}"], False) == new
    # the defaults spelled either way (or not at all) are the same run; another vectorize is not
    plain = resolve([], False)
    assert plain["model"]["runtime"] == RUNTIME_DEFAULTS
    bare = {**plain, "model": {k: v for k, v in plain["model"].items() if k != "runtime"}}
    assert config_digest(bare) == config_digest(plain)
    assert config_digest(bare) != config_digest(resolve(["--model.vectorize=2"], False))
    # threads are how the sweep runs a run, not which run: not in the digest, in either spelling
    assert config_digest(resolve(["--model.threads_per_process=3"], False)) == config_digest(plain)
