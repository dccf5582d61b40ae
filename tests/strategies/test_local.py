"""Local: nothing crosses the network and every client's model is its own local training."""

import torch
from personal_helpers import personal_model, record_payloads

from fl_lightning.api.strategy import PERSONAL
from fl_lightning.engine.local import train_client
from fl_lightning.strategies import FedAvg, Local

from conftest import global_weights, make_module


def test_nothing_is_communicated_and_the_global_model_stays_initial(fit):
    module = make_module(Local())
    seen = record_payloads(module.strategy)
    start = global_weights(module)
    fit(module, rounds=2)
    assert len(seen.uploads) == 8 and not seen.names()
    assert all(r.bytes_up == 0 and r.bytes_down == 0 for r in module.history)
    end = global_weights(module)
    assert all(torch.equal(start[k], end[k]) for k in start)


def test_each_client_model_is_its_own_training_alone(fit):
    module = make_module(Local())
    w0 = global_weights(module)
    fit(module, rounds=2)
    worker = make_module().client  # the same initial model
    for data in module.datamodule.clients:
        weights = w0
        for r in range(2):  # the client alone: FedAvg's local work on its own previous model
            res = train_client(
                worker, FedAvg(), {"weights": weights}, {}, data, r, module.engine.config.local
            )
            weights = res.upload["weights"]
        state = module.store.get(data.client_id)
        deployed = personal_model(module, data.client_id)
        for n, t in weights.items():
            torch.testing.assert_close(state[PERSONAL + n], t, rtol=0, atol=1e-6)
            assert torch.equal(deployed[n], state[PERSONAL + n])
    a, b = (personal_model(module, c) for c in (0, 1))
    assert any(not torch.equal(a[n], b[n]) for n in a)
