"""The Flower path in one process (an in-process Grid, no Ray): the ServerApp fits the config as ``fit``
does, with the clients' work on the grid's nodes through FlowerExecutor and the ClientApp."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("flwr")

import torch
from flower_helpers import RECIPE, SCAFFOLD, LocalGrid, fit_run, max_diff
from flwr.app import MessageType
from flwr.supercore.task_identity import TaskIdentity

from fl_lightning.errors import ConfigError
from fl_lightning.flower import FlowerExecutor, client_app, fit_on_grid, load_federation
from fl_lightning.flower.records import CLIENT_STATE, CONFIG
from fl_lightning.functional.sampling import sample_clients
from fl_lightning.runs import read_scalars, read_summary


@pytest.fixture(autouse=True)
def _server_identity(monkeypatch):
    """Flower stamps messages with the run's ids, which its runtimes set; here they are the test's."""
    for attr, value in (("_run_id", 1), ("_task_id", 1), ("_node_id", 0)):
        monkeypatch.setattr(TaskIdentity, attr, value)


def _run(tmp_path, overrides: list[str], rounds: int = 3, grid: LocalGrid | None = None):
    grid = grid or LocalGrid(client_app(RECIPE, overrides), 4)
    root = [f"--trainer.default_root_dir={tmp_path}", "--trainer.enable_progress_bar=false"]
    module = fit_on_grid(grid, RECIPE, [*overrides, *root], num_rounds=rounds, wait_for_nodes=1)
    return module, grid


@pytest.mark.parametrize("overrides", [[], SCAFFOLD], ids=["fedavg", "scaffold"])
def test_flower_rounds_equal_fit(tmp_path, overrides):
    module, grid = _run(tmp_path / "flower", overrides)
    fit = fit_run(tmp_path / "fit", overrides=overrides)
    assert max_diff(dict(module.client.state_dict()), dict(fit.client.state_dict())) == 0.0
    # the round's clients are the engine's sampling with the run's seed
    trained = [
        int(m.content.config_records[CONFIG]["client-id"])
        for m in grid.sent
        if m.metadata.message_type == MessageType.TRAIN
    ]
    assert trained == [c for r in range(3) for c in sample_clients(4, 2, 0, r)]
    assert [h["failed"] for h in module.history] == [0, 0, 0]
    for key in ("train_loss", "global/acc", "bytes_up"):
        assert [h[key] for h in module.history] == [h[key] for h in fit.history], key


def test_a_flower_run_writes_the_summary_and_tensorboard_tags_of_fit(tmp_path):
    _run(tmp_path / "flower", [])
    fit_run(tmp_path / "fit", logger=True)
    flower, fit = (tmp_path / d / "lightning_logs" / "version_0" for d in ("flower", "fit"))
    a, b = read_summary(flower), read_summary(fit)
    assert a.keys() == b.keys()
    timing = ("wall_time_s", "run_wall_time_s", "mean_round_s")
    assert {k: v for k, v in a.items() if k not in timing} == {k: v for k, v in b.items() if k not in timing}
    sa, sb = read_scalars(flower), read_scalars(fit)
    assert sa.keys() == sb.keys() and "personal/acc" in sa and "z_client/0/acc" in sa
    for tag in sb:
        if "time" not in tag:
            assert [v for _, v in sa[tag]] == pytest.approx([v for _, v in sb[tag]], rel=1e-6), tag
    assert json.loads((flower / "summary.json").read_text())["rounds"] == 3


def test_scaffold_keeps_the_client_control_in_the_node_context(tmp_path):
    module, grid = _run(tmp_path, SCAFFOLD, rounds=1)
    trained = sample_clients(4, 2, 0, 0)
    for node, ctx in grid.contexts.items():
        key = f"{CLIENT_STATE}.{node - 1000}"
        held = key in ctx.state.array_records
        assert held == (node - 1000 in trained)
        if held:
            names = set(ctx.state.array_records[key].keys())
            assert names == {f"control/{n}" for n, _ in module.client.named_parameters()}
    assert len(module.store) == 0  # the server holds no client state: it stays on the nodes
    # the server's control moved: c = |S|/N mean(Delta c_i) after round 0
    assert any(float(t.abs().sum()) > 0 for t in module.strategy.control.as_dict().values())


def test_a_node_without_partition_id_is_a_one_line_config_error(tmp_path):
    grid = LocalGrid(client_app(RECIPE), 4)
    del grid.contexts[1000 + sample_clients(4, 2, 0, 0)[0]].node_config["partition-id"]
    with pytest.raises(ConfigError, match="partition-id"):
        _run(tmp_path, [], rounds=1, grid=grid)


def test_a_client_error_in_a_round_skips_only_that_client(tmp_path):
    grid = LocalGrid(client_app(RECIPE), 4)
    first, _ = sample_clients(4, 2, 0, 0)
    grid.fail_train.add(1000 + first)
    initial = load_federation(RECIPE).module.client.state_dict()
    module, _ = _run(tmp_path, ["--model.eval_clients_every=0"], rounds=1, grid=grid)
    assert module.history[0]["failed"] == 1
    assert max_diff(dict(initial), dict(module.client.state_dict())) > 0  # the other client's upload


def test_nodes_must_cover_every_partition():
    grid = LocalGrid(client_app(RECIPE), 4)
    del grid.contexts[1003]
    with pytest.raises(ConfigError, match=r"no node with partition-id in \[3\]"):
        FlowerExecutor(grid, wait_for_nodes=0.2).discover(4)


def test_num_partitions_cannot_exceed_the_clients():
    grid = LocalGrid(client_app(RECIPE), 5)
    with pytest.raises(ConfigError, match="num-partitions=5 does not fit data.num_clients=4"):
        FlowerExecutor(grid, wait_for_nodes=1).discover(4)


@pytest.mark.parametrize("overrides", [[], SCAFFOLD], ids=["fedavg", "scaffold"])
def test_fewer_nodes_than_clients_host_several_clients_each(tmp_path, overrides):
    """Flower's default local simulation has 2 SuperNodes: node p hosts clients p and p + 2 (each with its
    own state), gets one message at a time, and the run equals fit."""
    grid = LocalGrid(client_app(RECIPE, overrides), 2)
    module, _ = _run(tmp_path / "flower", overrides, grid=grid)
    fit = fit_run(tmp_path / "fit", overrides=overrides)
    assert max_diff(dict(module.client.state_dict()), dict(fit.client.state_dict())) == 0.0
    trained = {c for r in range(3) for c in sample_clients(4, 2, 0, r)}
    if overrides:  # SCAFFOLD's c_i of each hosted client, under its own key on its node
        held = {int(k.rsplit(".", 1)[1]) for ctx in grid.contexts.values() for k in ctx.state.array_records}
        assert held == trained
    for turn in grid.turns:  # one message per node per exchange
        nodes = [m.metadata.dst_node_id for m in turn]
        assert len(nodes) == len(set(nodes))


def test_evaluate_sends_every_client_the_global_weights(tmp_path):
    module, grid = _run(tmp_path, [], rounds=1)
    evaluated = [m for m in grid.sent if m.metadata.message_type == MessageType.EVALUATE]
    # after round 1 (eval_clients_every=1), which the summary's final per-client spread reuses
    assert sorted(int(m.content.config_records[CONFIG]["client-id"]) for m in evaluated) == [0, 1, 2, 3]
    assert sorted(module.client_eval) == [0, 1, 2, 3]
    assert torch.is_tensor(next(iter(module.client.state_dict().values())))


def test_resuming_a_run_whose_nodes_kept_client_state_is_refused(tmp_path):
    """SCAFFOLD's c_i lived on the nodes (a Flower run's context): a checkpoint does not hold it, so a
    resume (a new Flower run, or fit) would restart it from zero: one line instead."""
    module, _ = _run(tmp_path, SCAFFOLD, rounds=1)
    assert module.history[0]["client_held_state"]
    last = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    with pytest.raises(ConfigError, match="kept their state on their Flower nodes"):
        fit_on_grid(
            LocalGrid(client_app(RECIPE, SCAFFOLD), 4),
            RECIPE,
            [*SCAFFOLD, f"--trainer.default_root_dir={tmp_path}", "--trainer.enable_progress_bar=false"],
            num_rounds=2,
            ckpt_path=str(last),
            wait_for_nodes=1,
        )
