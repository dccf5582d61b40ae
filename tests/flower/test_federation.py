"""Building an fl_lightning run from its config for the Flower apps: bad input is one line."""

from __future__ import annotations

import pytest

pytest.importorskip("flwr")

from flower_helpers import RECIPE

from fl_lightning.errors import ConfigError
from fl_lightning.flower import load_federation, require_flwr
from fl_lightning.flower.federation import cached_federation


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
