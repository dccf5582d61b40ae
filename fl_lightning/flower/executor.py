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

A node that stops answering (its process died, its machine went away) is a failed client of the round:
Flower's SuperLink answers a message to a node that missed its heartbeats (Flower 1.42: 2 x 30 s) with an
error, and a node that is alive but silent fails after ``timeout`` seconds (the messages live that long, so
a stale one is not delivered later). The round goes on with the other clients, as the engine's failure
policy says. Before each exchange the executor looks for nodes it has not met (a node that came back with a
new id asks for its partition again) and hands a partition whose node went silent to the node that now
claims it; a node that comes back with its own id (node authentication keeps it) is simply sent messages
again.
"""

from __future__ import annotations

import itertools
import logging
import re
import time
from collections.abc import Iterable, Iterator, Sequence

import torch
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid
from torch import Tensor

from fl_lightning.api.metrics import TaskMetrics
from fl_lightning.api.strategy import Strategy
from fl_lightning.api.types import ClientResult, Payload
from fl_lightning.engine.work import Evaluation, Executor, Outcome, Work
from fl_lightning.errors import ConfigError, RunError
from fl_lightning.flower.records import (
    CONFIG,
    EVAL_METRICS,
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

log = logging.getLogger("fl_lightning")

#: Keys of a node's ``node_config`` (``flower-supernode --node-config``; set by the simulation).
PARTITION_ID, NUM_PARTITIONS = "partition-id", "num-partitions"
#: Key of a ``train`` message's config: the local steps the engine decided for its client (``model.system``).
LOCAL_STEPS = "local-steps"
#: Key of a ``query`` answer: ``"node"`` when the node trains on its own files (``data-dir``), else
#: ``"partition"`` (its share of the config's dataset).
DATA_SOURCE = "data"
#: Seconds of the first waits between two asks for replies (:class:`FlowerExecutor`'s ``poll_interval``).
MIN_POLL = 0.005


def poll_wait(waited: float, least: float, most: float) -> float:
    """The wait before asking again after ``waited`` seconds without what is asked for: a twentieth of it,
    between ``least`` and ``most``, so what comes is seen at most 5% (or ``least``) after it came while an
    idle asker asks less and less often (replies here; a ClientApp runner's tasks,
    :class:`~fl_lightning.flower.runner.ClientAppRunner`)."""
    return min(most, max(least, waited / 20))


#: Flower's form of an exception raised by a ClientApp (``flwr-clientapp``): ``<class 'mod.Name'>:<'text'>``.
_FLOWER_REASON = re.compile(r"^<class '(?:[\w.]*\.)?(\w+)'>:<'(.*)'>$", re.DOTALL)


def reason_line(reason: str) -> str:
    """A node's error reason as one line: Flower's ``<class 'x.y.ConfigError'>:<'text'>`` becomes
    ``ConfigError: text``, and only the first line of a longer text is kept."""
    match = _FLOWER_REASON.match(reason.strip())
    text = f"{match.group(1)}: {match.group(2)}" if match else reason.strip()
    return (text.splitlines() or [""])[0]


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
        timeout: Seconds to wait for the replies of one exchange (a round's training, an evaluation);
            a client without a reply by then failed. None: no limit (a dead node still fails once Flower
            stops seeing its heartbeats).
        tolerate_failures: A client whose evaluation failed (no reply, an error) is left out of it with
            a warning; False: it stops the run (``model.tolerate_client_failures``).
        poll_interval: The most seconds between two asks for replies (Flower's ``send_and_receive`` waits
            3 s between them on a SuperLink). The wait starts shorter: a twentieth of the time waited so far,
            at least :data:`MIN_POLL` s, so a reply that came is collected within 5% of the exchange's time
            (a simulation's round of a few tenths of a second is not rounded up to the interval).
    """

    def __init__(
        self,
        grid: Grid,
        wait_for_nodes: float = 600.0,
        timeout: float | None = None,
        tolerate_failures: bool = True,
        poll_interval: float = 0.05,
    ) -> None:
        super().__init__()
        self.grid = grid
        self.wait_for_nodes = wait_for_nodes
        self.timeout = timeout
        self.tolerate_failures = tolerate_failures
        self.poll_interval = poll_interval
        self.nodes: dict[int, int] = {}  # fl_lightning client id -> Flower node id
        self.node_data: dict[int, bool] = {}  # partition id -> its node trains on its own files
        self._partitions: dict[int, int] = {}  # partition id -> Flower node id
        self._parts = 0  # num-partitions the nodes reported
        self._asked: set[int] = set()  # node ids that answered a query
        self._silent: set[int] = set()  # node ids that did not answer their last message

    # ------------------------------------------------------------------------------ nodes
    def discover(self, num_clients: int) -> None:
        """Learn every node's partition (``query`` messages) until each partition has a node; then client
        ``c`` is hosted by the node of partition ``c mod num-partitions``. Once every partition has a node,
        a call only asks the nodes not met yet (a node back under a new id takes its partition over from a
        node that went silent)."""
        if self._parts and len(self._partitions) >= self._parts:
            self._ask_new(rejoin=True)
            self.nodes = {c: self._partitions[c % self._parts] for c in range(num_clients)}
            return
        deadline = time.monotonic() + self.wait_for_nodes
        while not self._parts or len(self._partitions) < self._parts:
            if self._ask_new(rejoin=False):
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
        own = sorted(p for p, mine in self.node_data.items() if mine)
        if own:
            log.info(
                "flower: clients %s train on their nodes' own files (data-dir); data.dataset serves the "
                "server's evaluation only",
                own,
            )

    def _ask_new(self, rejoin: bool) -> bool:
        """Ask the nodes not met yet for their partition; whether any answered."""
        online = list(self.grid.get_node_ids())
        new = [n for n in online if n not in self._asked]
        if not new:
            return False
        query = RecordDict({CONFIG: ConfigRecord({"ask": PARTITION_ID})})
        messages = [Message(query, dst_node_id=n, message_type=MessageType.QUERY) for n in new]
        answered = False
        limit = self.wait_for_nodes if not rejoin else (self.timeout or self.wait_for_nodes)
        for reply in self._exchange(messages, limit):
            self._register(reply, rejoin, online)
            self._asked.add(reply.metadata.src_node_id)
            answered = True
        return answered

    def _register(self, reply: Message, rejoin: bool = False, online: Sequence[int] = ()) -> None:
        node = reply.metadata.src_node_id
        if reply.has_error():
            raise ConfigError(f"flower: node {node} cannot run the client: {reason_line(reply.error.reason)}")
        answer = reply.content.config_records[CONFIG]
        pid, parts = int(answer[PARTITION_ID]), int(answer[NUM_PARTITIONS])
        if self._parts and parts != self._parts:
            raise ConfigError(
                f"flower: node {node} has {NUM_PARTITIONS}={parts}, others {self._parts}; give every "
                f"SuperNode the same --node-config {NUM_PARTITIONS}"
            )
        held = self._partitions.get(pid)
        if held is not None and held != node:
            gone = held in self._silent or held not in online
            if not (rejoin and gone):
                raise ConfigError(
                    f"flower: nodes {held} and {node} both hold {PARTITION_ID}={pid}; "
                    "give every SuperNode its own --node-config partition-id"
                )
            log.info(
                "flower: node %d takes %s=%d over from node %d, which went silent",
                node,
                PARTITION_ID,
                pid,
                held,
            )
            self._silent.discard(held)
        self._parts = parts
        self._partitions[pid] = node
        self.node_data[pid] = str(answer.get(DATA_SOURCE, "partition")) == "node"

    def _exchange(self, messages: list[Message], timeout: float | None) -> list[Message]:
        """Send ``messages`` and collect their replies until all came or ``timeout`` passed.

        With a grid that can push and pull (Flower's), the replies are asked for every ``poll_interval``
        seconds; other grids (tests) use their ``send_and_receive``.
        """
        push, pull = getattr(self.grid, "push_messages", None), getattr(self.grid, "pull_messages", None)
        if push is None or pull is None:
            return list(self.grid.send_and_receive(messages, timeout=timeout))
        waiting = {i for i in push(messages) if i}
        start = time.monotonic()
        end = None if timeout is None else start + timeout
        replies: list[Message] = []
        while waiting:
            got = list(pull(waiting))
            replies.extend(got)
            waiting -= {m.metadata.reply_to_message_id for m in got}
            now = time.monotonic()
            if not waiting or (end is not None and now >= end):
                break
            time.sleep(poll_wait(now - start, MIN_POLL, self.poll_interval))
        return replies

    def _send(
        self, work: Work, kind: str, round: int, payloads: dict[int, Payload]
    ) -> dict[int, Message | str]:
        """Send each client its payload; its reply, or why there is none, by client id."""
        self.discover(len(work.data))
        messages = []
        # clients sent the same tensors (e.g. the global model: a fresh view of it for each) share records
        converted: dict[tuple, dict] = {}
        for cid, payload in payloads.items():
            key = tuple((g, n, *_memory(t)) for g, ts in payload.items() for n, t in ts.items())
            if key not in converted:
                converted[key] = payload_to_records(payload)
            config = {"round": round, "client-id": cid}
            if work.steps is not None and cid in work.steps:  # the engine's decision (model.system)
                config[LOCAL_STEPS] = int(work.steps[cid])
            content = RecordDict({**converted[key], CONFIG: ConfigRecord(config)})
            ttl = {"ttl": self.timeout} if self.timeout else {}  # a message nobody took in time expires
            messages.append(
                Message(content, dst_node_id=self.nodes[cid], message_type=kind, group_id=str(round), **ttl)
            )
        replies: dict[int, Message | str] = {cid: "no reply" for cid in payloads}
        # a node gets one message at a time: the messages of a node's clients go out in turns
        turns: dict[int, list[Message]] = {}
        for message in messages:
            turns.setdefault(message.metadata.dst_node_id, []).append(message)
        for wave in itertools.zip_longest(*turns.values()):
            sent = [m for m in wave if m is not None]
            received: Iterable[Message] = self._exchange(sent, self.timeout)
            # pushing gave each message its id (Flower's grids); a SuperLink's own error reply (a node that
            # missed its heartbeats) comes from the SuperLink, so replies are matched by message id
            for_message = {m.metadata.message_id: cid_of(m) for m in sent if m.metadata.message_id}
            for_node = {m.metadata.dst_node_id: cid_of(m) for m in sent}
            answered = set()
            for reply in received:
                cid = for_message.get(reply.metadata.reply_to_message_id, -1)
                if cid == -1:  # a grid that does not keep message ids (tests): by the node
                    cid = for_node.get(reply.metadata.src_node_id, -1)
                if cid in replies:
                    replies[cid] = self._why(reply.error.reason) if reply.has_error() else reply
                    answered.add(self.nodes[cid])
            for node in for_node:
                if node in answered:
                    self._silent.discard(node)
                else:
                    self._silent.add(node)
        if self.timeout:
            for cid, reply in replies.items():
                if isinstance(reply, str) and reply == "no reply":
                    replies[cid] = f"no reply within {self.timeout:g} s"
        return replies

    def _why(self, reason: str) -> str:
        """A failed reply's reason in one line; the SuperLink's own errors said in our terms."""
        if reason.startswith("Error: Node Unavailable"):
            return "its node is offline (the SuperLink missed its heartbeats)"
        if reason.startswith("Error: Message Unavailable") and self.timeout:
            return f"no reply within {self.timeout:g} s (the message expired)"
        return reason_line(reason)

    # ------------------------------------------------------------------------------ train
    def train(self, work: Work) -> Iterator[Outcome]:
        refuse_server_deployed(work.strategy)  # before any round runs, not at the final evaluation
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
        refuse_server_deployed(work.strategy)
        personal = work.strategy.personal_names(work.model)
        weights = {"weights": shared_state(work.model, exclude=personal)}
        replies = self._send(work, MessageType.EVALUATE, -1, dict.fromkeys(work.clients, weights))
        merged = work.metrics()
        per: dict[int, dict[str, float]] = {}
        states = []
        for cid in work.clients:
            reply = replies[cid]
            if isinstance(reply, str):
                node = self.nodes[cid]
                line = f"flower: client {cid} (node {node}) could not be evaluated: {reply}"
                if not self.tolerate_failures:
                    raise RunError(f"{line}; model.tolerate_client_failures=false stops the run")
                log.warning("%s; left out of this evaluation", line)
                continue
            tensors = record_to_tensors(reply.content.array_records[EVAL_STATE])
            values = reply.content.metric_records.get(EVAL_METRICS)
            if values is None:  # a node that sends the states only
                values = TaskMetrics.from_state_tensors(merged.task, merged.num_classes, tensors).compute()
            per[cid] = {k: float(v) for k, v in values.items()}
            states.append(tensors)
        if states:
            combined = combine_states(merged, states)
            merged.merge(TaskMetrics.from_state_tensors(merged.task, merged.num_classes, combined))
        return per, merged


def refuse_server_deployed(strategy: Strategy) -> None:
    """One line for a strategy whose clients' deployed models come from server state (IFCA, CFL)."""
    if strategy.deploys_server_models:
        raise ConfigError(
            f"flower: model.strategy={type(strategy).__name__} deploys each client's model from the server's "
            "cluster models, which Flower's evaluate message does not carry; run it in simulation "
            "(python -m fl_lightning fit)"
        )


def combine_states(template: TaskMetrics, states: list[dict[str, Tensor]]) -> dict[str, Tensor]:
    """Several clients' metric states (:meth:`TaskMetrics.state_tensors`) as the states of one instance
    updated with all their batches: counts and sums added, list states (stored scores) concatenated.

    Equal to merging one :class:`TaskMetrics` per client (tested), with one instance made instead of one
    per client (each costs milliseconds: torchmetrics copies its default states).
    """
    members = {**dict(template.scores.items(keep_base=True, copy_state=False)), "loss": template.loss}
    listed = {
        f"{name}/{key}"
        for name, metric in members.items()
        for key, value in metric.metric_state.items()
        if isinstance(value, list)
    }
    out: dict[str, Tensor] = {}
    for key in dict.fromkeys(k for s in states for k in s):
        parts = [s[key] for s in states if key in s]
        if key in listed:
            out[key] = torch.cat([p.reshape(-1, *p.shape[1:]) if p.dim() else p.reshape(1) for p in parts])
        else:
            out[key] = torch.stack(parts).sum(0)
    return out


def _memory(t: Tensor) -> tuple:
    """What makes two tensors the same values here and now: their memory, layout, type and version (a
    ``detach()`` view shares its tensor's memory and version counter; an in-place change bumps it)."""
    return (t.device, t.data_ptr(), t.shape, t.stride(), t.dtype, t._version)


def cid_of(message: Message) -> int:
    """The client id a ``train``/``evaluate`` message is for."""
    return int(message.content.config_records[CONFIG]["client-id"])


def node_answer(pid: int, parts: int, msg: Message, own_data: bool = False) -> Message:
    """A node's reply to a ``query``: its partition id, the number of partitions and where its client's data
    comes from (its own files, or its partition of the config's dataset)."""
    reply = ConfigRecord(
        {PARTITION_ID: pid, NUM_PARTITIONS: parts, DATA_SOURCE: "node" if own_data else "partition"}
    )
    return Message(RecordDict({CONFIG: reply}), reply_to=msg)


__all__ = [
    "DATA_SOURCE",
    "LOCAL_STEPS",
    "NUM_PARTITIONS",
    "PARTITION_ID",
    "ClientFailedError",
    "FlowerExecutor",
    "combine_states",
    "node_answer",
    "reason_line",
]
