"""FedSAM: rho = 0 is FedAvg bit for bit; a round of one step is the hand-computed SAM step."""

import copy

import pytest
import torch

from fl_lightning.api.client import ClientModule
from fl_lightning.errors import ConfigError
from fl_lightning.models import MLP
from fl_lightning.strategies import FedAvg, FedSAM

from conftest import global_weights, make_data, make_module


def _equal(a, b):
    wa, wb = global_weights(a), global_weights(b)
    return all(torch.equal(wa[k], wb[k]) for k in wa)


def test_fedsam_rho_zero_is_bit_identical_to_fedavg(fit):
    a = make_module(FedAvg(), clients_per_round=3)
    b = make_module(FedSAM(rho=0.0, clip_norm=None), clients_per_round=3)
    fit(a, rounds=3)
    fit(b, rounds=3)
    assert _equal(a, b)
    c = make_module(FedSAM(rho=0.05, clip_norm=None), clients_per_round=3)
    fit(c, rounds=3)
    assert not _equal(a, c)


def test_fedsam_clipping_equals_the_loops_clipping_with_weight_decay(fit):
    kw = {"client_kw": {"weight_decay": 0.05}, "local_steps": 3}
    a = make_module(FedAvg(), grad_clip_norm=0.05, **kw)
    b = make_module(FedSAM(rho=0.0, clip_norm=0.05), **kw)
    c = make_module(FedAvg(), **kw)
    for m in (a, b, c):
        fit(m, rounds=2)
    assert _equal(a, b)
    assert not _equal(a, c)  # the clipping was active


class Recording(ClientModule):
    def __init__(self):
        super().__init__(
            MLP(in_features=64, num_classes=10, hidden=[8]), lr=0.2, momentum=0.0, weight_decay=0.01
        )
        self.batches: list[tuple[torch.Tensor, torch.Tensor]] = []

    def training_step(self, batch, batch_idx):
        self.batches.append((batch[0].clone(), batch[1].clone()))
        return super().training_step(batch, batch_idx)


def test_one_client_one_step_round_is_the_sam_step(fit):
    rho = 0.5
    module = make_module(FedSAM(rho=rho, clip_norm=None), local_steps=1)
    module.client = Recording()
    start = copy.deepcopy(module.client.net)
    fit(module, rounds=1, data=make_data(num_clients=1, batch_size=16), limit_val_batches=0)
    x, y = module.worker.batches[0]
    # by hand: g at w, e = rho g / ||g|| (one norm), g_hat at w + e, SGD step with weight decay at w
    net = copy.deepcopy(start)
    params = list(net.parameters())
    g = torch.autograd.grad(torch.nn.functional.cross_entropy(net(x), y), params)
    norm = torch.sqrt(sum(t.pow(2).sum() for t in g))
    w0 = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p, t in zip(params, g):
            p.add_(t * rho / (norm + 1e-7))
    g_hat = torch.autograd.grad(torch.nn.functional.cross_entropy(net(x), y), params)
    expected = [w - 0.2 * (gh + 0.01 * w) for w, gh in zip(w0, g_hat)]
    got = list(module.client.net.parameters())
    for e, p in zip(expected, got):
        torch.testing.assert_close(p.detach(), e, rtol=1e-5, atol=1e-6)
    plain = [w - 0.2 * (t + 0.01 * w) for w, t in zip(w0, g)]  # the SGD step is measurably different
    assert max((p.detach() - q).abs().max().item() for p, q in zip(got, plain)) > 1e-4


def test_fedsam_communicates_one_model_each_way(fit):
    a, b = make_module(FedAvg()), make_module(FedSAM())
    fit(a, rounds=1)
    fit(b, rounds=1)
    assert a.history[0].bytes_down == b.history[0].bytes_down
    assert a.history[0].bytes_up == b.history[0].bytes_up


def test_fedsam_bad_arguments_name_the_field():
    with pytest.raises(ConfigError, match="model.strategy.rho"):
        FedSAM(rho=-0.1)
    with pytest.raises(ConfigError, match="model.strategy.clip_norm"):
        FedSAM(clip_norm=0.0)
