"""FedAvg (s.a.r.): a random 1/ratio of the entries each way; the receiver keeps its own values elsewhere."""

import pytest
import torch
from personal_helpers import record_payloads

from fl_lightning.errors import ConfigError
from fl_lightning.functional.sparsify import flatten, random_indices
from fl_lightning.functional.tensor import shared_state
from fl_lightning.strategies import FedAvg, FedAvgSAR
from fl_lightning.strategies.fedavg_sar import LOCAL

from conftest import global_weights, make_data, make_module


@pytest.mark.parametrize("fill", ["own", "zero"])
def test_ratio_one_is_fedavg(fit, fill):
    a, b = make_module(FedAvg()), make_module(FedAvgSAR(ratio=1.0, fill=fill))
    fit(a, rounds=3)
    fit(b, rounds=3)
    wa, wb = global_weights(a), global_weights(b)
    assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)


def test_each_message_and_upload_carries_one_over_ratio_of_the_entries(fit):
    module = make_module(FedAvgSAR(ratio=1.5))
    seen = record_payloads(module.strategy)
    fit(module, rounds=2)
    numel = flatten(shared_state(module.client)).numel()
    payloads = [p for _, _, p in seen.messages + seen.uploads]
    assert len(payloads) == 16 and all(set(p) == {"sparse"} for p in payloads)
    assert all(p["sparse"]["values"].numel() == round(numel / 1.5) for p in payloads)
    assert all(p["sparse"]["seed"].numel() == 1 for p in payloads)
    seeds = {int(p["sparse"]["seed"]) for p in payloads}
    assert len(seeds) == 16  # a fresh subset per client, round and direction


def test_server_changes_only_the_sent_entries_to_the_senders_values(fit):
    module = make_module(FedAvgSAR(ratio=2.0))
    seen = record_payloads(module.strategy)
    start = flatten(shared_state(module.client))
    fit(module, rounds=1, data=make_data(num_clients=1))
    end = flatten(shared_state(module.client))
    (_, _, upload), numel = seen.uploads[0], start.numel()
    idx = random_indices(numel, 2.0, int(upload["sparse"]["seed"]))
    sent = torch.zeros(numel, dtype=torch.bool)
    sent[idx] = True
    assert torch.equal(end[~sent], start[~sent])  # nobody sent these: w^t kept
    assert torch.allclose(end[idx], upload["sparse"]["values"])  # one sender: its values
    local = module.store.get(0)[LOCAL]  # the client keeps its whole trained model
    assert torch.allclose(local[idx], upload["sparse"]["values"]) and not torch.equal(local, start)


def test_client_starts_from_the_received_entries_and_its_own_model_elsewhere(fit):
    module = make_module(FedAvgSAR(ratio=2.0))
    seen = record_payloads(module.strategy)
    starts = []
    on_client_start = module.strategy.on_client_start

    def record(worker, ctx):
        before = ctx.state.get(LOCAL, module.strategy.initial).clone()
        on_client_start(worker, ctx)
        starts.append((before, flatten(shared_state(worker))))

    module.strategy.on_client_start = record
    fit(module, rounds=2, data=make_data(num_clients=1))
    (_, _, message), (before, start) = seen.messages[1], starts[1]  # round 2: the client has a model
    idx = random_indices(start.numel(), 2.0, int(message["sparse"]["seed"]))
    kept = torch.ones(start.numel(), dtype=torch.bool)
    kept[idx] = False
    assert torch.equal(start[idx], message["sparse"]["values"])
    assert torch.equal(start[kept], before[kept])


def test_zero_fill_starts_from_zeros_and_keeps_no_client_state(fit):
    module = make_module(FedAvgSAR(ratio=2.0, fill="zero"))
    starts = []
    on_client_start = module.strategy.on_client_start

    def record(worker, ctx):
        on_client_start(worker, ctx)
        starts.append(flatten(shared_state(worker)))

    module.strategy.on_client_start = record
    fit(module, rounds=1, data=make_data(num_clients=1))
    assert (starts[0] == 0).sum() >= starts[0].numel() // 2
    assert LOCAL not in module.store.get(0)


@pytest.mark.parametrize(
    ("kwargs", "field"), [({"ratio": 0.5}, "model.strategy.ratio"), ({"fill": "mean"}, "model.strategy.fill")]
)
def test_bad_settings_are_one_line_config_errors(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        FedAvgSAR(**kwargs)
