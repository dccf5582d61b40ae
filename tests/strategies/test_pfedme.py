"""pFedMe (Dinh et al., 2020, Alg. 1): local update, server mixing, personalised evaluation."""

import copy

import pytest
import torch

from fl_lightning.api.client import ClientModule
from fl_lightning.api.types import ClientContext
from fl_lightning.data import FederatedDataModule, Pathological
from fl_lightning.errors import ConfigError
from fl_lightning.functional.tensor import load_tensors, shared_state
from fl_lightning.lightning.module import FederatedModule
from fl_lightning.models import DNN
from fl_lightning.strategies import PFedMe, RoundInfo
from fl_lightning.strategies.mixins.moreau import SCRATCH, THETA

from conftest import global_weights


def dense_client(lr=0.05):
    torch.manual_seed(0)
    return ClientModule(DNN(in_features=64, hidden=12), lr=lr, momentum=0.0)


def test_local_update_is_w_minus_eta_lambda_w_minus_theta():
    model = dense_client(lr=0.05)
    strategy = PFedMe(lam=15.0, personal_lr=0.1, personal_steps=3)
    strategy.setup(model, 1)
    worker = copy.deepcopy(model)
    ctx = ClientContext(0, 0, strategy.message(model, 0, 0), {}, 10, 1, 0.0)
    strategy.on_client_start(worker, ctx)
    opt = strategy.configure_client_optimizer(worker, ctx)
    ctx.lr = opt.param_groups[0]["lr"]
    batch = (torch.randn(10, 1, 8, 8), torch.randint(0, 10, (10,)))
    strategy.local_step(worker, opt, ctx, batch, None)
    theta = ctx.scratch[SCRATCH].theta
    w0 = shared_state(model)
    assert any(not torch.equal(theta[n].detach(), w0[n]) for n in theta)  # theta moved on the batch
    for n, w in shared_state(worker).items():
        torch.testing.assert_close(w, w0[n] - 0.05 * 15.0 * (w0[n] - theta[n].detach()))


def test_server_mixes_with_beta_weighted_by_data_size():
    model = dense_client()
    strategy = PFedMe(beta=2.0)
    opt = strategy.configure_server_optimizer(list(model.parameters()))
    w = {n: t.detach().clone() for n, t in shared_state(model).items()}
    a = {n: t + 1.0 for n, t in w.items()}
    b = {n: t - 1.0 for n, t in w.items()}
    means = {"weights": {n: (3 * a[n] + b[n]) / 4 for n in w}}  # the loop's sample weighting
    assert strategy.aggregator().weight("weights", {}, 7) == 7.0  # by sample count
    strategy.server_update(model, means, RoundInfo(0, [0, 1], [0, 1], 2))
    opt.step()
    for n, t in shared_state(model).items():  # (1 - beta) w + beta * mean = w + 2 * 0.5
        torch.testing.assert_close(t, w[n] + 1.0)


def test_pfedme_runs_with_personalised_metrics(fit):
    module = FederatedModule(client=dense_client(), strategy=PFedMe(), local_steps=3)
    start = global_weights(module)
    data = FederatedDataModule(
        num_clients=4, partition=Pathological(classes_per_client=2), batch_size=20, local_test_fraction=0.25
    )
    trainer = fit(module, data=data, rounds=2)
    assert {"global/acc", "personal/acc", "train/loss"} <= set(trainer.callback_metrics)
    assert any(not torch.equal(start[k], v) for k, v in global_weights(module).items())
    state = module.store.get(0)
    worker = module.worker
    load_tensors(worker, shared_state(module.client))
    module.strategy.personalize(worker, 0, state)
    for n, t in shared_state(worker).items():
        assert torch.equal(t, state[THETA + n])


def test_bad_arguments_name_the_field():
    with pytest.raises(ConfigError, match="model.strategy.personal_lr"):
        PFedMe(personal_lr=0)
    with pytest.raises(ConfigError, match="model.strategy.personal_steps"):
        PFedMe(personal_steps=0)
    with pytest.raises(ConfigError, match="model.strategy.beta"):
        PFedMe(beta=-1)
