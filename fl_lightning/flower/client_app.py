"""A Flower ``ClientApp`` that runs fl_lightning's client side: the engine's own client path.

A node hosts the clients whose id is its ``partition-id`` modulo ``num-partitions`` (one client per node
when there are as many nodes as clients). Its engine, built from the config by
:mod:`fl_lightning.flower.federation`, has the run's ``trainer.precision`` and a
:class:`~fl_lightning.engine.executors.Sequential` executor; a message becomes that engine's
:class:`~fl_lightning.engine.work.Work` for one client, whose message is the payload the server's
``strategy.message`` built and whose state is the one the node keeps in ``context.state``.

On ``train`` the executor runs the client (:func:`~fl_lightning.engine.executors.run_client`, as on every
path: its personal layers start from the initial model's on its first round, then
:func:`~fl_lightning.engine.local.train_client`); the node checks its upload
(:func:`~fl_lightning.engine.local.check_upload`: a non-finite upload is an error reply, and the node keeps
its old state, as the engine keeps it only for accepted clients), keeps its new state and replies with the
upload, its metrics (``MetricRecord``) and its training-metric states. On ``evaluate`` the node's copy of
the global model takes the weights sent, the executor evaluates the model the client deploys and the node
replies with the metric states. On ``query`` it tells the server which partition it is.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from fl_lightning.api.types import ClientResult
from fl_lightning.engine.local import check_upload
from fl_lightning.engine.work import Work
from fl_lightning.errors import ConfigError
from fl_lightning.flower.executor import LOCAL_STEPS, NUM_PARTITIONS, PARTITION_ID, node_answer
from fl_lightning.flower.federation import Federation, cached_federation
from fl_lightning.flower.records import (
    CONFIG,
    EVAL_STATE,
    METRICS,
    TRAIN_STATE,
    load_client_state,
    metrics_to_record,
    payload_to_records,
    records_to_payload,
    save_client_state,
    tensors_to_record,
    train_state_to_record,
)
from fl_lightning.functional.tensor import load_tensors

log = logging.getLogger("fl_lightning")

#: Key of the run config (``[tool.flwr.app.config]``) naming the fl_lightning YAML.
CONFIG_KEY = "config"


def partition_of(context: Context, fed: Federation) -> tuple[int, int]:
    """The node's ``(partition-id, num-partitions)``, checked against the federation.

    A node hosts the clients whose id is its partition id modulo the number of partitions: one client per
    node with ``num-partitions = data.num_clients``, several with fewer nodes (Flower's default local
    simulation has 2).
    """
    if PARTITION_ID not in context.node_config:
        raise ConfigError(
            f"flower: the SuperNode has no {PARTITION_ID}; start it with --node-config "
            f"'{PARTITION_ID}=<0..{fed.num_clients - 1}> {NUM_PARTITIONS}={fed.num_clients}'"
        )
    pid = int(context.node_config[PARTITION_ID])
    parts = int(context.node_config.get(NUM_PARTITIONS, fed.num_clients))
    if not 1 <= parts <= fed.num_clients or not 0 <= pid < parts:
        raise ConfigError(
            f"flower: node {PARTITION_ID}={pid} {NUM_PARTITIONS}={parts} does not fit data.num_clients="
            f"{fed.num_clients} of {fed.path}; use {NUM_PARTITIONS} <= {fed.num_clients} (a node hosts "
            f"the clients whose id is its {PARTITION_ID} modulo {NUM_PARTITIONS}) and {PARTITION_ID} in "
            f"0..{NUM_PARTITIONS}-1"
        )
    return pid, parts


def client_app(
    config: str | Path | None = None, overrides: Sequence[str] = (), root: str | Path | None = None
) -> ClientApp:
    """The Flower ``ClientApp`` of an fl_lightning config.

    Args:
        config: The YAML of ``python -m fl_lightning fit --config``. The run config's ``config``
            (``[tool.flwr.app.config]`` of the Flower app's pyproject.toml, ``flwr run --run-config``)
            takes precedence.
        overrides: Command-line style overrides applied after the file (``--data.num_clients=4``).
        root: Folder a relative ``config`` is relative to (a Flower app passes its own folder).
    """
    app = ClientApp()

    def federation(context: Context) -> Federation:
        path = context.run_config.get(CONFIG_KEY, config)
        if path is None:
            raise ConfigError(
                f'flower: no fl_lightning config; set [tool.flwr.app.config] {CONFIG_KEY} = "<file>.yaml"'
            )
        return cached_federation(str(path), overrides, root)

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        return node_answer(*partition_of(context, federation(context)), msg)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        fed = federation(context)
        round_idx = int(msg.content.config_records[CONFIG]["round"])
        work = _client_work(msg, context, fed, round_idx)
        cid = work.clients[0]
        ((_, _, res),) = fed.executor.train(work)
        if not isinstance(res, ClientResult):
            raise res  # Flower replies with the error
        check_upload(cid, round_idx, res.upload)  # a fault: Flower replies with the error, state unchanged
        save_client_state(context.state, cid, res.state or {})
        content = RecordDict(
            {
                **payload_to_records(res.upload),
                METRICS: metrics_to_record(
                    {
                        **res.metrics,
                        "bytes_down": res.bytes_down,
                        "bytes_up": res.bytes_up,
                        "state_bytes": sum(t.numel() * t.element_size() for t in (res.state or {}).values()),
                    },
                    res.num_samples,
                ),
                TRAIN_STATE: train_state_to_record(res.train_state),
                CONFIG: ConfigRecord({"client-id": cid, "round": round_idx}),
            }
        )
        return Message(content, reply_to=msg)

    @app.evaluate()
    def evaluate_(msg: Message, context: Context) -> Message:
        fed = federation(context)
        work = _client_work(msg, context, fed, -1)
        sent = work.message(work.clients[0]).get("weights", {})
        load_tensors(work.model, sent)  # the node's copy of the global model: the server's weights
        _, merged = fed.executor.evaluate(work)
        content = RecordDict(
            {
                EVAL_STATE: tensors_to_record(merged.state_tensors()),
                CONFIG: ConfigRecord({"client-id": work.clients[0]}),
            }
        )
        return Message(content, reply_to=msg)

    return app


def _checked_client(msg: Message, context: Context, fed: Federation) -> int:
    """The client id the message is for, checked to be one this node hosts."""
    pid, parts = partition_of(context, fed)
    cid = int(msg.content.config_records[CONFIG]["client-id"])
    if cid % parts != pid:
        raise RuntimeError(f"a message for client {cid} reached the node of {PARTITION_ID}={pid}")
    return cid


def _client_work(msg: Message, context: Context, fed: Federation, round: int) -> Work:
    """The node engine's work for the one client the message is for: its message is the payload the server
    sent, its state the one the node keeps in ``context.state``, its local steps the server's decision when
    the message carries one (``model.system``)."""
    cid = _checked_client(msg, context, fed)
    payload = records_to_payload(msg.content, fed.device)
    state = load_client_state(context.state, cid)
    config = msg.content.config_records[CONFIG]
    steps = {cid: int(config[LOCAL_STEPS])} if LOCAL_STEPS in config else None
    return fed.module.engine.work(round, [cid], message=lambda _: payload, state=lambda _: state, steps=steps)
