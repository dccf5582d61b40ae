"""Building an fl_lightning run from its config for the Flower apps: bad input is one line."""

from __future__ import annotations

import pytest

pytest.importorskip("flwr")

import torch
from flower_helpers import RECIPE
from lightning.pytorch.plugins.precision import MixedPrecision, Precision

from fl_lightning.engine.executors import Sequential
from fl_lightning.errors import ConfigError
from fl_lightning.flower import load_federation, require_flwr
from fl_lightning.flower.federation import cached_federation, node_precision


def test_a_missing_config_is_one_line(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_federation(tmp_path / "nope.yaml")
    assert "is not a file" in str(err.value) and "\n" not in str(err.value)


def test_a_relative_config_is_read_from_root():
    fed = load_federation(RECIPE.name, root=RECIPE.parent)
    assert fed.num_clients == 4 and len(fed.data.clients) == 4
    assert fed.module.engine.clients is fed.data.clients


def test_a_bad_value_is_the_cli_one_line_error():
    with pytest.raises(ConfigError) as err:
        load_federation(RECIPE, ["--model.participation=2"])
    assert "model.participation" in str(err.value) and "\n" not in str(err.value)


def test_a_parse_error_is_one_line():
    with pytest.raises(ConfigError) as err:
        load_federation(RECIPE, ["--model.no_such_option=1"])
    assert str(err.value).startswith(str(RECIPE)) and "\n" not in str(err.value)


def test_the_federation_is_built_once_per_process():
    assert cached_federation(RECIPE) is cached_federation(str(RECIPE))


def test_the_initial_model_follows_seed_everything():
    a, b = load_federation(RECIPE), load_federation(RECIPE)
    c = load_federation(RECIPE, ["--seed_everything=1"])
    wa, wb, wc = (f.module.client.state_dict()["net.net.1.weight"] for f in (a, b, c))
    assert wa.equal(wb) and not wa.equal(wc)


def test_a_missing_extra_names_the_install_command():
    with pytest.raises(ModuleNotFoundError) as err:
        require_flwr("flwr>=999")
    assert "pip install 'fl_lightning[flwr]'" in str(err.value) and "\n" not in str(err.value)
    require_flwr()  # installed here


def test_a_node_engine_has_the_run_precision_and_runs_clients_one_at_a_time():
    fed = load_federation(RECIPE, ["--trainer.precision=bf16-mixed", "--model.vectorize=2"])
    precision = fed.module.engine.precision
    assert isinstance(precision, MixedPrecision) and precision.precision == "bf16-mixed"
    assert type(fed.executor) is Sequential and fed.executor is fed.module.engine.executor
    assert type(load_federation(RECIPE).module.engine.precision) is Precision  # 32-true, as fit's


def test_node_precision_is_lightnings_choice_or_one_line():
    assert node_precision("bf16-true", torch.device("cpu")).precision == "bf16-true"
    with pytest.raises(ConfigError) as err:
        node_precision("fp8", torch.device("cpu"))
    assert str(err.value).startswith("flower: trainer.precision='fp8' cannot apply on this node (")
    assert "\n" not in str(err.value)
