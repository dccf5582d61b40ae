"""fl_lightning.config.legacy: data.dataset as spelled before datasets were classes keeps working."""

from __future__ import annotations

import pytest
import yaml

from fl_lightning.config.legacy import upgrade_args, upgrade_config, upgrade_data

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
