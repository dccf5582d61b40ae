"""VHL: one virtual dataset for all clients and rounds, mixed into every local batch, feature calibration."""

import pytest
import torch
import torch.nn.functional as F

from fl_lightning.api.types import ClientContext
from fl_lightning.errors import ConfigError
from fl_lightning.functional.representation import features_of
from fl_lightning.functional.synthetic import virtual_contrastive_loss
from fl_lightning.strategies import VHL, FedAvg

from conftest import global_weights, make_data, make_module


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"lam": -1.0}, "lam"),
        ({"virtual_per_class": 0}, "virtual_per_class"),
        ({"temperature": 0.0}, "temperature"),
        ({"noise_std": float("inf")}, "noise_std"),
    ],
)
def test_bad_values_are_one_line_config_errors(kw, field):
    with pytest.raises(ConfigError, match=f"model.strategy.{field}"):
        VHL(**kw)


class RecordingVHL(VHL):
    """Records which client drew which virtual inputs in which round."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.seen: list[tuple[int, int, torch.Tensor]] = []

    def virtual_data(self, input_shape, num_classes):
        xv, yv = super().virtual_data(input_shape, num_classes)
        self.seen_data = (xv, yv)
        return xv, yv

    def local_loss(self, module, ctx, batch, outputs):
        loss = super().local_loss(module, ctx, batch, outputs)
        self.seen.append((ctx.client_id, ctx.round, self.seen_data[0][ctx.scratch["vhl/index"]].clone()))
        return loss


def test_virtual_data_are_identical_across_clients_and_rounds_and_mixed_into_every_batch(fit):
    strategy = RecordingVHL(virtual_per_class=5)
    module = make_module(strategy, local_steps=3)
    fit(module, rounds=2, data=make_data(num_clients=3))
    reference, _ = VHL(virtual_per_class=5).virtual_data((1, 8, 8), 10)  # a fresh instance: same data
    assert {(c, r) for c, r, _ in strategy.seen} == {(c, r) for c in range(3) for r in range(2)}
    assert len(strategy.seen) == 3 * 2 * 3  # one virtual batch per local step of every client
    flat = reference.flatten(1)
    for _, _, xv in strategy.seen:
        assert xv.shape[0] == 32  # the size of the natural batch
        assert (xv.flatten(1)[:, None] == flat[None]).all(-1).any(-1).all()  # drawn from the shared set


def test_local_term_is_virtual_ce_plus_lambda_times_the_calibration():
    strategy = VHL(lam=0.5, virtual_per_class=4)
    module = make_module(strategy).client
    ctx = ClientContext(0, 0, {}, {}, 16, 1, 0.1)
    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    module.train()
    torch.manual_seed(5)
    loss = strategy.local_loss(module, ctx, (x, y), None)
    idx = ctx.scratch["vhl/index"]
    xv_all, yv_all = strategy.virtual_data((1, 8, 8), 10)
    z, _ = features_of(module, x)
    zv, logits_v = features_of(module, xv_all[idx])
    expected = F.cross_entropy(logits_v, yv_all[idx]) + 0.5 * virtual_contrastive_loss(
        z, y, zv, yv_all[idx], 0.07
    )
    torch.testing.assert_close(loss, expected)
    torch.manual_seed(5)
    assert torch.equal(idx, torch.randint(len(yv_all), (8,)))  # drawn from the client's RNG stream


class HandVHL(FedAvg):
    """VHL's local term written out in the test: the SmallCNN's features by hand, no tap, no features_of."""

    def __init__(self, lam, virtual):
        super().__init__()
        self.lam, (self.xv, self.yv) = lam, virtual

    def local_loss(self, module, ctx, batch, outputs):
        x, y = batch
        net = module.net
        idx = torch.randint(len(self.yv), (int(x.shape[0]),))  # the client's stream, as VHL draws it
        z = net.classifier[:2](net.features(x))  # the input of the last linear layer
        zv = net.classifier[:2](net.features(self.xv[idx]))
        calibration = virtual_contrastive_loss(z, y, zv, self.yv[idx], 0.07)
        return F.cross_entropy(net.classifier[2](zv), self.yv[idx]) + self.lam * calibration


def test_one_round_fit_is_fedavg_with_the_virtual_loss_and_calibration_in_every_local_step(fit):
    virtual = VHL(virtual_per_class=5).virtual_data((1, 8, 8), 10)
    runs = [make_module(s) for s in (FedAvg(), VHL(lam=0.5, virtual_per_class=5), HandVHL(0.5, virtual))]
    for module in runs:
        fit(module, rounds=1)
        assert [(r.clients, r.failed) for r in module.history] == [(4, 0)]
    plain, vhl, hand = (global_weights(m) for m in runs)
    for k in plain:
        torch.testing.assert_close(vhl[k], hand[k])
    assert all(not torch.allclose(vhl[k], plain[k]) for k in plain)
