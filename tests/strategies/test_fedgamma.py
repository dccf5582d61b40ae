"""FedGamma: SCAFFOLD with SAM gradients; rho = 0 is SCAFFOLD bit for bit; 2x traffic each way."""

import pytest
import torch

from fl_lightning.errors import ConfigError
from fl_lightning.strategies import FedAvg, FedGamma, FedSAM, Scaffold

from conftest import global_weights, make_module


def _run(strategy, fit, rounds=3):
    module = make_module(strategy, clients_per_round=2, local_steps=3)
    fit(module, rounds=rounds)
    return module


def _equal(a, b):
    wa, wb = global_weights(a), global_weights(b)
    return all(torch.equal(wa[k], wb[k]) for k in wa)


def test_fedgamma_rho_zero_is_scaffold_bit_for_bit(fit):
    sc = _run(Scaffold(), fit)
    gamma = _run(FedGamma(rho=0.0, clip_norm=None), fit)
    assert _equal(sc, gamma)
    assert all(torch.equal(sc.strategy.control[n], gamma.strategy.control[n]) for n in sc.strategy.control)
    assert not _equal(sc, _run(FedGamma(rho=0.05, clip_norm=None), fit))


def test_fedgamma_first_round_is_fedsam(fit):
    """Zero control variates in round 0: the correction is an exact + 0, so the round is FedSAM's."""
    assert _equal(
        _run(FedSAM(rho=0.05, clip_norm=None), fit, rounds=1),
        _run(FedGamma(rho=0.05, clip_norm=None), fit, rounds=1),
    )


def test_fedgamma_communicates_two_models_each_way(fit):
    a, b = make_module(FedAvg()), make_module(FedGamma())
    fit(a, rounds=1)
    fit(b, rounds=1)
    assert b.history[0].bytes_down == 2 * a.history[0].bytes_down
    assert b.history[0].bytes_up == 2 * a.history[0].bytes_up


def test_fedgamma_bad_arguments_name_the_field():
    with pytest.raises(ConfigError, match="model.strategy.clip_norm"):
        FedGamma(clip_norm=-1.0)
    with pytest.raises(ConfigError, match="model.strategy.rho"):
        FedGamma(rho=-1.0)
