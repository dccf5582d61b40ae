"""MoFedSAM: FedCM with SAM gradients; rho = 0 is FedCM bit for bit; FedCM's traffic."""

import pytest
import torch

from fl_lightning.errors import ConfigError
from fl_lightning.strategies import FedAvg, FedCM, FedSAM, MoFedSAM

from conftest import global_weights, make_data, make_module


def _run(strategy, fit, rounds=3, data=None):
    module = make_module(strategy, clients_per_round=2, local_steps=3)
    fit(module, rounds=rounds, data=data)
    return module


def _equal(a, b):
    wa, wb = global_weights(a), global_weights(b)
    return all(torch.equal(wa[k], wb[k]) for k in wa)


def test_mofedsam_rho_zero_is_fedcm_bit_for_bit(fit):
    cm = _run(FedCM(alpha=0.1), fit)
    mo = _run(MoFedSAM(rho=0.0, alpha=0.1, clip_norm=None), fit)
    assert _equal(cm, mo)
    assert all(torch.equal(cm.strategy.momentum[n], mo.strategy.momentum[n]) for n in cm.strategy.momentum)
    assert any(cm.strategy.momentum[n].abs().max() > 0 for n in cm.strategy.momentum)  # Delta was used
    assert not _equal(cm, _run(MoFedSAM(rho=0.05, alpha=0.1, clip_norm=None), fit))


def test_mofedsam_with_alpha_one_is_fedsam(fit):
    """alpha = 1: no share of the global direction, so the local steps are FedSAM's."""
    one = make_data(num_clients=2)
    assert _equal(
        _run(FedSAM(rho=0.05, clip_norm=None), fit, data=one),
        _run(MoFedSAM(rho=0.05, alpha=1.0, clip_norm=None), fit, data=one),
    )


def test_mofedsam_sends_fedcms_two_vectors_down(fit):
    a, b, c = make_module(FedAvg()), make_module(MoFedSAM()), make_module(FedCM())
    for m in (a, b, c):
        fit(m, rounds=1)
    assert b.history[0].bytes_down == 2 * a.history[0].bytes_down == c.history[0].bytes_down
    assert b.history[0].bytes_up == c.history[0].bytes_up


def test_mofedsam_bad_arguments_name_the_field():
    with pytest.raises(ConfigError, match="model.strategy.alpha"):
        MoFedSAM(alpha=0.0)
    with pytest.raises(ConfigError, match="model.strategy.rho"):
        MoFedSAM(rho=-1.0)
