"""Head/body splits of a network for the personalised baselines (FedPer, FedRep, LG-FedAvg)."""

import pytest

from fl_lightning.api.client import ClientModule
from fl_lightning.errors import ConfigError
from fl_lightning.functional.representation import head_names, linear_layer_names
from fl_lightning.models import Decomposed, LeNet, SmallCNN, TorchvisionResNet18


def test_the_default_head_is_the_last_linear_layer_of_each_model():
    lenet = ClientModule(LeNet(), lr=0.1, momentum=0.0)
    assert linear_layer_names(lenet) == ["net.classifier.0", "net.classifier.2", "net.classifier.5"]
    assert head_names(lenet) == {"net.classifier.5.weight", "net.classifier.5.bias"}
    assert head_names(lenet, 2) == {f"net.classifier.{i}.{p}" for i in (2, 5) for p in ("weight", "bias")}
    assert head_names(SmallCNN()) == {"classifier.2.weight", "classifier.2.bias"}
    assert head_names(Decomposed(SmallCNN(), num_atoms=4)) == {
        "net.classifier.2.weight",
        "net.classifier.2.bias",
    }
    assert head_names(TorchvisionResNet18(num_classes=10)) == {"net.fc.weight", "net.fc.bias"}


def test_module_names_select_every_entry_below_them():
    assert head_names(SmallCNN(), ["classifier"]) == {
        f"classifier.{i}.{p}" for i in (0, 2) for p in ("weight", "bias")
    }
    assert head_names(SmallCNN(), ["classifier.0.weight"]) == {"classifier.0.weight"}


def test_bad_heads_name_the_field():
    with pytest.raises(ConfigError, match=r"model.strategy.head=3 must count 1..2"):
        head_names(SmallCNN(), 3)
    with pytest.raises(ConfigError, match="model.strategy.head: 'fc'"):
        head_names(SmallCNN(), ["fc"])
