"""FedDecorr: the decorrelation regulariser by hand, neutrality at beta = 0."""

import pytest
import torch

from fl_lightning.errors import ConfigError
from fl_lightning.functional.representation import decorrelation_loss
from fl_lightning.strategies import FedAvg, FedDecorr

from conftest import global_weights, make_module


def test_decorrelation_loss_by_hand():
    a = torch.tensor([1.0, -1.0, 2.0, -2.0])
    b = torch.tensor([1.0, 1.0, -1.0, -1.0])  # orthogonal to a, both zero-mean
    torch.testing.assert_close(decorrelation_loss(torch.stack([a, b], 1), eps=0.0), torch.tensor(2 / 4))
    torch.testing.assert_close(decorrelation_loss(torch.stack([a, 3 * a], 1), eps=0.0), torch.tensor(4 / 4))
    torch.testing.assert_close(decorrelation_loss(torch.stack([a, -a], 1), eps=0.0), torch.tensor(4 / 4))
    assert float(decorrelation_loss(torch.ones(1, 3))) == 0.0


def test_decorrelation_loss_is_scale_and_shift_invariant_per_dimension():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(32, 6, generator=g)
    scaled = z * torch.tensor([1.0, 2, 3, 0.5, 10, 7]) + 4.0
    torch.testing.assert_close(decorrelation_loss(z, eps=0.0), decorrelation_loss(scaled, eps=0.0))


def test_feddecorr_with_beta_zero_is_fedavg_and_nonzero_beta_changes_training(fit):
    a, b, c = make_module(FedAvg()), make_module(FedDecorr(beta=0.0)), make_module(FedDecorr(beta=10.0))
    for m in (a, b, c):
        fit(m, rounds=2)
    wa, wb, wc = global_weights(a), global_weights(b), global_weights(c)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert any(not torch.equal(wa[k], wc[k]) for k in wa)


def test_bad_beta_names_the_field():
    with pytest.raises(ConfigError, match="model.strategy.beta"):
        FedDecorr(beta=-0.1)
