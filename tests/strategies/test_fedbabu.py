"""FedBABU: only the body trains and is aggregated; the head stays at its initialisation until fine-tuning."""

import pytest
import torch
from drift_helpers import LeastSquares, single_client
from personal_helpers import record_payloads
from torch import nn

from fl_lightning.engine.local import LocalConfig, local_training, train_client
from fl_lightning.errors import ConfigError
from fl_lightning.strategies import FedBABU

from conftest import global_weights, make_data, make_module

BODY, HEAD = "net.0.weight", "net.1.weight"


def test_a_body_step_by_hand_under_the_frozen_head():
    # f = 1/2 mean_j (h . (B x_j) - y_j)^2 with body B (2x2) and head h (1x2), full batch, lr 0.1, K = 2
    x = torch.tensor([[1.0, 2.0], [0.5, -1.0], [2.0, 0.0]], dtype=torch.float64)
    y = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)
    net = nn.Sequential(nn.Linear(2, 2, bias=False), nn.Linear(2, 1, bias=False)).double()
    h0 = torch.tensor([[0.5, -2.0]], dtype=torch.float64)
    with torch.no_grad():
        net[1].weight.copy_(h0)
    worker = LeastSquares(net, lr=0.1, momentum=0.0)
    strategy = FedBABU()
    strategy.setup(worker, 1)
    with torch.no_grad():
        net[1].weight.fill_(7.0)  # a stale head on the worker: the client starts from h^0 anyway
    b = torch.tensor([[1.0, 0.0], [-1.0, 2.0]], dtype=torch.float64)
    res = train_client(
        worker, strategy, {"weights": {BODY: b}}, {}, single_client(x, y), 0, LocalConfig(3, local_steps=2)
    )
    for _ in range(2):
        r = (x @ b.T @ h0.T).squeeze(-1) - y
        b = b - 0.1 * h0.T @ (r @ x / len(y))[None]
    assert set(res.upload["weights"]) == {BODY}
    torch.testing.assert_close(res.upload["weights"][BODY], b)
    assert torch.equal(net[1].weight.detach(), h0) and net[1].weight.requires_grad


def test_the_head_is_never_sent_nor_changed_and_evaluation_fine_tunes(fit):
    module = make_module(FedBABU(finetune_epochs=1))
    seen = record_payloads(module.strategy)
    start = global_weights(module)
    fit(module, rounds=2)
    end = global_weights(module)
    head = {"net.classifier.2.weight", "net.classifier.2.bias"}
    assert not head & seen.names() and seen.names()
    assert all(torch.equal(start[n], end[n]) for n in head)
    assert any(not torch.equal(start[n], end[n]) for n in end if n not in head)
    data = make_data()
    data.setup("fit")
    client = data.clients[0]
    deployed = {}
    for epochs in (0, 1):
        worker = module.worker
        worker.load_state_dict(module.client.state_dict())
        FedBABU(finetune_epochs=epochs).adapt(worker, client, {}, local_training(LocalConfig(8)))
        deployed[epochs] = {n: t.detach().clone() for n, t in worker.state_dict().items()}
    assert all(torch.equal(deployed[0][n], end[n]) for n in end)
    assert any(not torch.equal(deployed[1][n], end[n]) for n in head)  # the head fine-tunes too


def test_bad_fine_tuning_epochs_name_the_field():
    with pytest.raises(ConfigError, match=r"^model\.strategy\.finetune_epochs=-1 must be"):
        FedBABU(finetune_epochs=-1)
