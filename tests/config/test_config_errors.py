"""A config's one-line messages (config/errors.py): "did you mean", jsonargparse's and Lightning's errors."""

import pytest
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from fl_lightning.config.errors import (
    class_options,
    close_names,
    close_options,
    config_keys,
    did_you_mean,
    find_key,
    parse_error,
    rewrite_float_arg,
    trainer_error,
)

OPTIONS = [
    "model.lr_decay",
    "model.participation",
    "model.seed",
    "model.client",
    "model.client.lr",
    "model.client.momentum",
    "trainer.max_steps",
    "trainer.min_steps",
    "trainer.max_time",
    "trainer.accelerator",
]


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("model.lr", ["model.lr_decay", "model.client.lr"]),  # a prefix, then the same name deeper
        ("model.part", ["model.participation"]),
        ("trainer.max_step", ["trainer.max_steps"]),  # a clear match leaves the look-alikes out
        ("trainer.acelerator", ["trainer.accelerator"]),
        ("model.clinet.lr", ["model.client.lr"]),  # a typo in the parent
        ("data.nothing", []),
    ],
)
def test_close_options(given, expected):
    assert close_options(given, OPTIONS) == expected


def test_close_names_prefers_a_match_ignoring_case_alone():
    names = ["FedProx", "FedPer", "FedRep", "Scaffold"]
    assert close_names("fedprox", names) == ["FedProx"]
    assert close_names("scafold", names) == ["Scaffold"]
    assert close_names("zzz", names) == []


def test_did_you_mean_lists_the_choices():
    assert did_you_mean(["a"]) == "did you mean a?"
    assert did_you_mean(["a", "b", "c"]) == "did you mean a, b or c?"


def test_config_keys_leave_out_class_path_and_init_args():
    config = {
        "model": {"client": {"class_path": "C", "init_args": {"lr": 0.1, "net": {"init_args": {"w": 1}}}}}
    }
    assert config_keys(config) == [
        "model",
        "model.client",
        "model.client.lr",
        "model.client.net",
        "model.client.net.w",
    ]
    assert find_key(config, "w", 1) == "model.client.net.w"
    assert find_key(config, "w", True) is None  # a value of another type is not the one


def test_config_keys_leave_out_where_a_nested_config_was_read_from(tmp_path):
    """``--data=data.yaml`` keeps the file's path in the parsed config as ``__path__``: not an option."""
    from fl_lightning.config.parser import FederatedArgumentParser

    (tmp_path / "data.yaml").write_text("num_clients: 4\n")
    parser = FederatedArgumentParser()
    parser.add_class_arguments(DataArgs, "data")
    parsed = parser.parse_args([f"--data={tmp_path / 'data.yaml'}"]).as_dict()
    assert "__path__" in parsed["data"]  # what jsonargparse does, and why config_keys must skip it
    assert config_keys(parsed) == ["data", "data.num_clients", "data.seed"]
    nested = {"model": {"strategy": {"class_path": "S", "init_args": {"__path__": "s.yaml", "mu": 0.1}}}}
    assert config_keys(nested) == ["model", "model.strategy", "model.strategy.mu"]


class DataArgs:
    def __init__(self, num_clients: int = 10, seed: int = 0) -> None:
        self.num_clients, self.seed = num_clients, seed


class Base:
    def __init__(self, alpha: float = 1.0) -> None:
        self.alpha = alpha


class Child(Base):
    def __init__(self, beta: float = 2.0, **kwargs: float) -> None:
        super().__init__(**kwargs)
        self.beta = beta


def test_class_options_follow_kwargs_to_the_base_class():
    assert class_options(f"{__name__}.Child") == ["beta", "alpha"]
    assert class_options(f"{__name__}.Base") == ["alpha"]
    assert class_options("no.such.Class") == []


def test_a_nested_unknown_option_names_the_field_and_the_close_one():
    message = (
        "Parser key \"model.strategy\":\n  Problem with given class_path 'fl_lightning.strategies.FedProx':\n"
        "    Option 'm' is not accepted"
    )
    line, retry = parse_error(message, {}, lambda: [], "see --help")
    assert line == "model.strategy.m is not an option of FedProx; did you mean model.strategy.mu?"
    assert retry is None


def test_a_non_finite_float_asks_for_a_retry():
    message = (
        "Parser key \"model.client\":\n  Problem with given class_path 'fl_lightning.ClientModule':\n"
        "    Parser key \"lr\": Expected a <class 'float'>. Got value: NaN"
    )
    line, retry = parse_error(message, {}, lambda: [], "see --help")
    assert (line, retry) == ("model.client.lr=NaN must be a finite number", ("model.client.lr", "NaN"))
    args = ["--model.client.init_args.lr=NaN", "--model.participation", "-inf"]
    assert rewrite_float_arg(args, "model.client.lr", "NaN")[0] == "--model.client.init_args.lr=.nan"
    assert rewrite_float_arg(args, "model.participation", "-inf")[2] == "-.inf"
    assert rewrite_float_arg(args, "model.seed", "nan") is None  # given in a config file: nothing to rewrite


def test_an_unknown_bare_class_name_gets_the_registry_names():
    message = (
        'Parser key "model.strategy":\n\n  - Expected a path but fedprox either not accessible or invalid\n'
        "  - Expected a dot import path string: fedprox"
    )
    registries = {"strategy": lambda: ["FedAvg", "FedProx"]}
    line, _ = parse_error(message, registries, lambda: [], "")
    assert line == "model.strategy: 'fedprox' is not a known strategy; did you mean FedProx?"
    line, _ = parse_error(message.replace("fedprox", "xyz"), registries, lambda: [], "")
    assert line == (
        "model.strategy: 'xyz' is not a known strategy; choose one of FedAvg, FedProx; a strategy of your "
        "own is named by its class path: --model.strategy=my_package.my_module.xyz"
    )
    line, _ = parse_error(message.replace("fedprox", "MyProx"), registries, lambda: [], "")
    assert line == (
        "model.strategy: 'MyProx' is not a known strategy; did you mean FedProx? (a strategy of your own is "
        "named by its class path: --model.strategy=my_package.my_module.MyProx)"
    )


def test_a_registered_name_that_another_library_also_has_asks_for_the_class_path():
    # torchvision.ops.MLP and fl_lightning.models.MLP: jsonargparse cannot resolve the bare name
    message = (
        'Parser key "model.client.net":\n\n  - Expected a path but MLP either not accessible or invalid\n'
        "  - Expected a dot import path string: MLP"
    )
    line, _ = parse_error(message, {"net": lambda: ["LeNet", "MLP"]}, lambda: [], "")
    assert line == (
        "model.client.net: 'MLP' names more than one class of the libraries loaded; give its class path, "
        "--model.client.net=fl_lightning.models.MLP"
    )


DEFAULTS = {"accelerator": "auto", "max_steps": 40, "limit_val_batches": None, "devices": "auto"}


def test_a_trainer_error_names_the_flag_the_message_names():
    err = MisconfigurationException("`max_steps` must be a non-negative integer or -1.")
    line = trainer_error(err, {**DEFAULTS, "max_steps": -5}, DEFAULTS)
    assert line.startswith("trainer.max_steps=-5: `max_steps` must be a non-negative integer")


def test_a_trainer_error_names_the_flag_whose_value_it_quotes():
    err = MisconfigurationException("No supported gpu backend found!")
    line = trainer_error(err, {**DEFAULTS, "accelerator": "gpu"}, DEFAULTS)
    assert line.startswith("trainer.accelerator=gpu: Lightning finds no usable gpu here")
    assert "--trainer.accelerator=auto" in line


def test_a_missing_package_names_the_device_flag_that_was_set():
    err = ModuleNotFoundError("Requirement 'torch_xla>=1.13' not met.")
    assert trainer_error(err, {**DEFAULTS, "accelerator": "tpu"}, DEFAULTS).startswith(
        "trainer.accelerator=tpu:"
    )
