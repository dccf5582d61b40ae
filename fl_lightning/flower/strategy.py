"""A Flower server strategy that runs an fl_lightning strategy's server half.

``configure_train`` samples the round's clients as :meth:`FederatedLoop.sample
<fl_lightning.core.round.FederatedLoop.sample>` does (``strategy.select_clients`` with the run's seed)
and sends each the payload of ``strategy.message(model, client_id, round)``; ``aggregate_train`` feeds
the replies, in client-id order, to ``strategy.aggregator()`` (per-group ``strategy.weighting``,
``server_receive``), then ``process_aggregate``, ``server_update``, the server optimizer's step and
``on_after_server_step``: the same calls, in the same order, as a round of ``FederatedModule``, so a
Flower run and an fl_lightning run of one config reach the same global model.

Flower numbers rounds from 1, fl_lightning from 0: Flower's round ``r`` is fl_lightning's ``r - 1``.
Nodes are matched to fl_lightning client ids by their ``partition-id`` (asked once with a ``query``
message); the run waits until every partition of the federation has a node.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy as FlowerBase
from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords

from fl_lightning.core.client import merge_train_states
from fl_lightning.core.types import RoundInfo
from fl_lightning.errors import ConfigError
from fl_lightning.flower.client_app import NUM_PARTITIONS, PARTITION_ID
from fl_lightning.flower.federation import Federation
from fl_lightning.flower.records import (
    CONFIG,
    METRICS,
    NUM_EXAMPLES,
    TRAIN_STATE,
    payload_to_records,
    record_to_tensors,
    record_to_train_state,
    records_to_payload,
    tensors_to_record,
)
from fl_lightning.functional.tensor import all_finite, load_tensors, shared_state

log = logging.getLogger("fl_lightning")


class FlowerStrategy(FlowerBase):
    """Flower's ``Strategy`` interface over an fl_lightning run's strategy, global model and sampling.

    Args:
        federation: The run (:func:`~fl_lightning.flower.federation.load_federation` of its config).
        wait_for_nodes: Seconds to wait for a node of every partition before giving up.
    """

    def __init__(self, federation: Federation, wait_for_nodes: float = 600.0) -> None:
        self.fed = federation
        self.model = federation.module.client
        self.strategy = federation.module.strategy
        self.loop = federation.module.loop
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = self.strategy.configure_server_optimizer(params)
        self.wait_for_nodes = wait_for_nodes
        self.nodes: dict[int, int] = {}  # fl_lightning client id -> Flower node id
        self.sampled: list[int] = []
        self.history: list[dict[str, float]] = []

    def summary(self) -> None:
        log.info(
            "fl_lightning strategy %s over %d clients (%s)",
            type(self.strategy).__name__,
            self.fed.num_clients,
            self.fed.path,
        )

    def global_arrays(self) -> ArrayRecord:
        """The global model's state as an ``ArrayRecord``."""
        return tensors_to_record(self.model.state_dict())

    # ------------------------------------------------------------------------------ nodes
    def discover(self, grid: Grid) -> None:
        """Learn the partition id of every node until each client id has one (``query`` messages)."""
        deadline = time.monotonic() + self.wait_for_nodes
        asked: set[int] = set(self.nodes.values())
        while len(self.nodes) < self.fed.num_clients:
            new = [n for n in grid.get_node_ids() if n not in asked]
            if new:
                query = RecordDict({CONFIG: ConfigRecord({"ask": PARTITION_ID})})
                messages = [Message(query, dst_node_id=n, message_type=MessageType.QUERY) for n in new]
                for reply in grid.send_and_receive(messages, timeout=self.wait_for_nodes):
                    node = reply.metadata.src_node_id
                    if reply.has_error():
                        raise ConfigError(f"flower: node {node} cannot run the client: {reply.error.reason}")
                    asked.add(node)
                    answer = reply.content.config_records[CONFIG]
                    pid, parts = int(answer[PARTITION_ID]), int(answer[NUM_PARTITIONS])
                    if pid in self.nodes:
                        raise ConfigError(
                            f"flower: nodes {self.nodes[pid]} and {node} both hold {PARTITION_ID}={pid}; "
                            "give every SuperNode its own --node-config partition-id"
                        )
                    self.nodes[pid] = node
                    del parts  # checked by the client against data.num_clients
                continue
            if time.monotonic() > deadline:
                missing = sorted(set(range(self.fed.num_clients)) - set(self.nodes))
                raise ConfigError(
                    f"flower: no node with {PARTITION_ID} in {missing} after {self.wait_for_nodes:.0f} s; "
                    f"start one SuperNode per client (data.num_clients={self.fed.num_clients})"
                )
            time.sleep(0.5)

    def _messages(self, round_idx: int, clients: list[int], config: ConfigRecord, kind: str) -> list[Message]:
        out = []
        for cid in clients:
            if kind == MessageType.TRAIN:
                payload = self.strategy.message(self.model, cid, round_idx)
            else:
                personal = self.strategy.personal_names(self.model)
                payload = {"weights": shared_state(self.model, exclude=personal)}
            cfg = ConfigRecord({**dict(config), "round": round_idx, "client-id": cid})
            content = RecordDict({**payload_to_records(payload), CONFIG: cfg})
            out.append(
                Message(content, dst_node_id=self.nodes[cid], message_type=kind, group_id=str(round_idx))
            )
        return out

    # ------------------------------------------------------------------------------ train
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Messages of the round's clients: ``strategy.message`` of the global model ``arrays``."""
        self.discover(grid)
        load_tensors(self.model, record_to_tensors(arrays, self.fed.device))
        round_idx = server_round - 1
        self.sampled = self.loop.sample(self.fed.num_clients, round_idx, self.strategy)
        return self._messages(round_idx, self.sampled, config, MessageType.TRAIN)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Aggregate the uploads as ``FederatedLoop.run_round`` does, then take the server step."""
        round_idx = server_round - 1
        by_client: dict[int, RecordDict] = {}
        failed: dict[int, str] = {}
        node_to_client = {n: c for c, n in self.nodes.items()}
        for reply in replies:
            cid = node_to_client.get(reply.metadata.src_node_id, -1)
            if reply.has_error():
                failed[cid] = reply.error.reason
            else:
                by_client[cid] = reply.content
        agg = self.strategy.aggregator()
        info = RoundInfo(round_idx, list(self.sampled), [], self.fed.num_clients)
        train_states, weights = [], []
        for cid in sorted(by_client):  # the loop's order: float sums add up the same way
            content = by_client[cid]
            upload = records_to_payload(content, self.fed.device)
            if not all_finite(upload):
                failed[cid] = "uploaded non-finite values"
                continue
            metrics = content.metric_records[METRICS]
            agg.add(upload, int(metrics[NUM_EXAMPLES]), cid)
            info.aggregated.append(cid)
            if TRAIN_STATE in content.array_records:
                train_states.append(record_to_train_state(content.array_records[TRAIN_STATE]))
            weights.append(RecordDict({METRICS: metrics}))
        for cid in sorted(set(self.sampled) - set(by_client) - set(failed)):
            failed[cid] = "no reply"
        for cid, reason in sorted(failed.items()):
            log.warning("round %d: client %d excluded from the aggregate: %s", round_idx, cid, reason)
        record = {
            "round": float(round_idx),
            "clients": float(len(self.sampled)),
            "failed": float(len(failed)),
        }
        if not info.aggregated:
            log.warning(
                "round %d skipped: no client's upload reached the server; global model unchanged", round_idx
            )
            self.history.append({**record, "skipped": 1.0})
            return None, MetricRecord(record)
        info.weight_totals = agg.weight_totals
        means = self.strategy.process_aggregate(agg.means(), info)
        self.optimizer.zero_grad(set_to_none=True)
        self.strategy.server_update(self.model, means, info)
        self.optimizer.step()
        self.strategy.on_after_server_step(self.model, means, info)
        train = merge_train_states(train_states)
        client_means = aggregate_metricrecords(weights, NUM_EXAMPLES)
        summary = {**record, **{f"clients/{k}": v for k, v in client_means.items() if k != NUM_EXAMPLES}}
        summary.update({f"train/{k.removeprefix('train_')}": v for k, v in train.items()})
        self.history.append(summary)
        return self.global_arrays(), MetricRecord(summary)

    # ------------------------------------------------------------------------------ evaluate
    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Every ``model.eval_clients_every`` rounds, the clients' deployed models on their test splits
        (``model.eval_fraction`` of them, drawn as in ``FederatedModule``)."""
        every = self.fed.module.eval_clients_every
        if every <= 0 or server_round % every:
            return []
        chosen = self.fed.module.eval_sample(server_round)
        clients = list(range(self.fed.num_clients)) if chosen is None else chosen
        return self._messages(server_round - 1, clients, config, MessageType.EVALUATE)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """The clients' metrics averaged with their test-split sizes as weights (``personal/*``)."""
        contents = [
            RecordDict({METRICS: r.content.metric_records[METRICS]}) for r in replies if not r.has_error()
        ]
        if not contents:
            return None
        merged = aggregate_metricrecords(contents, NUM_EXAMPLES)
        return MetricRecord({f"personal/{k}": v for k, v in merged.items() if k != NUM_EXAMPLES})


__all__ = ["FlowerStrategy"]
