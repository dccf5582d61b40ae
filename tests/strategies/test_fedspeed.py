"""FedSpeed: FedDyn with SAM-type gradients; reductions to FedDyn and the quasi-gradient's linearity."""

import pytest
import torch

from fl_lightning.errors import ConfigError
from fl_lightning.strategies import FedAvg, FedDyn, FedSMOO, FedSpeed

from conftest import global_weights, make_data, make_module


def _weights(strategy, fit, rounds=3, data=None, **kw):
    module = make_module(strategy, **{"clients_per_round": 2, "local_steps": 3, **kw})
    fit(module, rounds=rounds, data=data)
    return global_weights(module)


def _equal(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


def test_fedspeed_reduces_to_feddyn_bit_for_bit(fit):
    dyn = _weights(FedDyn(alpha=0.1), fit)
    assert _equal(dyn, _weights(FedSpeed(beta=10.0, rho=0.0, clip_norm=None), fit))
    # sam_weight = 0: the quasi-gradient is the plain gradient g_1, the second pass is discarded
    assert _equal(dyn, _weights(FedSpeed(beta=10.0, rho=0.1, sam_weight=0.0, clip_norm=None), fit))
    assert not _equal(dyn, _weights(FedSpeed(beta=10.0, rho=0.1, clip_norm=None), fit))


def test_fedspeed_is_fedsmoo_without_the_perturbation_correction(fit):
    """Round 0, first step: mu = s = 0, so both take the same step; afterwards FedSMOO's mu corrects."""
    kw = {"clients_per_round": 1, "local_steps": 1}
    one = {"data": make_data(num_clients=1)}
    a = make_module(FedSpeed(beta=10.0, rho=0.1, clip_norm=None), **kw)
    b = make_module(FedSMOO(beta=10.0, rho=0.1, clip_norm=None), **kw)
    fit(a, rounds=1, **one)
    fit(b, rounds=1, **one)
    assert _equal(global_weights(a), global_weights(b))
    a = make_module(FedSpeed(beta=10.0, rho=0.1, clip_norm=None), clients_per_round=1, local_steps=3)
    b = make_module(FedSMOO(beta=10.0, rho=0.1, clip_norm=None), clients_per_round=1, local_steps=3)
    fit(a, rounds=1, **one)
    fit(b, rounds=1, **one)
    assert not _equal(global_weights(a), global_weights(b))


def test_quasi_gradient_mixes_linearly(fit):
    """One client, one step, no clipping: the step is linear in the quasi-gradient, so the model of
    sam_weight = a is (1 - a) * model(0) + a * model(1)."""
    one = {"clients_per_round": 1, "local_steps": 1, "data": make_data(num_clients=1)}
    w = {
        a: _weights(FedSpeed(rho=0.5, sam_weight=a, clip_norm=None), fit, rounds=1, **one)
        for a in (0, 0.25, 1)
    }
    assert not _equal(w[0], w[1])
    for k in w[0]:
        torch.testing.assert_close(w[0.25][k], 0.75 * w[0][k] + 0.25 * w[1][k], rtol=1e-5, atol=1e-6)


def test_fedspeed_communicates_one_model_each_way(fit):
    a, b = make_module(FedAvg()), make_module(FedSpeed())
    fit(a, rounds=1)
    fit(b, rounds=1)
    assert (a.history[0].bytes_down, a.history[0].bytes_up) == (
        b.history[0].bytes_down,
        b.history[0].bytes_up,
    )


def test_fedspeed_bad_arguments_name_the_field():
    with pytest.raises(ConfigError, match="model.strategy.beta"):
        FedSpeed(beta=-1.0)
    with pytest.raises(ConfigError, match="model.strategy.sam_weight"):
        FedSpeed(sam_weight=1.5)
    with pytest.raises(ConfigError, match="model.strategy.rho"):
        FedSpeed(rho=-0.1)
