"""FlowerStrategy and the ClientApp in one process (an in-process Grid, no Ray): same rounds as ``fit``."""

from __future__ import annotations

import pytest

pytest.importorskip("flwr")

import torch
from flower_helpers import RECIPE, SCAFFOLD, LocalGrid, fit_weights, max_diff
from flwr.app import MessageType
from flwr.supercore.task_identity import TaskIdentity

from fl_lightning.errors import ConfigError
from fl_lightning.flower import FlowerStrategy, client_app, load_federation
from fl_lightning.flower.records import CLIENT_STATE, CONFIG
from fl_lightning.functional.sampling import sample_clients


@pytest.fixture(autouse=True)
def _server_identity(monkeypatch):
    """Flower stamps messages with the run's ids, which its runtimes set; here they are the test's."""
    for attr, value in (("_run_id", 1), ("_task_id", 1), ("_node_id", 0)):
        monkeypatch.setattr(TaskIdentity, attr, value)


def _run(overrides: list[str], rounds: int = 3) -> tuple[FlowerStrategy, LocalGrid]:
    fed = load_federation(RECIPE, overrides)
    grid = LocalGrid(client_app(RECIPE, overrides), fed.num_clients)
    strategy = FlowerStrategy(fed, wait_for_nodes=1)
    strategy.start(grid, strategy.global_arrays(), num_rounds=rounds)
    return strategy, grid


@pytest.mark.parametrize("overrides", [[], SCAFFOLD], ids=["fedavg", "scaffold"])
def test_flower_rounds_equal_fit(tmp_path, overrides):
    strategy, grid = _run(overrides)
    assert max_diff(dict(strategy.model.state_dict()), fit_weights(tmp_path, overrides=overrides)) <= 1e-5
    # the round's clients are fl_lightning's sampling with the run's seed (Flower's rounds start at 1)
    trained = [
        int(m.content.config_records[CONFIG]["client-id"])
        for m in grid.sent
        if m.metadata.message_type == MessageType.TRAIN
    ]
    assert trained == [c for r in range(3) for c in sample_clients(4, 2, 0, r)]
    assert [h["failed"] for h in strategy.history] == [0.0, 0.0, 0.0]
    assert all("train/loss" in h for h in strategy.history)


def test_scaffold_keeps_the_client_control_in_the_node_context():
    strategy, grid = _run(SCAFFOLD, rounds=1)
    trained = sample_clients(4, 2, 0, 0)
    for node, ctx in grid.contexts.items():
        held = CLIENT_STATE in ctx.state.array_records
        assert held == (node - 1000 in trained)
        if held:
            names = set(ctx.state.array_records[CLIENT_STATE].keys())
            assert names == {f"control/{n}" for n, _ in strategy.model.named_parameters()}
    # the server's control moved: c = |S|/N mean(Delta c_i) after round 0
    assert any(float(t.abs().sum()) > 0 for t in strategy.strategy.control.as_dict().values())


def test_a_node_without_partition_id_is_a_one_line_config_error():
    fed = load_federation(RECIPE)
    grid = LocalGrid(client_app(RECIPE), fed.num_clients)
    bad = sample_clients(4, 2, 0, 0)[0]
    del grid.contexts[1000 + bad].node_config["partition-id"]  # that node cannot say which client it is
    strategy = FlowerStrategy(fed, wait_for_nodes=0.1)
    with pytest.raises(ConfigError, match="partition-id"):
        strategy.start(grid, strategy.global_arrays(), num_rounds=1)


def test_a_client_error_in_a_round_skips_only_that_client(monkeypatch):
    fed = load_federation(RECIPE)
    app = client_app(RECIPE)
    grid = LocalGrid(app, fed.num_clients)
    strategy = FlowerStrategy(fed, wait_for_nodes=1)
    strategy.discover(grid)
    first, second = sample_clients(4, 2, 0, 0)
    before = {k: v.clone() for k, v in strategy.model.state_dict().items()}
    grid.contexts[1000 + first].node_config["partition-id"] = second  # its train message now fails
    strategy.start(grid, strategy.global_arrays(), num_rounds=1)
    assert strategy.history[0]["failed"] == 1.0
    assert max_diff(before, dict(strategy.model.state_dict())) > 0  # the other client's upload was applied


def test_nodes_must_cover_every_partition():
    fed = load_federation(RECIPE)
    grid = LocalGrid(client_app(RECIPE), fed.num_clients)
    del grid.contexts[1003]
    strategy = FlowerStrategy(fed, wait_for_nodes=0.2)
    with pytest.raises(ConfigError, match=r"no node with partition-id in \[3\]"):
        strategy.discover(grid)


def test_num_partitions_must_match_the_config():
    fed = load_federation(RECIPE)
    grid = LocalGrid(client_app(RECIPE), fed.num_clients, node_config={"num-partitions": 5})
    strategy = FlowerStrategy(fed, wait_for_nodes=1)
    with pytest.raises(ConfigError, match="num-partitions=5 does not fit data.num_clients=4") as err:
        strategy.discover(grid)
    # the fix for Flower's simulation (whose default federation has 2 SuperNodes) is named
    assert 'flwr run . --federation-config "num-supernodes=4"' in str(err.value)


def test_evaluate_sends_every_client_the_global_weights():
    strategy, grid = _run([], rounds=1)
    evaluated = [m for m in grid.sent if m.metadata.message_type == MessageType.EVALUATE]
    assert sorted(int(m.content.config_records[CONFIG]["client-id"]) for m in evaluated) == [0, 1, 2, 3]
    assert torch.is_tensor(next(iter(strategy.model.state_dict().values())))
