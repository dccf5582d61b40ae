"""The Flower path in one process (an in-process Grid, no Ray): the ServerApp fits the config as ``fit``
does, with the clients' work on the grid's nodes through FlowerExecutor and the ClientApp; and
FlowerExecutor alone, on a hand-made Work and a fake grid (no Engine, no ClientApp)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("flwr")

import torch
from flower_helpers import RECIPE, SCAFFOLD, LocalGrid, fit_run, max_diff
from flwr.app import Error, Message, MessageType, RecordDict
from flwr.supercore.task_identity import TaskIdentity
from torch import nn

from fl_lightning.api.client import ClientModule
from fl_lightning.api.metrics import TaskMetrics
from fl_lightning.api.types import ClientResult
from fl_lightning.data.federated import ClientData
from fl_lightning.engine.local import LocalConfig
from fl_lightning.engine.work import Work
from fl_lightning.errors import ConfigError, RunError
from fl_lightning.flower import FlowerExecutor, client_app, fit_on_grid, load_federation
from fl_lightning.flower.executor import ClientFailedError, cid_of, node_answer
from fl_lightning.flower.records import (
    CLIENT_STATE,
    CONFIG,
    EVAL_STATE,
    METRICS,
    TRAIN_STATE,
    metrics_to_record,
    payload_to_records,
    records_to_payload,
    tensors_to_record,
    train_state_to_record,
)
from fl_lightning.functional.sampling import sample_clients
from fl_lightning.functional.tensor import shared_state
from fl_lightning.runs import read_scalars, read_summary
from fl_lightning.strategies import FedAvg, FedPer

from conftest import run_folder


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
    assert [h.failed for h in module.history] == [0, 0, 0]

    def kept(h):
        return (h.train["train_loss"], h.metrics["global/acc"], h.bytes_up)

    assert [kept(h) for h in module.history] == [kept(h) for h in fit.history]


def test_a_flower_run_writes_the_summary_and_tensorboard_tags_of_fit(tmp_path):
    _run(tmp_path / "flower", [])
    fit_run(tmp_path / "fit", logger=True)
    flower, fit = (run_folder(tmp_path / d) for d in ("flower", "fit"))
    assert flower.name == fit.name  # the same labelled run folder as fit's
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
    assert module.history[0].failed == 1
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
    assert module.history[0].client_held_state
    last = run_folder(tmp_path) / "checkpoints" / "last.ckpt"
    with pytest.raises(ConfigError, match="kept their state on their Flower nodes"):
        fit_on_grid(
            LocalGrid(client_app(RECIPE, SCAFFOLD), 4),
            RECIPE,
            [*SCAFFOLD, f"--trainer.default_root_dir={tmp_path}", "--trainer.enable_progress_bar=false"],
            num_rounds=2,
            ckpt_path=str(last),
            wait_for_nodes=1,
        )


def test_trainer_precision_applies_on_the_nodes(tmp_path):
    """The ClientApp runs the engine's client path with the run's trainer.precision (bf16 autocast on the
    CPU here): the Flower run equals fit's bf16 run, which differs from the fp32 run."""
    bf16 = ["--trainer.precision=bf16-mixed"]
    module, _ = _run(tmp_path / "flower", bf16)
    fit = fit_run(tmp_path / "fit", overrides=bf16)
    assert max_diff(dict(module.client.state_dict()), dict(fit.client.state_dict())) == 0.0
    fp32 = fit_run(tmp_path / "fp32")
    assert max_diff(dict(fit.client.state_dict()), dict(fp32.client.state_dict())) > 0


# ------------------------------------------------------------------------ FlowerExecutor without an Engine
class FakeGrid:
    """A Grid whose nodes run nothing: queries get each node's partition, other messages ``reply(msg)``
    (None: no reply)."""

    def __init__(self, num_nodes: int, reply) -> None:
        self.partitions = {1000 + p: p for p in range(num_nodes)}
        self.reply = reply
        self.sent: list[Message] = []
        self.turns: list[list[Message]] = []

    def get_node_ids(self) -> list[int]:
        return list(self.partitions)

    def send_and_receive(self, messages, timeout=None) -> list[Message]:
        messages = list(messages)
        self.turns.append(messages)
        replies = []
        for msg in messages:
            self.sent.append(msg)
            if msg.metadata.message_type == MessageType.QUERY:
                pid = self.partitions[msg.metadata.dst_node_id]
                replies.append(node_answer(pid, len(self.partitions), msg))
            elif (reply := self.reply(msg)) is not None:
                replies.append(reply)
        return replies


def _unused(*_):
    raise AssertionError("the Flower executor trains nothing in this process")


def _work(strategy=None, round: int = 2, clients=(0, 1, 2, 3)) -> Work:
    """A hand-made round of 4 clients of 5 samples (no Engine, no Trainer)."""
    torch.manual_seed(0)
    model = ClientModule(nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3)))
    strategy = strategy or FedAvg()
    strategy.setup(model, 4)
    x, y = torch.randn(20, 4), torch.randint(0, 3, (20,))
    rows = [torch.arange(5 * c, 5 * c + 5) for c in range(4)]
    data = [ClientData(c, x, y, rows[c], rows[c][:2]) for c in range(4)]
    sent = {"weights": shared_state(model)}
    return Work(
        round=round,
        clients=tuple(clients),
        strategy=strategy,
        model=model,
        data=data,
        message=lambda cid: sent,
        state=_unused,
        local=LocalConfig(8),
        precision=None,
        worker=_unused,
        metrics=lambda: TaskMetrics("multiclass", 3),
    )


def _train_reply(msg: Message, state_bytes: int = 0) -> Message:
    """What a node's ClientApp replies: the upload (the weights sent + client id), metrics and states."""
    cid = cid_of(msg)
    upload = {g: {n: t + cid for n, t in ts.items()} for g, ts in records_to_payload(msg.content).items()}
    metrics = {"train_loss": 0.5 + cid, "bytes_down": 100, "bytes_up": 200 + cid, "state_bytes": state_bytes}
    train_state = {"train_loss": {"mean_value": torch.tensor(float(cid)), "weight": torch.tensor(2.0)}}
    content = RecordDict(
        {
            **payload_to_records(upload),
            METRICS: metrics_to_record(metrics, 10 + cid),
            TRAIN_STATE: train_state_to_record(train_state),
        }
    )
    return Message(content, reply_to=msg)


def test_flower_executor_turns_each_reply_into_the_client_result():
    grid = FakeGrid(4, _train_reply)
    executor = FlowerExecutor(grid, wait_for_nodes=1)
    work = _work()
    outcomes = list(executor.train(work))
    assert [cid for cid, _, _ in outcomes] == [0, 1, 2, 3]
    assert executor.nodes == {c: 1000 + c for c in range(4)}
    weights = work.message(0)["weights"]
    for cid, message, res in outcomes:
        assert message is work.message(cid) and isinstance(res, ClientResult)
        assert res.client_id == cid and res.num_samples == 10 + cid and res.state is None  # kept on the node
        assert res.metrics == {"train_loss": 0.5 + cid}
        assert (res.bytes_down, res.bytes_up) == (100, 200 + cid)
        assert all(torch.equal(res.upload["weights"][n], t + cid) for n, t in weights.items())
        assert float(res.train_state["train_loss"]["mean_value"]) == cid
    trained = [m for m in grid.sent if m.metadata.message_type == MessageType.TRAIN]
    assert [(cid_of(m), m.content.config_records[CONFIG]["round"], m.metadata.group_id) for m in trained] == [
        (c, 2, "2") for c in range(4)
    ]
    assert executor.counts == {"sequential": 4, "vectorised": 0} and not executor.state_held
    assert executor.share(work) == [0, 1, 2, 3] and executor.gather(work, None, None) == {}  # type: ignore[arg-type]


def test_a_node_that_keeps_client_state_is_reported():
    executor = FlowerExecutor(FakeGrid(4, lambda m: _train_reply(m, state_bytes=16)), wait_for_nodes=1)
    list(executor.train(_work(clients=(1,))))
    assert executor.state_held


def test_an_error_reply_or_none_is_that_client_failure_and_the_others_go_on():
    def reply(msg):
        cid = cid_of(msg)
        if cid == 1:
            return Message(Error(code=0, reason="RuntimeError: boom"), reply_to=msg)
        return None if cid == 2 else _train_reply(msg)

    executor = FlowerExecutor(FakeGrid(4, reply), wait_for_nodes=1)
    outcomes = {cid: res for cid, _, res in executor.train(_work())}
    assert isinstance(outcomes[0], ClientResult) and isinstance(outcomes[3], ClientResult)
    assert isinstance(outcomes[1], ClientFailedError) and isinstance(outcomes[2], ClientFailedError)
    assert str(outcomes[1]) == "client 1 (node 1001): RuntimeError: boom"
    assert str(outcomes[2]) == "client 2 (node 1002): no reply"


def test_the_clients_of_a_node_go_out_in_turns():
    grid = FakeGrid(2, _train_reply)
    executor = FlowerExecutor(grid, wait_for_nodes=1)
    assert [cid for cid, _, _ in executor.train(_work())] == [0, 1, 2, 3]
    assert executor.nodes == {0: 1000, 1: 1001, 2: 1000, 3: 1001}
    trains = [t for t in grid.turns if t[0].metadata.message_type == MessageType.TRAIN]
    assert [[cid_of(m) for m in t] for t in trains] == [[0, 1], [2, 3]]


def _eval_reply(msg: Message) -> Message:
    """A node's evaluate reply: the metric states of two predictions of class ``cid``, one of them right
    for client 1, both for client 2."""
    cid = cid_of(msg)
    metrics = TaskMetrics("multiclass", 3)
    metrics.update(torch.eye(3)[[cid, cid]] * 5, torch.tensor([cid, 0 if cid == 1 else cid]))
    return Message(RecordDict({EVAL_STATE: tensors_to_record(metrics.state_tensors())}), reply_to=msg)


def test_evaluate_sends_the_shared_weights_and_merges_the_nodes_metric_states():
    grid = FakeGrid(4, _eval_reply)
    work = _work(FedPer(head=1), round=-1, clients=(1, 2))
    per, merged = FlowerExecutor(grid, wait_for_nodes=1).evaluate(work)
    sent = [m for m in grid.sent if m.metadata.message_type == MessageType.EVALUATE]
    assert [cid_of(m) for m in sent] == [1, 2]
    assert set(records_to_payload(sent[0].content)["weights"]) == {"net.0.weight", "net.0.bias"}  # no head
    assert per[1]["acc"] == pytest.approx(0.5) and per[2]["acc"] == pytest.approx(1.0)
    assert merged.compute()["acc"] == pytest.approx(0.75)


def test_a_client_that_cannot_be_evaluated_is_left_out_or_one_run_error(caplog):
    """A node that cannot evaluate (an error reply, no reply: it died) is left out of that evaluation with
    a warning naming it, and the run goes on; with model.tolerate_client_failures=false it stops the run."""

    def reply(msg):
        if cid_of(msg) == 0:
            return Message(Error(code=0, reason="<class 'ValueError'>:<'bad'>"), reply_to=msg)
        return None if cid_of(msg) == 1 else _eval_reply(msg)

    line = r"flower: client 0 \(node 1000\) could not be evaluated: ValueError: bad"
    with pytest.raises(RunError, match=line + "; model.tolerate_client_failures=false stops the run"):
        FlowerExecutor(FakeGrid(4, reply), wait_for_nodes=1, tolerate_failures=False).evaluate(
            _work(round=-1, clients=(0,))
        )
    per, merged = FlowerExecutor(FakeGrid(4, reply), wait_for_nodes=1).evaluate(
        _work(round=-1, clients=(0, 1, 2))
    )
    assert list(per) == [2] and merged.compute()["acc"] == pytest.approx(1.0)
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("client 0 (node 1000) could not be evaluated: ValueError: bad; left out" in w for w in warned)
    assert any("client 1 (node 1001) could not be evaluated: no reply; left out" in w for w in warned)


def test_a_train_message_carries_the_local_steps_the_engine_decided():
    """``model.system``'s partial work reaches the nodes: each ``train`` message's config names its client's
    steps, and the ClientApp's Work runs exactly them (its ``local_for``)."""
    import dataclasses

    from fl_lightning.flower.executor import LOCAL_STEPS

    grid = FakeGrid(4, _train_reply)
    work = dataclasses.replace(_work(), steps={0: 3, 1: 1, 2: 7, 3: 2})
    list(FlowerExecutor(grid, wait_for_nodes=1).train(work))
    trained = [m for m in grid.sent if m.metadata.message_type == MessageType.TRAIN]
    assert {cid_of(m): m.content.config_records[CONFIG][LOCAL_STEPS] for m in trained} == {
        0: 3,
        1: 1,
        2: 7,
        3: 2,
    }
    assert work.local_for(2).num_steps(work.data[2]) == 7 and work.local_for(2).batch_size == 8
    plain = FakeGrid(4, _train_reply)
    list(FlowerExecutor(plain, wait_for_nodes=1).train(_work()))  # no decision: no steps in the message
    assert not any(
        LOCAL_STEPS in m.content.config_records[CONFIG] for m in plain.sent if m.content.config_records
    )


def test_clients_sent_the_same_tensors_share_one_record_and_others_get_their_own():
    """The global model goes to each client as a fresh view of the same memory (``shared_state``): it is
    turned into Flower records once a round; a client sent other tensors (a copy, other values) gets records
    of its own."""
    import dataclasses

    work = _work()

    def message(cid):
        weights = shared_state(work.model)
        if cid == 2:
            return {"weights": {n: t.clone() for n, t in weights.items()}}
        return {"weights": {n: t + 1 for n, t in weights.items()} if cid == 3 else weights}

    grid = FakeGrid(4, _train_reply)
    list(FlowerExecutor(grid, wait_for_nodes=1).train(dataclasses.replace(work, message=message)))
    trained = [m for m in grid.sent if m.metadata.message_type == MessageType.TRAIN]
    records = {cid_of(m): m.content.array_records["payload.weights"] for m in trained}
    assert records[0] is records[1] and records[2] is not records[0] and records[3] is not records[0]
    sent = {cid: records_to_payload(m.content)["weights"] for cid, m in ((cid_of(m), m) for m in trained)}
    weights = shared_state(work.model)
    for n, t in weights.items():
        assert torch.equal(sent[0][n], t) and torch.equal(sent[2][n], t) and torch.equal(sent[3][n], t + 1)


class _SlowGrid:
    """A grid with Flower's push and pull, whose replies come after ``after`` seconds of a fake clock."""

    def __init__(self, after: float, clock: list[float]) -> None:
        self.after, self.clock, self.pulls = after, clock, 0

    def push_messages(self, messages):
        self.messages = list(messages)
        for i, m in enumerate(self.messages):
            m.metadata.__dict__["_message_id"] = f"m{i}"
        return [m.metadata.message_id for m in self.messages]

    def pull_messages(self, ids):
        self.pulls += 1
        if self.clock[0] < self.after:
            return []
        return [Message(RecordDict(), reply_to=m) for m in self.messages if m.metadata.message_id in ids]


@pytest.mark.parametrize("after", [0.2, 5.0])
def test_replies_are_asked_for_often_at_first_then_every_poll_interval(monkeypatch, after):
    """A reply is collected within 5% of the exchange's time (at least 5 ms between two asks), and never
    later than ``poll_interval`` after it came: a short simulated round is not rounded up to the interval."""
    import fl_lightning.flower.executor as executor_module

    clock, waits = [0.0], []

    def sleep(seconds):
        waits.append(seconds)
        clock[0] += seconds

    monkeypatch.setattr(executor_module.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(executor_module.time, "sleep", sleep)
    grid = _SlowGrid(after, clock)
    executor = FlowerExecutor(grid, wait_for_nodes=1, poll_interval=0.05)
    message = Message(RecordDict(), dst_node_id=1, message_type=MessageType.TRAIN)
    assert len(executor._exchange([message], timeout=None)) == 1
    assert waits[0] == executor_module.MIN_POLL and max(waits) <= 0.05
    assert clock[0] - after <= max(0.05 * after, executor_module.MIN_POLL) + 1e-9  # collected soon after
    elapsed = 0.0
    for wait in waits:
        assert wait == pytest.approx(min(0.05, max(executor_module.MIN_POLL, elapsed / 20)))
        elapsed += wait
