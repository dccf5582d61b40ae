"""Shared pieces of the drift-correction strategy tests: least-squares clients run by the real round loop."""

from __future__ import annotations

import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import Tensor, nn

from fl_lightning.api.client import ClientModule
from fl_lightning.data.federated import ClientData
from fl_lightning.engine import ClientStateStore, Engine, EngineConfig, LocalConfig, Sequential
from fl_lightning.strategies import Strategy

from conftest import global_weights, make_data, make_trainer


class LeastSquares(ClientModule):
    """A client whose task loss is ``1/2 mean_j (x_j . w - y_j)^2``: a deterministic quadratic per client."""

    def task_loss(self, outputs: Tensor, target: Tensor) -> Tensor:
        return 0.5 * (outputs.squeeze(-1) - target).pow(2).mean()


def least_squares_module(dim: int, lr: float, w0: Tensor | None = None) -> LeastSquares:
    net = nn.Linear(dim, 1, bias=False, dtype=torch.float64)
    with torch.no_grad():
        net.weight.copy_(torch.zeros(1, dim) if w0 is None else w0.reshape(1, dim))
    return LeastSquares(net, lr=lr, momentum=0.0)


def single_client(x: Tensor, y: Tensor, client_id: int = 0) -> ClientData:
    """One client holding all rows of ``x``/``y``."""
    return ClientData(client_id, x, y, torch.arange(len(y)), torch.empty(0, dtype=torch.long))


def heterogeneous_clients(num_clients: int, dim: int, rows: int, seed: int = 0) -> list[ClientData]:
    """Clients with different input scalings and different true models, so local optima disagree."""
    g = torch.Generator().manual_seed(seed)
    xs, ys = [], []
    for _ in range(num_clients):
        scale = 0.5 + 1.0 * torch.rand(dim, generator=g, dtype=torch.float64)
        x = torch.randn(rows, dim, generator=g, dtype=torch.float64) * scale
        w_true = 2.0 * torch.randn(dim, generator=g, dtype=torch.float64)
        xs.append(x)
        ys.append(x @ w_true)
    x, y = torch.cat(xs), torch.cat(ys)
    empty = torch.empty(0, dtype=torch.long)
    return [ClientData(i, x, y, torch.arange(i * rows, (i + 1) * rows), empty) for i in range(num_clients)]


def client_gradient(client: ClientData, w: Tensor) -> Tensor:
    """``grad f_i(w) = X_i^T (X_i w - y_i) / n_i`` (the exact local gradient)."""
    x, y = client.x[client.train_idx], client.y[client.train_idx]
    return x.T @ (x @ w - y) / len(y)


def global_minimiser(clients: list[ClientData]) -> Tensor:
    """``argmin_w (1/m) sum_i f_i(w)`` in closed form."""
    a = sum(
        client.x[client.train_idx].T @ client.x[client.train_idx] / client.num_samples for client in clients
    )
    b = sum(
        client.x[client.train_idx].T @ client.y[client.train_idx] / client.num_samples for client in clients
    )
    return torch.linalg.solve(a, b)


def run_rounds(
    strategy: Strategy,
    clients: list[ClientData],
    rounds: int,
    local_steps: int,
    lr: float,
    participation: float = 1.0,
) -> tuple[LeastSquares, ClientStateStore]:
    """``rounds`` rounds of the framework's round :class:`~fl_lightning.engine.round.Engine` (full-batch
    clients; no Lightning): local work, aggregation, ``server_update``, the strategy's server optimizer
    step and ``on_after_server_step``."""
    dim = clients[0].x.shape[1]
    model = least_squares_module(dim, lr)
    local = LocalConfig(batch_size=max(c.num_samples for c in clients), local_steps=local_steps, seed=0)
    engine = Engine(model, strategy, EngineConfig(local, participation=participation))
    engine.setup(clients, "multiclass", 1, executor=Sequential())
    for t in range(rounds):
        engine.run_round(t)
    return model, engine.store


def assert_resume_is_identical(
    tmp_path, make, client_state: bool = True, strategy_state: bool = True
) -> None:
    """A run resumed from a mid-run checkpoint ends bit-identical to the uninterrupted run.

    ``make()`` builds a fresh FederatedModule; compares the global model, the strategy's buffers
    (server state; non-empty if ``strategy_state``), the server optimizer's state and every client's
    state in the store (which must be non-empty if ``client_state``).
    """
    ckpt_dir = tmp_path / "ckpts"
    full = make()
    ckpt = ModelCheckpoint(dirpath=ckpt_dir, save_top_k=-1, filename="{step}")
    make_trainer(tmp_path, rounds=4, callbacks=[ckpt], enable_checkpointing=True).fit(
        full, datamodule=make_data()
    )
    resumed = make()
    make_trainer(tmp_path / "b", rounds=4).fit(
        resumed, datamodule=make_data(), ckpt_path=ckpt_dir / "step=2.ckpt"
    )
    a, b = global_weights(full), global_weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    sa, sb = full.strategy.state_dict(), resumed.strategy.state_dict()
    assert sa.keys() == sb.keys() and (len(sa) > 0) == strategy_state
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    oa, ob = (m.trainer.optimizers[0].state_dict() for m in (full, resumed))
    assert oa["param_groups"] == ob["param_groups"] and oa["state"].keys() == ob["state"].keys()
    for i, state in oa["state"].items():
        assert state.keys() == ob["state"][i].keys()
        for k, v in state.items():
            w = ob["state"][i][k]
            assert torch.equal(v, w) if isinstance(v, torch.Tensor) else v == w
    states_a, states_b = full.store.state_dict(), resumed.store.state_dict()
    assert states_a.keys() == states_b.keys() and (len(states_a) > 0) == client_state
    for cid, state in states_a.items():
        assert state.keys() == states_b[cid].keys()
        assert all(torch.equal(state[k], states_b[cid][k]) for k in state)
