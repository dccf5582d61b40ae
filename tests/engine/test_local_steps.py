"""fl_lightning.engine.local: a client's local steps, written once for one client and for a stacked group.

The same loop (:func:`local_optimizer` then :func:`local_steps`) runs in :func:`train_client` and in the
vectorised :func:`~fl_lightning.engine.vectorized.train_stacked`: both call the strategy's and the module's
hooks in the same order, decay the lr once per round, clip and step through a gradient scaler alike.
"""

from __future__ import annotations

import pytest
import torch

from fl_lightning.api.client import ClientModule
from fl_lightning.api.types import ClientContext
from fl_lightning.data import IID
from fl_lightning.engine.local import LocalConfig, local_optimizer, local_steps, train_client
from fl_lightning.engine.vectorized import StackedWorker, train_stacked
from fl_lightning.functional.tensor import shared_state
from fl_lightning.models import SmallCNN
from fl_lightning.strategies import FedAvg

from conftest import make_data


class HookLog(FedAvg):
    """FedAvg that logs every client hook the loop calls, with the step and lr it sees."""

    vectorizable = True

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []

    def on_client_start(self, module, ctx):
        self.calls.append(("on_client_start", ctx.stacked))
        super().on_client_start(module, ctx)

    def configure_client_optimizer(self, module, ctx):
        self.calls.append(("configure_client_optimizer",))
        return super().configure_client_optimizer(module, ctx)

    def local_step(self, module, optimizer, ctx, batch, closure):
        self.calls.append(("local_step", ctx.step, ctx.lr, optimizer.param_groups[0]["lr"]))
        super().local_step(module, optimizer, ctx, batch, closure)

    def local_loss(self, module, ctx, batch, outputs):
        self.calls.append(("local_loss", ctx.step))
        return None

    def on_before_optimizer_step(self, module, optimizer, ctx):
        grad = module.net.features[0].weight.grad
        self.calls.append(("on_before_optimizer_step", ctx.step, grad is not None))

    def on_after_optimizer_step(self, module, optimizer, ctx):
        self.calls.append(("on_after_optimizer_step", ctx.step))


class ModuleHook(ClientModule):
    """Counts the module's own ``on_before_optimizer_step`` (a Lightning hook that runs on a client)."""

    def on_before_optimizer_step(self, optimizer):
        self.before = getattr(self, "before", 0) + 1


def _client(cls=ClientModule) -> ClientModule:
    torch.manual_seed(0)
    return cls(SmallCNN(in_channels=1, num_classes=10, width=4, hidden=16), lr=0.1, momentum=0.0)


def _clients():
    data = make_data(num_clients=2, partition=IID(), batch_size=8, local_test_fraction=0.0)
    data.setup("fit")
    return data.clients


def test_one_client_and_a_stacked_group_run_the_same_hooks_in_the_same_order():
    """Two clients of equal step counts: the stacked group's calls are one client's calls (stacked)."""
    config = LocalConfig(batch_size=8, local_steps=3, lr_decay=0.5, seed=0)
    clients, worker = _clients(), _client()
    message = {"weights": shared_state(worker)}
    single = HookLog()
    single.setup(worker, 2)
    train_client(worker, single, message, {}, clients[0], 2, config)
    stacked = HookLog()
    stacked.setup(worker, 2)
    train_stacked(StackedWorker(worker, 2), stacked, [message] * 2, [{}, {}], clients, 2, config)
    assert [c for c in single.calls if c[0] != "on_client_start"] == [
        c for c in stacked.calls if c[0] != "on_client_start"
    ]
    assert single.calls[0] == ("on_client_start", 0) and stacked.calls[0] == ("on_client_start", 2)
    steps = [c for c in single.calls if c[0] == "local_step"]
    lr = pytest.approx(0.1 * 0.5**2)  # decayed once for round 2, on the optimizer and in ctx.lr
    assert steps == [("local_step", s, lr, lr) for s in range(3)]
    assert [c[0] for c in single.calls[:6]] == [
        "on_client_start",
        "configure_client_optimizer",
        "local_step",
        "local_loss",
        "on_before_optimizer_step",
        "on_after_optimizer_step",
    ]
    assert all(c[2] for c in single.calls if c[0] == "on_before_optimizer_step")  # after backward


def test_local_steps_yield_each_step_and_run_the_module_hook():
    worker, (data, _) = _client(ModuleHook), _clients()
    config = LocalConfig(batch_size=8, local_steps=4, seed=0)
    strategy = FedAvg()
    strategy.setup(worker, 2)
    ctx = ClientContext(0, 3, {}, {}, data.num_samples, 4, 0.0)
    optimizer = local_optimizer(worker, strategy, ctx, LocalConfig(batch_size=8, local_steps=4, lr_decay=0.5))
    assert ctx.lr == pytest.approx(0.1 * 0.5**3) == optimizer.param_groups[0]["lr"]
    before = [p.detach().clone() for p in worker.parameters()]
    batches = data.batches(8, 4, torch.Generator().manual_seed(0))
    assert list(local_steps(worker, strategy, optimizer, ctx, batches, config)) == [0, 1, 2, 3]
    assert ctx.step == 3 and worker.before == 4
    assert any(not torch.equal(a, b) for a, b in zip(before, worker.parameters()))


def test_clipping_bounds_each_step_of_one_client_and_of_each_stacked_client():
    norms: list[torch.Tensor] = []

    class Norms(FedAvg):
        vectorizable = True

        def on_after_optimizer_step(self, module, optimizer, ctx):
            grads = [p.grad for p in module.parameters() if p.grad is not None]
            dims = (lambda g: tuple(range(1, g.dim()))) if ctx.stacked else (lambda g: tuple(range(g.dim())))
            norms.append(sum(g.square().sum(dim=dims(g)) for g in grads).sqrt())

    config = LocalConfig(batch_size=8, local_steps=2, grad_clip_norm=1e-3, seed=0)
    clients, worker = _clients(), _client()
    message = {"weights": shared_state(worker)}
    train_client(worker, Norms(), message, {}, clients[0], 0, config)
    train_stacked(StackedWorker(worker, 2), Norms(), [message] * 2, [{}, {}], clients, 0, config)
    assert len(norms) == 4 and norms[2].shape == (2,)  # per client when stacked
    # every client's own norm is clipped to the bound (one norm over the stack would leave each below it)
    assert all(torch.allclose(n, torch.full_like(n, 1e-3), rtol=1e-3) for n in norms)


class _Scaler:
    """A gradient scaler that records its calls (as ``16-mixed``'s, which steps the optimizer itself)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def scale(self, loss):
        self.calls.append("scale")
        return loss * 1.0

    def unscale_(self, optimizer):
        self.calls.append("unscale_")

    def step(self, optimizer):
        self.calls.append("step")
        optimizer.step()

    def update(self):
        self.calls.append("update")


class _ScalerPrecision:
    def __init__(self) -> None:
        self.scaler = _Scaler()

    def train_step_context(self):
        return torch.autocast("cpu", enabled=False)

    def convert_input(self, batch):
        return batch


def test_a_gradient_scaler_steps_the_optimizer_instead_of_local_step():
    log = HookLog()
    worker, (data, _) = _client(), _clients()
    log.setup(worker, 2)
    precision = _ScalerPrecision()
    config = LocalConfig(batch_size=8, local_steps=2, seed=0)
    train_client(worker, log, {"weights": shared_state(worker)}, {}, data, 0, config, precision)
    assert precision.scaler.calls == ["scale", "unscale_", "step", "update"] * 2
    assert not any(c[0] == "local_step" for c in log.calls)
    assert [c[0] for c in log.calls if c[0] == "on_after_optimizer_step"] == ["on_after_optimizer_step"] * 2


def test_a_stack_of_the_wrong_size_is_refused():
    stack = StackedWorker(_client(), 3)
    with pytest.raises(ValueError, match="a stack of 3 cannot train 2 clients"):
        train_stacked(stack, FedAvg(), [{}] * 2, [{}] * 2, _clients(), 0, LocalConfig(8))
