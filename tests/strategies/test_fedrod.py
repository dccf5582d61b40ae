"""FedRoD: the generic head follows the balanced softmax, the personal head the CE of the summed logits."""

import pytest
import torch
from drift_helpers import single_client
from personal_helpers import personal_model, record_payloads
from torch import nn

from fl_lightning.api.client import ClientModule
from fl_lightning.api.task import Task
from fl_lightning.api.types import RunSpec
from fl_lightning.engine.local import LocalConfig, train_client
from fl_lightning.errors import ConfigError
from fl_lightning.strategies import FedRoD
from fl_lightning.strategies.fedrod import HEAD

from conftest import global_weights, make_module

W, B = "net.weight", "net.bias"


def test_two_local_steps_by_hand():
    # a linear classifier on 2 features (the body is the identity), 3 classes, class 2 absent on the client
    x = torch.tensor([[1.0, 2.0], [0.5, -1.0], [2.0, 0.0], [-1.0, 1.0]], dtype=torch.float64)
    y = torch.tensor([0, 0, 1, 0])
    lr = 0.5
    net = nn.Linear(2, 3).double()
    worker = ClientModule(net, lr=lr, momentum=0.0)
    strategy = FedRoD()
    strategy.setup(worker, 1)  # the personal head starts from this initial head
    wp, bp = net.weight.detach().clone(), net.bias.detach().clone()
    wg = torch.tensor([[0.1, -0.2], [0.3, 0.0], [-0.1, 0.4]], dtype=torch.float64)
    bg = torch.tensor([0.0, 0.1, -0.1], dtype=torch.float64)
    message = {"weights": {W: wg, B: bg}}
    res = train_client(worker, strategy, message, {}, single_client(x, y), 0, LocalConfig(4, local_steps=2))
    onehot = torch.nn.functional.one_hot(y, 3).double()
    log_prior = torch.tensor([3 / 4, 1 / 4, 0.0], dtype=torch.float64).log()
    for _ in range(2):
        zg = x @ wg.T + bg
        d = (torch.softmax(zg + log_prior, dim=1) - onehot) / len(y)  # dL_BSM / dlogits
        dp = (torch.softmax(zg + x @ wp.T + bp, dim=1) - onehot) / len(y)  # with the step's generic logits
        wg, bg = wg - lr * d.T @ x, bg - lr * d.sum(0)
        wp, bp = wp - lr * dp.T @ x, bp - lr * dp.sum(0)
    torch.testing.assert_close(res.upload["weights"][W], wg)
    torch.testing.assert_close(res.upload["weights"][B], bg)
    torch.testing.assert_close(res.state[HEAD + W], wp)
    torch.testing.assert_close(res.state[HEAD + B], bp)


def test_the_personal_head_stays_and_the_deployed_model_adds_the_heads(fit):
    module = make_module(FedRoD())
    seen = record_payloads(module.strategy)
    fit(module, rounds=2)
    head = {"net.classifier.2.weight", "net.classifier.2.bias"}
    assert not any(HEAD in n for n in seen.names())
    glob, state = global_weights(module), module.store.get(0)
    deployed = personal_model(module, 0)
    for n in glob:
        expected = glob[n] + state[HEAD + n] if n in head else glob[n]
        torch.testing.assert_close(deployed[n], expected)


def test_multilabel_data_is_refused_in_one_line():
    spec = RunSpec(task=Task("multilabel"), num_classes=5, num_clients=4, input_shape=(3,))
    with pytest.raises(ConfigError, match=r"^model\.strategy=FedRoD needs single-label") as err:
        FedRoD().check(ClientModule(), spec)
    assert "\n" not in str(err.value)
