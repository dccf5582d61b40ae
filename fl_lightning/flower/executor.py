"""The engine's executor over Flower's grid: the clients' local work runs on SuperNodes.

The round stays the :class:`~fl_lightning.engine.round.Engine`'s (sampling, messages, attack, failure
policy, aggregation, server step, DP accounting, stop reasons); this executor receives the round's
:class:`~fl_lightning.engine.work.Work` (never the engine) and only carries its messages to the nodes of
its clients (one ``train`` message each, sent together, so the nodes work in
parallel) and turns the replies into the :class:`~fl_lightning.api.types.ClientResult` the engine's
policies see: an error reply, or no reply within ``timeout``, is that client's failure. The evaluation of
the clients' deployed models goes the same way (``evaluate`` messages; the replies carry metric states,
merged on the server). Nodes are matched to client ids by their ``partition-id`` and ``num-partitions``
(asked once with ``query`` messages): a node hosts the clients whose id is its partition id modulo the
number of partitions, one client per node when there are as many nodes as clients; a node receives at
most one message at a time (the messages of a node's clients go out in turns).

A client's persistent state (SCAFFOLD's ``c_i``, personal layers) stays on its node, in the node's
``context.state``; the node keeps the new state only when its upload passes the client-side check
(:func:`~fl_lightning.engine.local.check_upload`), as the engine keeps it only for accepted clients.
The node's ClientApp (:mod:`fl_lightning.flower.client_app`) runs the engine's own client path
(:func:`~fl_lightning.engine.executors.run_client`), with the run's ``trainer.precision``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Iterator

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from fl_lightning.api.metrics import TaskMetrics
from fl_lightning.api.types import ClientResult, Payload
from fl_lightning.engine.work import Evaluation, Executor, Outcome, Work
from fl_lightning.errors import ConfigError, RunError
from fl_lightning.flower.records import (
    CONFIG,
    EVAL_STATE,
    METRICS,
    NUM_EXAMPLES,
    TRAIN_STATE,
    payload_to_records,
    record_to_tensors,
    record_to_train_state,
    records_to_payload,
)
from fl_lightning.functional.tensor import module_device, shared_state

#: Keys of a node's ``node_config`` (``flower-supernode --node-config``; set by the simulation).
PARTITION_ID, NUM_PARTITIONS = "partition-id", "num-partitions"
#: Key of a ``train`` message's config: the local steps the engine decided for its client (``model.system``).
LOCAL_STEPS = "local-steps"


class ClientFailedError(RuntimeError):
    """A client's node replied with an error, or did not reply in time."""


class FlowerExecutor(Executor):
    """Runs the clients' work of a :class:`~fl_lightning.engine.work.Work` on the SuperNodes of a Flower
    ``Grid`` (anything with ``get_node_ids()`` and ``send_and_receive(messages, timeout)``).

    When a node replies with client state (``state_bytes`` > 0), :attr:`state_held` becomes true and the
    engine marks its rounds ``client_held_state`` in its history: a checkpoint of such a run lacks that
    state (it stays on the nodes, in the Flower run's context), so resuming it is refused with one line
    (:meth:`Engine.check_resume <fl_lightning.engine.round.Engine.check_resume>`).

    Args:
        grid: The grid of the ServerApp (``main(grid, context)``).
        wait_for_nodes: Seconds to wait for a node of every partition before giving up.
        timeout: Seconds to wait for a round's replies (None: Flower's default, no limit).
    """

    def __init__(self, grid: Grid, wait_for_nodes: float = 600.0, timeout: float | None = None) -> None:
        super().__init__()
        self.grid = grid
        self.wait_for_nodes = wait_for_nodes
        self.timeout = timeout
        self.nodes: dict[int, int] = {}  # fl_lightning client id -> Flower node id
        self._partitions: dict[int, int] = {}  # partition id -> Flower node id
        self._parts = 0  # num-partitions the nodes reported

    # ------------------------------------------------------------------------------ nodes
    def discover(self, num_clients: int) -> None:
        """Learn every node's partition (``query`` messages) until each partition has a node; then client
        ``c`` is hosted by the node of partition ``c mod num-partitions``."""
        deadline = time.monotonic() + self.wait_for_nodes
        asked: set[int] = set(self._partitions.values())
        while not self._parts or len(self._partitions) < self._parts:
            new = [n for n in self.grid.get_node_ids() if n not in asked]
            if new:
                query = RecordDict({CONFIG: ConfigRecord({"ask": PARTITION_ID})})
                messages = [Message(query, dst_node_id=n, message_type=MessageType.QUERY) for n in new]
                for reply in self.grid.send_and_receive(messages, timeout=self.wait_for_nodes):
                    self._register(reply)
                    asked.add(reply.metadata.src_node_id)
                continue
            if time.monotonic() > deadline:
                parts = self._parts or num_clients
                missing = sorted(set(range(parts)) - set(self._partitions))
                raise ConfigError(
                    f"flower: no node with {PARTITION_ID} in {missing} after {self.wait_for_nodes:.0f} s; "
                    f"start one SuperNode per partition ({NUM_PARTITIONS}={parts}; data.num_clients="
                    f"{num_clients})"
                )
            time.sleep(0.5)
        self.nodes = {c: self._partitions[c % self._parts] for c in range(num_clients)}

    def _register(self, reply: Message) -> None:
        node = reply.metadata.src_node_id
        if reply.has_error():
            raise ConfigError(f"flower: node {node} cannot run the client: {reply.error.reason}")
        answer = reply.content.config_records[CONFIG]
        pid, parts = int(answer[PARTITION_ID]), int(answer[NUM_PARTITIONS])
        if self._parts and parts != self._parts:
            raise ConfigError(
                f"flower: node {node} has {NUM_PARTITIONS}={parts}, others {self._parts}; give every "
                f"SuperNode the same --node-config {NUM_PARTITIONS}"
            )
        if pid in self._partitions:
            raise ConfigError(
                f"flower: nodes {self._partitions[pid]} and {node} both hold {PARTITION_ID}={pid}; "
                "give every SuperNode its own --node-config partition-id"
            )
        self._parts = parts
        self._partitions[pid] = node

    def _send(
        self, work: Work, kind: str, round: int, payloads: dict[int, Payload]
    ) -> dict[int, Message | str]:
        """Send each client its payload; its reply, or why there is none, by client id."""
        self.discover(len(work.data))
        messages = []
        converted: dict[
            tuple, dict
        ] = {}  # clients sent the same tensors (e.g. the global model) share records
        for cid, payload in payloads.items():
            key = tuple((g, n, id(t)) for g, ts in payload.items() for n, t in ts.items())
            if key not in converted:
                converted[key] = payload_to_records(payload)
            config = {"round": round, "client-id": cid}
            if work.steps is not None and cid in work.steps:  # the engine's decision (model.system)
                config[LOCAL_STEPS] = int(work.steps[cid])
            content = RecordDict({**converted[key], CONFIG: ConfigRecord(config)})
            messages.append(
                Message(content, dst_node_id=self.nodes[cid], message_type=kind, group_id=str(round))
            )
        replies: dict[int, Message | str] = {cid: "no reply" for cid in payloads}
        # a node gets one message at a time: the messages of a node's clients go out in turns
        turns: dict[int, list[Message]] = {}
        for message in messages:
            turns.setdefault(message.metadata.dst_node_id, []).append(message)
        for wave in itertools.zip_longest(*turns.values()):
            sent = [m for m in wave if m is not None]
            for_client = {m.metadata.dst_node_id: cid_of(m) for m in sent}
            received: Iterable[Message] = self.grid.send_and_receive(sent, timeout=self.timeout)
            for reply in received:
                cid = for_client.get(reply.metadata.src_node_id, -1)
                if cid in replies:
                    replies[cid] = reply.error.reason if reply.has_error() else reply
        return replies

    # ------------------------------------------------------------------------------ train
    def train(self, work: Work) -> Iterator[Outcome]:
        messages = {cid: work.message(cid) for cid in work.clients}
        replies = self._send(work, MessageType.TRAIN, work.round, messages)
        device = module_device(work.model)
        for cid in work.clients:
            reply = replies[cid]
            if isinstance(reply, str):
                yield cid, messages[cid], ClientFailedError(f"client {cid} (node {self.nodes[cid]}): {reply}")
                continue
            content = reply.content
            metrics = dict(content.metric_records[METRICS])
            num_samples = int(metrics.pop(NUM_EXAMPLES))
            bytes_down, bytes_up = int(metrics.pop("bytes_down")), int(metrics.pop("bytes_up"))
            self.state_held |= int(metrics.pop("state_bytes", 0)) > 0
            train_state = (
                record_to_train_state(content.array_records[TRAIN_STATE])
                if TRAIN_STATE in content.array_records
                else {}
            )
            result = ClientResult(
                cid,
                records_to_payload(content, device),
                None,  # the state stays on the node
                num_samples,
                {k: float(v) for k, v in metrics.items()},
                bytes_down,
                bytes_up,
                train_state,
            )
            self.counts["sequential"] += 1
            yield cid, messages[cid], result

    # ------------------------------------------------------------------------------ evaluate
    def evaluate(self, work: Work) -> Evaluation:
        personal = work.strategy.personal_names(work.model)
        weights = {"weights": shared_state(work.model, exclude=personal)}
        replies = self._send(work, MessageType.EVALUATE, -1, dict.fromkeys(work.clients, weights))
        merged = work.metrics()
        per: dict[int, dict[str, float]] = {}
        for cid in work.clients:
            reply = replies[cid]
            if isinstance(reply, str):
                node = self.nodes[cid]
                raise RunError(f"flower: client {cid} (node {node}) could not be evaluated: {reply}")
            tensors = record_to_tensors(reply.content.array_records[EVAL_STATE])
            metrics = TaskMetrics.from_state_tensors(merged.task, merged.num_classes, tensors)
            per[cid] = metrics.compute()
            merged.merge(metrics)
        return per, merged


def cid_of(message: Message) -> int:
    """The client id a ``train``/``evaluate`` message is for."""
    return int(message.content.config_records[CONFIG]["client-id"])


def node_answer(pid: int, parts: int, msg: Message) -> Message:
    """A node's reply to a ``query``: its partition id and the number of partitions."""
    reply = ConfigRecord({PARTITION_ID: pid, NUM_PARTITIONS: parts})
    return Message(RecordDict({CONFIG: reply}), reply_to=msg)


__all__ = [
    "LOCAL_STEPS",
    "NUM_PARTITIONS",
    "PARTITION_ID",
    "ClientFailedError",
    "FlowerExecutor",
    "node_answer",
]
