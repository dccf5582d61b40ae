"""FedCOG as a plug-in: neutrality, unchanged uploads, schedule, KD at the first step, previous models."""

import copy

import pytest
import torch
import torch.nn.functional as F

import fl_lightning.strategies.plugins.fedcog as fedcog_module
from fl_lightning.api.types import ClientContext
from fl_lightning.callbacks import FederatedCallback
from fl_lightning.errors import ConfigError
from fl_lightning.functional.representation import PREVIOUS
from fl_lightning.strategies import STRATEGIES, FedAvg, FedCOG, FedProx, get_strategy

from conftest import global_weights, make_data, make_module

SMALL = {"num_generated": 24, "gen_steps": 3}
# the paper's plug-and-play bases (Table 3) and the other baselines it compares with, where registered
PAPER_BASES = ("fedavg", "fedavgm", "fedprox", "scaffold", "moon", "feddecorr", "fedexp")
BASES = [n for n in PAPER_BASES if n in STRATEGIES]


class Uploads(FederatedCallback):
    """Records every client's upload: group -> name -> (shape, dtype)."""

    def __init__(self):
        self.seen = []

    def on_client_end(self, trainer, pl_module, round, index, total, result):
        up = result.upload
        self.seen.append({g: {n: (tuple(t.shape), t.dtype) for n, t in ts.items()} for g, ts in up.items()})


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("off", [{"num_generated": 0, "lambda_kd": 0.0}, {"start_round": 5}])
def test_fedcog_switched_off_is_bit_identical_to_its_base(base, off, fit):
    a = make_module(get_strategy(base))
    b = make_module(FedCOG(get_strategy(base), **{**SMALL, **off}))
    fit(a, rounds=3, data=make_data(num_clients=3))
    fit(b, rounds=3, data=make_data(num_clients=3))
    wa, wb = global_weights(a), global_weights(b)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize("base", ["fedavg", "moon", "fedexp"])
def test_upload_is_the_base_methods_payload(base, fit):
    plain, wrapped = Uploads(), Uploads()
    a = make_module(get_strategy(base))
    b = make_module(FedCOG(get_strategy(base), **SMALL))
    fit(a, rounds=2, callbacks=[plain])
    fit(b, rounds=2, callbacks=[wrapped])
    assert plain.seen == wrapped.seen and plain.seen  # same groups, names, shapes, dtypes
    assert [r.bytes_up for r in a.history] == [r.bytes_up for r in b.history]
    assert [r.bytes_down for r in a.history] == [r.bytes_down for r in b.history]
    assert not any(
        torch.equal(global_weights(a)[k], global_weights(b)[k]) for k in ["net.classifier.2.weight"]
    )


def test_generation_runs_once_per_client_from_start_round(fit, monkeypatch):
    calls = []
    real = fedcog_module.generate

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    rounds = []

    class Rounds(FederatedCallback):
        def on_round_end(self, trainer, pl_module, round, record):
            rounds.append((round, len(calls)))

    monkeypatch.setattr(fedcog_module, "generate", counting)
    module = make_module(FedCOG(FedAvg(), start_round=2, **SMALL), clients_per_round=2)
    fit(module, rounds=4, callbacks=[Rounds()])
    assert rounds == [(0, 0), (1, 0), (2, 2), (3, 4)]


def test_same_seed_gives_the_same_generated_data_and_model(fit):
    a, b = (make_module(FedCOG(FedAvg(), **SMALL)) for _ in range(2))
    fit(a, rounds=2)
    fit(b, rounds=2)
    wa, wb = global_weights(a), global_weights(b)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_previous_local_model_is_kept_in_the_client_state(fit):
    module = make_module(FedCOG(FedAvg(), start_round=10, **SMALL))
    fit(module, rounds=1, data=make_data(num_clients=1), limit_val_batches=0)
    state = module.store.get(0)
    local = module.worker.state_dict()  # without validation the worker holds the last local model
    names = [k for k, v in local.items() if v.is_floating_point()]
    assert sorted(PREVIOUS + n for n in names) == sorted(state)
    assert all(torch.equal(state[PREVIOUS + n], local[n]) for n in names)


def _client(module, strategy, cid=0, round=0):
    dm = make_data(num_clients=3)
    dm.setup()
    worker = module.client
    data = dm.clients[cid]
    message = {"weights": {k: v.clone() for k, v in worker.state_dict().items()}}
    ctx = ClientContext(cid, round, message, {}, data.num_samples, 4, 0.1, data=data)
    return worker, ctx, data


@pytest.mark.parametrize("weighting", ["fixed", "balanced"])
def test_kd_term_is_zero_at_the_first_local_step_of_a_bn_free_model(weighting):
    strategy = FedCOG(FedAvg(), num_generated=32, gen_steps=3, kd_batch_size=32, weighting=weighting)
    module = make_module(strategy)
    worker, ctx, data = _client(module, strategy)
    strategy.on_client_start(worker, ctx)
    kd = ctx.scratch["fedcog"]
    assert kd.inputs.shape == (32, *data.x.shape[1:])
    batch = (data.x[data.train_idx[:16]], data.y[data.train_idx[:16]])
    outputs = worker(batch[0])
    term = strategy.local_loss(worker, ctx, batch, outputs)
    ce = worker.task_loss(outputs, batch[1])
    # KL(global || local) is exactly 0 while local == global; what is left is (w_c - 1) * CE
    assert torch.equal(term, (kd.w_c - 1.0) * ce)
    if weighting == "balanced":
        counts = torch.bincount(data.y[data.train_idx], minlength=10).float()
        n_gen = float((counts.max() - counts).sum())
        assert kd.w_kd == pytest.approx(n_gen / (n_gen + float(counts.sum())))


def test_kd_term_moves_the_local_model_towards_the_teacher():
    strategy = FedCOG(FedAvg(), num_generated=32, gen_steps=3, lambda_kd=0.5)
    module = make_module(strategy)
    worker, ctx, data = _client(module, strategy)
    teacher_net = copy.deepcopy(worker)  # the global model theta^t: the local model before its steps
    strategy.on_client_start(worker, ctx)
    kd = ctx.scratch["fedcog"]
    assert (kd.w_c, kd.w_kd) == (1.0, 0.5)  # fixed weighting: (1, lambda_kd)
    with torch.no_grad():
        for p in worker.parameters():
            p.add_(0.05 * torch.randn_like(p))
    batch = (data.x[data.train_idx[:8]], data.y[data.train_idx[:8]])
    term = strategy.local_loss(worker, ctx, batch, worker(batch[0]))
    xg, _ = kd.batch(ctx.step, 8, ctx.num_steps)  # this step's generated mini-batch (fixed within a step)
    assert ((xg.flatten(1)[:, None] == kd.inputs.flatten(1)[None]).all(-1).any(-1)).all()

    def kl_to_teacher():  # eq. 3: KL(p(theta^t; x) || p(theta; x)), by torch's own kl_div
        with torch.no_grad():
            teacher = F.log_softmax(teacher_net(xg), dim=-1)
        return F.kl_div(F.log_softmax(worker(xg), dim=-1), teacher, log_target=True, reduction="batchmean")

    before = kl_to_teacher()
    torch.testing.assert_close(term, 0.5 * before)
    term.backward()
    with torch.no_grad():
        for p in worker.parameters():
            p.sub_(0.5 * p.grad)
    assert kl_to_teacher() < 0.9 * before  # a step on the term alone brings the student to the teacher


def test_generation_leaves_parameters_buffers_modes_and_grads_of_a_bn_model_untouched():
    from torch import nn

    from fl_lightning.api.client import ClientModule
    from fl_lightning.functional.representation import save_previous_model

    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(256, 10)
    )
    strategy = FedCOG(FedAvg(), num_generated=16, gen_steps=3)
    module = make_module(strategy)
    module.client = ClientModule(net, lr=0.1, momentum=0.0)
    worker, ctx, data = _client(module, strategy)
    worker.train()
    worker(data.x[data.train_idx[:8]])  # non-default BN statistics
    save_previous_model(worker, ctx.state)
    ctx.state = {k: v + 0.1 for k, v in ctx.state.items()}  # a previous model different from the global one
    before = {k: v.clone() for k, v in worker.state_dict().items()}
    strategy.on_client_start(worker, ctx)
    assert all(torch.equal(before[k], v) for k, v in worker.state_dict().items())
    assert all(m.training for m in worker.modules()) and all(p.grad is None for p in worker.parameters())
    assert ctx.scratch["fedcog"].inputs.shape == (16, 1, 8, 8)


def test_the_same_generated_batch_serves_every_closure_call_of_a_step():
    strategy = FedCOG(FedAvg(), num_generated=20, gen_steps=1, kd_batch_size=8)
    module = make_module(strategy)
    worker, ctx, _ = _client(module, strategy)
    strategy.on_client_start(worker, ctx)
    kd = ctx.scratch["fedcog"]
    first = kd.batch(0, 8, ctx.num_steps)[0]
    assert torch.equal(first, kd.batch(0, 8, ctx.num_steps)[0])
    assert not torch.equal(first, kd.batch(1, 8, ctx.num_steps)[0])
    seen = torch.cat([kd.order[i * 8 : (i + 1) * 8] for i in range(ctx.num_steps)])
    assert len(seen) == 32 and set(seen[:20].tolist()) == set(range(20))  # reshuffled passes


def test_fedcog_on_fedprox_adds_both_local_terms():
    strategy = FedCOG(FedProx(mu=0.5), num_generated=16, gen_steps=1, lambda_kd=0.0, weighting="balanced")
    module = make_module(strategy)
    worker, ctx, data = _client(module, strategy)
    strategy.on_client_start(worker, ctx)
    with torch.no_grad():
        for p in worker.parameters():
            p.add_(0.1)
    batch = (data.x[data.train_idx[:8]], data.y[data.train_idx[:8]])
    outputs = worker(batch[0])
    kd = ctx.scratch["fedcog"]
    prox = strategy.base.local_loss(worker, ctx, batch, outputs)
    from fl_lightning.functional.distillation import kd_loss

    xg, teacher = kd.batch(0, 8, ctx.num_steps)
    expected = (
        prox
        + kd.w_kd * kd_loss(worker(xg), teacher, "multiclass")
        + (kd.w_c - 1) * worker.task_loss(outputs, batch[1])
    )
    torch.testing.assert_close(strategy.local_loss(worker, ctx, batch, outputs), expected)


def test_bad_arguments_name_the_field():
    with pytest.raises(ConfigError, match="model.strategy.lambda_kd"):
        FedCOG(lambda_kd=-1)
    with pytest.raises(ConfigError, match="model.strategy.weighting"):
        FedCOG(weighting="both")
    with pytest.raises(ConfigError, match="model.strategy.num_generated"):
        FedCOG(num_generated=-3)
