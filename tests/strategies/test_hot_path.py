"""The per-step path of the strategies works on whole parameter groups: no Python loop over tensors.

A torch-function counter records every torch call a strategy's ``local_step`` makes (its hooks, the
corrections, SAM's norm/perturb/restore, clipping, the optimizer step), leaving out the forward pass
(which has one call per layer by nature) and attribute reads such as ``p.grad``. With multi-tensor
ops that count is the same for a model with 4 parameter tensors and one with 16; a loop over
tensors, a per-tensor norm or a per-tensor ``.to`` makes it grow with the model.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from fl_lightning.api.client import ClientModule
from fl_lightning.engine import Engine, EngineConfig, LocalConfig, Sequential
from fl_lightning.models import MLP
from fl_lightning.strategies import (
    FedCM,
    FedDC,
    FedDyn,
    FedGamma,
    FedProx,
    FedSAM,
    FedSMOO,
    FedSpeed,
    MoFedSAM,
    Scaffold,
    Strategy,
)

from conftest import make_data

ATTRIBUTES = {"__get__", "__set__"}  # p.grad, p.requires_grad: reads, not kernels


class CountCalls(TorchFunctionMode):
    """Counts torch calls by name while ``active``."""

    def __init__(self) -> None:
        super().__init__()
        self.active = False
        self.calls: Counter[str] = Counter()

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if self.active:
            name = getattr(func, "__name__", str(func))
            if name not in ATTRIBUTES:
                self.calls[name] += 1
        return func(*args, **(kwargs or {}))


class Client(ClientModule):
    """An MLP client whose forward pass is not counted and whose SGD is multi-tensor on CPU too."""

    counter: CountCalls | None = None

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        counter, was = self.counter, self.counter is not None and self.counter.active
        if counter is not None:
            counter.active = False
        try:
            return super().training_step(batch, batch_idx)
        finally:
            if counter is not None:
                counter.active = was

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.5, weight_decay=1e-3, foreach=True)


def _calls_per_run(make: Callable[[], Strategy], depth: int) -> Counter[str]:
    """Torch calls inside ``local_step`` over 2 rounds x 2 clients x steps 2-3, MLP with ``depth`` layers.

    The first step of each client is left out: it allocates per-client buffers once (SAM's saved
    weights, FedSMOO's zero ``mu``, the optimizer's momentum), which scales with the model by design.
    """
    torch.manual_seed(0)
    model = Client(MLP(in_features=64, num_classes=10, hidden=(8,) * depth), lr=0.05, momentum=0.0)
    counter = CountCalls()
    strategy = make()
    step = strategy.local_step

    def counted(module: Any, optimizer: Any, ctx: Any, batch: Any, closure: Any) -> None:
        counter.active = ctx.step > 0  # a client's first step allocates its buffers (once per round)
        try:
            step(module, optimizer, ctx, batch, closure)
        finally:
            counter.active = False

    strategy.local_step = counted  # type: ignore[method-assign]
    dm = make_data(num_clients=2, batch_size=8)
    dm.setup("fit")
    engine = Engine(model, strategy, EngineConfig(LocalConfig(batch_size=8, local_steps=3, seed=0)))
    engine.setup(dm.clients, dm.task, dm.num_classes, executor=Sequential())
    engine.worker.counter = counter
    with counter:
        for t in range(2):  # the second round has client state (duals, control variates, mu)
            engine.run_round(t)
    return counter.calls


STRATEGIES = {
    "fedsmoo": lambda: FedSMOO(rho=0.05),
    "feddyn": lambda: FedDyn(alpha=0.1),
    "scaffold": lambda: Scaffold(),
    "feddc": lambda: FedDC(alpha=0.1),
    "fedcm": lambda: FedCM(alpha=0.1),
    "fedprox": lambda: FedProx(mu=0.1),
    "fedsam": lambda: FedSAM(rho=0.05),
    "fedspeed": lambda: FedSpeed(rho=0.05, sam_weight=0.5),
    "fedgamma": lambda: FedGamma(rho=0.05),
    "mofedsam": lambda: MoFedSAM(rho=0.05),
}


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_torch_calls_per_step_do_not_grow_with_the_number_of_parameter_tensors(name):
    small = _calls_per_run(STRATEGIES[name], depth=1)  # 4 parameter tensors
    large = _calls_per_run(STRATEGIES[name], depth=7)  # 16 parameter tensors
    assert sum(small.values()) > 0
    grown = {k: (small[k], large[k]) for k in small | large if small[k] != large[k]}
    assert not grown, f"torch calls that scale with the number of parameter tensors: {grown}"
    for name in ("norm", "item", "cpu", "tolist", "__bool__", "__float__"):  # per-tensor norms, host syncs
        assert small[name] == 0, f"{name} called in the per-step path"


def test_the_counter_sees_a_loop_over_tensors():
    class Looping(FedDyn):  # the old per-tensor correction
        def on_before_optimizer_step(self, module, optimizer, ctx):
            for p in module.parameters():
                p.grad.add_(p.detach(), alpha=self.alpha)

    small = _calls_per_run(lambda: Looping(alpha=0.1), depth=1)
    large = _calls_per_run(lambda: Looping(alpha=0.1), depth=7)
    assert large["add_"] > small["add_"] > 0


def test_list_rules_equal_the_per_tensor_rules_bit_for_bit():
    from fl_lightning.functional import corrections as c
    from fl_lightning.functional.sharpness import clip_grads_

    g = torch.Generator().manual_seed(0)
    shapes = [(3, 4), (5,), (2, 2, 2)]
    w, a, d, h, k = ([torch.randn(s, generator=g) for s in shapes] for _ in range(5))
    for got, want in zip(
        c.feddyn_gradients(w, a, d, 0.1), [c.feddyn_gradient(*x, 0.1) for x in zip(w, a, d)]
    ):
        assert torch.equal(got, want)
    for got, want in zip(
        c.feddyn_dual_updates(d, w, a, 0.1), [c.feddyn_dual_update(*x, 0.1) for x in zip(d, w, a)]
    ):
        assert torch.equal(got, want)
    want = [c.feddc_gradient(*x, 0.1) for x in zip(w, a, h, k)]
    assert all(torch.equal(x, y) for x, y in zip(c.feddc_gradients(w, a, h, k, 0.1), want))
    params = [torch.nn.Parameter(t.clone()) for t in w]
    reference = [torch.nn.Parameter(t.clone()) for t in w]
    for p, q, t in zip(params, reference, d):
        p.grad, q.grad = t.clone() * 50, t.clone() * 50
    clip_grads_(params, 1.0)
    torch.nn.utils.clip_grad_norm_(reference, 1.0)
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(params, reference))
