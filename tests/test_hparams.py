"""The constructor arguments a checkpoint saves, and the objects built back from them."""

import lightning as L
import pytest
import yaml
from torch import nn

from fl_lightning.data import Dirichlet, FederatedDataModule
from fl_lightning.errors import ConfigError
from fl_lightning.hparams import class_config, global_seed, instantiate, saved_config
from fl_lightning.lightning.module import FederatedModule
from fl_lightning.strategies import FedProx


def test_an_object_is_its_class_and_the_arguments_it_keeps():
    config = class_config(FedProx(mu=0.25))
    assert config == {
        "class_path": "fl_lightning.strategies.fedprox.FedProx",
        "init_args": config["init_args"],
    }
    assert config["init_args"]["mu"] == 0.25
    rebuilt = instantiate(config, "model.strategy")
    assert type(rebuilt) is FedProx and rebuilt.mu == 0.25
    assert class_config((1, "a")) == [1, "a"]
    assert class_config(nn.Linear(3, 2))["init_args"] == {"in_features": 3, "out_features": 2}


def test_a_lazy_default_is_the_class_it_stands_for():
    partition = FederatedDataModule().partition  # the lazy Dirichlet(alpha=0.5) default
    config = class_config(partition)
    assert config["class_path"] == "fl_lightning.data.Dirichlet" and config["init_args"]["alpha"] == 0.5
    assert type(instantiate(config, "data.partition")) is Dirichlet


def test_a_class_of_a_module_not_imported_is_refused_not_imported():
    with pytest.raises(ConfigError, match=r"^model.client.net: .* not imported; import some_user_module"):
        instantiate({"class_path": "some_user_module.Net", "init_args": {}}, "model.client.net")
    with pytest.raises(ConfigError, match="does not exist here"):
        instantiate({"class_path": "fl_lightning.strategies.NoSuchStrategy"}, "model.strategy")


def test_modules_follow_the_last_seed_everything_unless_given_one():
    assert global_seed() == 0 and FederatedModule().seed == 0
    L.seed_everything(7, verbose=False)
    assert FederatedModule().seed == 7 and FederatedDataModule().seed == 7
    assert FederatedModule(seed=3).seed == 3 and FederatedDataModule(seed=4).seed == 4


def test_a_checkpoint_without_saved_arguments_takes_its_run_folders_config(tmp_path):
    run = tmp_path / "version_0-fedavg-iid"  # a labelled run folder
    (run / "checkpoints").mkdir(parents=True)
    config = {"seed_everything": 5, "model": {"local_steps": 3}, "data": {"seed": None, "num_clients": 4}}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    ckpt = run / "checkpoints" / "last.ckpt"
    assert saved_config({}, ckpt, "hyper_parameters", "model") == {"local_steps": 3, "seed": 5}
    assert saved_config({}, ckpt, "datamodule_hyper_parameters", "data") == {"seed": 5, "num_clients": 4}
    assert saved_config(
        {"hyper_parameters": {"seed": 1, "_instantiator": "x"}}, ckpt, "hyper_parameters", "model"
    ) == {"seed": 1}
    with pytest.raises(ConfigError, match="no config.yaml"):
        saved_config({}, tmp_path / "elsewhere.ckpt", "hyper_parameters", "model")
