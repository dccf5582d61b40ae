"""fl_lightning.engine.batched: a stacked group's network as a batched linear chain with a hand-written
backward, the local SGD step fused into it (held back as low-rank updates for large layers), and when the
step may be fused. Every computation is checked against autograd on each client's own network, in float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fl_lightning.api.client import ClientModule
from fl_lightning.engine import batched
from fl_lightning.engine.batched import ChainRun, fusion_blocker, linear_chain
from fl_lightning.engine.local import LocalConfig
from fl_lightning.models import MLP, CharLSTM, LogisticRegression, SmallCNN
from fl_lightning.strategies import FedAvg, get_strategy
from fl_lightning.strategies.plugins import DP, Median

K = 3  # clients in the stacks of these tests


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x):
        return self.b(x + self.a(x))


class Twice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)

    def forward(self, x):
        return self.a(torch.relu(self.a(x)))


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 4)
        self.scale = nn.Parameter(torch.ones(4))

    def forward(self, x):
        return self.a(x) * self.scale


class Functional(nn.Module):
    """A chain written with functions and methods rather than modules."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(64, 12), nn.Linear(12, 5, bias=False)

    def forward(self, x):
        return self.b(torch.tanh(F.relu(self.a(torch.flatten(x, 1)))).sigmoid())


def _sequential() -> nn.Module:
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(64, 12),
        nn.Tanh(),
        nn.Identity(),
        nn.Linear(12, 7, bias=False),
        nn.Dropout(0.0),
        nn.Sigmoid(),
        nn.Linear(7, 5),
    )


NETS = {
    "mlp": lambda: MLP(in_features=64, num_classes=5, hidden=(16, 8)),
    "logistic": lambda: LogisticRegression(input_dim=64, num_outputs=5),
    "sequential": _sequential,
    "functional": Functional,
}


@pytest.mark.parametrize("name", list(NETS))
def test_linear_chains_are_recognised(name):
    layers, why = linear_chain(NETS[name]())
    assert layers is not None and why == ""
    assert sum(layer.kind == "linear" for layer in layers) >= 1


@pytest.mark.parametrize(
    ("net", "reason"),
    [
        (SmallCNN(in_channels=1, num_classes=10, width=4, hidden=16), "Conv2d is not a linear-chain layer"),
        (CharLSTM(vocab_size=20, num_outputs=20, hidden_size=8), "not a linear-chain"),
        (Residual(), "does not continue a chain"),
        (Twice(), "uses a linear layer twice"),
        (Scaled(), "not a linear-chain step"),
        (nn.Sequential(nn.Flatten(), nn.ReLU()), "no linear layer"),
    ],
)
def test_other_networks_are_not_chains_and_say_why(net, reason):
    layers, why = linear_chain(net)
    assert layers is None and reason in why and "\n" not in why


def _stack(net: nn.Module, jitter: float = 0.1) -> dict[str, nn.Parameter]:
    """``K`` different copies of ``net``'s parameters, stacked (float64)."""
    g = torch.Generator().manual_seed(1)
    return {
        n: nn.Parameter(
            p.detach().double().expand(K, *p.shape)
            + jitter * torch.randn(K, *p.shape, generator=g, dtype=torch.float64)
        )
        for n, p in net.named_parameters()
    }


def _per_client(net: nn.Module, stacked: dict[str, nn.Parameter], k: int) -> dict[str, torch.Tensor]:
    return {n: p.detach()[k].clone().requires_grad_() for n, p in stacked.items()}


def _loss(outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The sum over clients of each client's mean cross-entropy (as the stacked worker's loss)."""
    return F.cross_entropy(outputs.flatten(0, 1), y.flatten(), reduction="none").view_as(y).mean(1).sum()


@pytest.mark.parametrize("name", list(NETS))
def test_the_chain_gives_each_clients_outputs_and_gradients(name):
    net = NETS[name]().double()
    layers, _ = linear_chain(net)
    stacked = _stack(net)
    run = ChainRun(layers, stacked)
    x = torch.randn(K, 6, 1, 8, 8, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 5, (K, 6))
    out = run(x)
    _loss(out, y).backward()
    for k in range(K):
        own = _per_client(net, stacked, k)
        xk = x.detach()[k].clone().requires_grad_()
        ref = torch.func.functional_call(net, own, (xk,))
        torch.testing.assert_close(out[k], ref, rtol=0, atol=1e-12)
        F.cross_entropy(ref, y[k]).backward()
        for n, p in own.items():
            torch.testing.assert_close(stacked[n].grad[k], p.grad, rtol=0, atol=1e-12)
        torch.testing.assert_close(x.grad[k], xk.grad, rtol=0, atol=1e-12)  # the input's gradient too


@pytest.mark.parametrize("defer", [False, True])
@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_the_fused_step_is_sgds_step_over_several_steps(monkeypatch, defer, weight_decay):
    """Fused (``W <- (1 - lr wd) W - lr dW`` in the backward), and held back as low-rank updates
    (``Deferred``; a threshold of 0 bytes holds every layer back, and weight decay does not): the weights
    after 5 steps equal those of ``torch.optim.SGD`` on each client's own network. The 64x16 layer holds
    12 columns: batches of 6 flush every other step; the last step's batch of 13 goes straight in."""
    monkeypatch.setattr(batched, "DEFER_BYTES", 0 if defer else 2**40)
    net = NETS["mlp"]().double()
    layers, _ = linear_chain(net)
    stacked = _stack(net)
    clients = [_per_client(net, stacked, k) for k in range(K)]
    run = ChainRun(layers, stacked)
    fused = torch.optim.SGD(list(stacked.values()), lr=0.3, weight_decay=weight_decay)
    refs = [torch.optim.SGD(list(c.values()), lr=0.3, weight_decay=weight_decay) for c in clients]
    shared = {id(p): p.detach()[0].clone() for p in stacked.values()}
    with torch.no_grad():
        for n, p in stacked.items():  # every client starts from one weight (the message's), as in a round
            p.copy_(shared[id(p)].expand_as(p))
            for c in clients:
                c[n].copy_(shared[id(p)])
    run.fuse(fused, shared)
    assert bool(run.deferred) == (defer and weight_decay == 0)
    g = torch.Generator().manual_seed(2)
    for step in range(5):
        width = 13 if step == 4 else 6
        x = torch.randn(K, width, 64, dtype=torch.float64, generator=g)
        y = torch.randint(0, 5, (K, width), generator=g)
        fused.zero_grad()
        _loss(run(x), y).backward()
        assert all(p.grad is None for p in stacked.values())  # no gradient written
        fused.step()  # finds no gradient: a no-op
        for k, (c, opt) in enumerate(zip(clients, refs)):
            opt.zero_grad()
            F.cross_entropy(torch.func.functional_call(net, c, (x[k],)), y[k]).backward()
            opt.step()
    run.materialize()
    for k, c in enumerate(clients):
        for n, p in c.items():
            torch.testing.assert_close(stacked[n].detach()[k], p.detach(), rtol=0, atol=1e-9)
    run.fuse(None)
    assert not run.deferred


def test_a_held_back_layer_reads_its_current_weights_in_forward_and_backward(monkeypatch):
    """Between steps the stacked weights are stale; the chain's outputs and input gradients use the weights
    with every step held back: the same as a chain that writes each step into its weights."""
    net = nn.Sequential(nn.Linear(32, 24), nn.ReLU(), nn.Linear(24, 5)).double()
    layers, _ = linear_chain(net)
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(K, 4, 32, dtype=torch.float64, generator=g) for _ in range(3)]
    y = torch.randint(0, 5, (K, 4), generator=g)
    results = []
    for threshold in (0, 2**40):  # every layer held back; none
        monkeypatch.setattr(batched, "DEFER_BYTES", threshold)
        stacked = _stack(net)
        run = ChainRun(layers, stacked)
        run.fuse(torch.optim.SGD(list(stacked.values()), lr=0.5))  # no shared base: on the stacked weights
        outs, grads = [], []
        for x in xs:
            x = x.clone().requires_grad_()
            out = run(x)
            _loss(out, y).backward()
            outs.append(out.detach())
            grads.append(x.grad)
        held = {j: d.held for j, d in run.deferred.items()}
        run.materialize()
        results.append((outs, grads, [p.detach().clone() for p in stacked.values()], held))
    (outs, grads, weights, held), (outs2, grads2, weights2, _) = results
    assert held == {0: 12, 1: 4}  # 32x24 holds up to 13 columns (3 steps); 24x5 4 (each step flushes)
    for a, b in zip(outs + grads + weights, outs2 + grads2 + weights2):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("strategy", "client", "local", "reason"),
    [
        (FedAvg(), {}, {}, None),
        (Median(FedAvg()), {}, {}, None),
        (DP(FedAvg(), noise_multiplier=1.0, clip_norm=1.0), {}, {}, None),
        (FedAvg(), {"momentum": 0.9}, {}, "the local SGD has momentum"),
        (FedAvg(), {"optimizer": "adam"}, {}, "the local optimizer is Adam, not plain SGD"),
        (FedAvg(), {}, {"grad_clip_norm": 1.0}, "model.grad_clip_norm clips the gradients"),
        (get_strategy("FedProx", mu=0.1), {}, {}, "FedProx may read or change"),
        (get_strategy("Scaffold"), {}, {}, "Scaffold may read or change"),
        (get_strategy("FedSAM", rho=0.05), {}, {}, "FedSAM may read or change"),
        (Median(get_strategy("FedProx", mu=0.1)), {}, {}, "FedProx may read or change"),
    ],
)
def test_the_step_is_fused_only_where_nothing_reads_the_gradients(strategy, client, local, reason):
    from fl_lightning.api.client import ClientModule

    worker = ClientModule(NETS["mlp"](), **{"momentum": 0.0, **client})
    optimizer = worker.configure_optimizers()
    blocker = fusion_blocker(strategy, optimizer, LocalConfig(8, **local), None)
    assert blocker is None if reason is None else reason in blocker


def test_a_gradient_scaler_is_not_fused():
    from fl_lightning.api.client import ClientModule

    class Scaled16:
        scaler = object()

    worker = ClientModule(NETS["mlp"](), momentum=0.0)
    blocker = fusion_blocker(FedAvg(), worker.configure_optimizers(), LocalConfig(8), Scaled16())
    assert blocker == "a gradient scaler steps the optimizer"


def test_the_declared_gradient_capability_blocks_fusion_through_plugins():
    worker = ClientModule(NETS["mlp"](), momentum=0.0)
    optimizer = worker.configure_optimizers()
    assert fusion_blocker(Median(FedAvg()), optimizer, LocalConfig(8), None) is None
    blocker = fusion_blocker(Median(get_strategy("Scaffold")), optimizer, LocalConfig(8), None)
    assert blocker == "Scaffold may read or change the gradients"

    class Quiet(FedAvg):
        changes_gradients = False  # declared: its local_loss adds nothing (the declaration is what counts)

        def local_loss(self, module, ctx, batch, outputs):
            return None

    assert fusion_blocker(Quiet(), optimizer, LocalConfig(8), None) is None
