"""fl_lightning.models.linear: multinomial logistic regression, on vectors and on bags of words."""

from __future__ import annotations

import pytest
import torch

from fl_lightning.api.client import ClientModule
from fl_lightning.data import FederatedDataModule, NaturalUsers
from fl_lightning.errors import ConfigError
from fl_lightning.lightning.module import FederatedModule
from fl_lightning.models import LogisticRegression, list_models, size_to_data
from fl_lightning.strategies import FedAvg

from conftest import make_trainer


def test_sizes_follow_float_data():
    net = LogisticRegression()
    size_to_data(net, (60,), 10, None)
    assert net.linear.in_features == 60 and net.linear.out_features == 10
    x = torch.randn(4, 60)
    torch.testing.assert_close(net(x), x @ net.linear.weight.T + net.linear.bias)
    images = LogisticRegression()
    images.fit_data((1, 28, 28), 62, None)
    assert images(torch.randn(2, 1, 28, 28)).shape == (2, 62)
    assert "logistic_regression" in list_models()


def test_token_inputs_are_a_bag_of_words():
    net = LogisticRegression()
    net.fit_data((25,), 2, 6)
    with torch.no_grad():
        net.embed.weight.copy_(torch.randn(6, 2))
        net.bias.copy_(torch.randn(2))
    ids = torch.tensor([[1, 1, 3, 5, 5], [0, 2, 2, 2, 4]])
    counts = torch.stack([torch.bincount(row, minlength=6) for row in ids]).float()
    torch.testing.assert_close(net(ids), counts @ net.embed.weight + net.bias)


def test_bad_sizes():
    with pytest.raises(ConfigError, match=r"model\.client\.net\.input_dim=0"):
        LogisticRegression(input_dim=0)
    with pytest.raises(ConfigError, match="not both"):
        LogisticRegression(input_dim=3, vocab_size=4)
    with pytest.raises(RuntimeError, match="no sizes yet"):
        LogisticRegression()(torch.zeros(1, 3))


def test_synthetic_one_one_trains(tmp_path):
    torch.manual_seed(0)
    client = ClientModule(LogisticRegression(), lr=0.05, momentum=0.0)
    module = FederatedModule(client, FedAvg(), clients_per_round=10, local_steps=10)
    dm = FederatedDataModule("fedprox_synthetic", partition=NaturalUsers(), batch_size=10)
    trainer = make_trainer(tmp_path, rounds=3)
    trainer.fit(module, datamodule=dm)
    assert module.client.net.linear.weight.shape == (10, 60)
    assert trainer.callback_metrics["global/acc"].item() > 0.2  # above chance (10 classes) after 3 rounds
