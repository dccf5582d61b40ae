"""ClientModule: its defaults are the zero-config run's; under the local loop the loop adds the strategy's
term and ``self.log`` reaches the client."""

import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import Logger

from fl_lightning.api.client import ClientModule
from fl_lightning.lightning.module import CLIENT_PREFIX, FederatedModule
from fl_lightning.models import SmallCNN
from fl_lightning.strategies import MOON, FedAvg, FedProx, FedSAM

from conftest import global_weights, make_data, make_module


class Captured(Logger):
    """A logger that keeps every ``log_metrics`` call."""

    def __init__(self) -> None:
        super().__init__()
        self.metrics: dict[str, float] = {}

    @property
    def name(self) -> str:
        return "captured"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        self.metrics.update(metrics)


class Logging(ClientModule):
    """Logs the batch index and a count of its training_step calls."""

    def __init__(self, **kw) -> None:
        super().__init__(SmallCNN(in_channels=1, num_classes=10, width=4, hidden=16), lr=0.1, **kw)
        self.calls = 0

    def training_step(self, batch, batch_idx):
        self.log("batch_idx", float(batch_idx))
        self.log_dict({"calls": torch.tensor(float(self.calls))})
        self.calls += 1
        return super().training_step(batch, batch_idx)


class BareLoss(ClientModule):
    """A user's training_step with its own forward that returns the task loss only (no outputs)."""

    def __init__(self) -> None:
        super().__init__(SmallCNN(in_channels=1, num_classes=10, width=4, hidden=16), lr=0.1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)


def _module(client, strategy, **kw):
    torch.manual_seed(0)
    client.load_state_dict(make_module().client.state_dict())
    return FederatedModule(client=client, strategy=strategy, local_steps=kw.pop("local_steps", 2), **kw)


def test_self_log_in_a_client_training_step_reaches_the_per_client_metrics(fit):
    logger = Captured()
    module = _module(Logging(), FedAvg(), local_steps=3)
    fit(module, rounds=1, logger=logger, data=make_data(num_clients=2))
    seen = {k: v for k, v in logger.metrics.items() if k.startswith(CLIENT_PREFIX)}
    for cid in (0, 1):
        assert seen[f"{CLIENT_PREFIX}/{cid}/batch_idx"] == pytest.approx(1.0)  # mean of 0, 1, 2
        assert f"{CLIENT_PREFIX}/{cid}/calls" in seen
        assert f"{CLIENT_PREFIX}/{cid}/train_loss" in seen
    assert module.client._local_logs is None and module.worker._local_logs is None  # collection ended


def test_values_logged_in_the_second_sam_pass_are_not_counted(fit):
    logger = Captured()
    module = _module(Logging(), FedSAM(rho=0.05), local_steps=2, clients_per_round=1)
    fit(module, rounds=1, logger=logger, data=make_data(num_clients=1))
    # calls 0 (step 0, w), 1 (step 0, w+e), 2 (step 1, w), 3 (step 1, w+e): the round reports w only
    assert logger.metrics[f"{CLIENT_PREFIX}/0/calls"] == pytest.approx(1.0)


def test_self_log_of_a_non_scalar_is_a_one_line_error():
    client = Logging()
    with client.local_training(), pytest.raises(ValueError, match=r"self.log\('v', ...\).*scalar") as err:
        client.log("v", torch.ones(3))
    assert "\n" not in str(err.value)


def test_the_client_has_no_side_channel_to_the_strategy(fit):
    module = make_module(FedProx(mu=0.1))
    fit(module, rounds=1)
    assert not hasattr(module.client, "fl") and not hasattr(module.worker, "fl")
    assert not hasattr(ClientModule, "local_term")


def test_a_custom_training_step_still_gets_the_strategys_local_term(fit):
    runs = {}
    for name, strategy in {"fedavg": FedAvg(), "prox0": FedProx(mu=0.0), "prox": FedProx(mu=1.0)}.items():
        module = _module(BareLoss(), strategy)
        fit(module, rounds=2)
        runs[name] = global_weights(module)
    assert all(torch.equal(runs["fedavg"][k], runs["prox0"][k]) for k in runs["fedavg"])
    assert any(not torch.equal(runs["fedavg"][k], runs["prox"][k]) for k in runs["fedavg"])


def test_moon_works_with_a_training_step_that_returns_no_outputs(fit):
    runs = {}
    for name, client in {
        "outputs": ClientModule(SmallCNN(1, 10, width=4, hidden=16), lr=0.1),
        "bare": BareLoss(),
    }.items():
        module = _module(client, MOON(mu=5.0))
        fit(module, rounds=2, data=make_data(num_clients=2))
        runs[name] = global_weights(module)
    # the same term from the training forward's features or from a recomputed forward
    for k in runs["bare"]:
        torch.testing.assert_close(runs["bare"][k], runs["outputs"][k])


def test_client_defaults_are_the_federated_module_defaults():
    client, default = ClientModule(), FederatedModule().client
    for c in (client, default):
        assert (c.lr, c.momentum, c.weight_decay, c.optimizer_name) == (0.1, 0.9, 0.0, "sgd")
        assert isinstance(c.net, SmallCNN) and c.net.features[0].in_channels == 1
    assert client.net is not default.net and client.net is not ClientModule().net  # no shared default


def test_none_net_is_still_the_default_network():
    assert isinstance(ClientModule(net=None).net, SmallCNN)
