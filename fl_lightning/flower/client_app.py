"""A Flower ``ClientApp`` that runs fl_lightning's client: the same local work as the simulation.

On a ``train`` message the node's client (its partition id is its fl_lightning client id) loads the
payload the server strategy built with ``strategy.message`` (weights, SCAFFOLD's control, ...), runs
:func:`fl_lightning.core.local.train_client` (the function :class:`~fl_lightning.core.round.FederatedLoop`
calls), keeps the client's state in ``context.state`` and replies with ``strategy.upload``'s payload,
its metrics (``MetricRecord``) and its training-metric states. On ``evaluate`` it evaluates the model it
would deploy (``personalize`` + ``adapt`` of the global model) on its local test split; on ``query`` it
tells the server which partition it holds.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from fl_lightning.core.local import evaluate, train_client
from fl_lightning.errors import ConfigError
from fl_lightning.flower.federation import Federation, cached_federation
from fl_lightning.flower.records import (
    CONFIG,
    METRICS,
    TRAIN_STATE,
    load_client_state,
    metrics_to_record,
    payload_to_records,
    records_to_payload,
    save_client_state,
    train_state_to_record,
)
from fl_lightning.functional.tensor import load_tensors

log = logging.getLogger("fl_lightning")

#: Keys of a node's ``node_config`` (``flower-supernode --node-config``; set by the simulation).
PARTITION_ID, NUM_PARTITIONS = "partition-id", "num-partitions"
#: Key of the run config (``[tool.flwr.app.config]``) naming the fl_lightning YAML.
CONFIG_KEY = "config"


def partition_of(context: Context, fed: Federation) -> int:
    """The node's fl_lightning client id: its ``partition-id``, checked against the federation."""
    if PARTITION_ID not in context.node_config:
        raise ConfigError(
            f"flower: the SuperNode has no {PARTITION_ID}; start it with --node-config "
            f"'{PARTITION_ID}=<0..{fed.num_clients - 1}> {NUM_PARTITIONS}={fed.num_clients}'"
        )
    pid = int(context.node_config[PARTITION_ID])
    parts = int(context.node_config.get(NUM_PARTITIONS, fed.num_clients))
    if parts != fed.num_clients or not 0 <= pid < fed.num_clients:
        raise ConfigError(
            f"flower: node {PARTITION_ID}={pid} {NUM_PARTITIONS}={parts} does not fit data.num_clients="
            f"{fed.num_clients} of {fed.path}; use {PARTITION_ID} in 0..{fed.num_clients - 1} and "
            f"{NUM_PARTITIONS}={fed.num_clients} (Flower's simulation: flwr run . --federation-config "
            f'"num-supernodes={fed.num_clients}")'
        )
    return pid


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
        fed = federation(context)
        pid = partition_of(context, fed)
        reply = ConfigRecord({PARTITION_ID: pid, NUM_PARTITIONS: fed.num_clients})
        return Message(RecordDict({CONFIG: reply}), reply_to=msg)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        fed = federation(context)
        cid = _checked_client(msg, context, fed)
        cfg = msg.content.config_records[CONFIG]
        round_idx = int(cfg["round"])
        worker, strategy = fed.worker, fed.module.strategy
        message = records_to_payload(msg.content, fed.device)
        _reset_personal(fed)
        res = train_client(
            worker,
            strategy,
            message,
            load_client_state(context.state),
            fed.data.clients[cid],
            round_idx,
            fed.module.loop.config,
            None,
            fed.metrics(),
        )
        save_client_state(context.state, res.state)
        content = RecordDict(
            {
                **payload_to_records(res.upload),
                METRICS: metrics_to_record(
                    {**res.metrics, "bytes_down": res.bytes_down, "bytes_up": res.bytes_up}, res.num_samples
                ),
                TRAIN_STATE: train_state_to_record(res.train_state),
                CONFIG: ConfigRecord({"client-id": cid, "round": round_idx}),
            }
        )
        return Message(content, reply_to=msg)

    @app.evaluate()
    def evaluate_(msg: Message, context: Context) -> Message:
        fed = federation(context)
        cid = _checked_client(msg, context, fed)
        worker, strategy, data = fed.worker, fed.module.strategy, fed.data.clients[cid]
        _reset_personal(fed)
        load_tensors(worker, records_to_payload(msg.content, fed.device).get("weights", {}))
        state = {k: v.to(fed.device) for k, v in load_client_state(context.state).items()}
        strategy.personalize(worker, cid, state)
        strategy.adapt(worker, data, state, fed.data.batch_size)
        metrics = fed.metrics()
        evaluate(worker, data.eval_batches(fed.data.eval_batch_size), metrics)
        # the training data stands in for a client without a test split
        count = int(data.test_idx.numel()) or data.num_samples
        content = RecordDict(
            {METRICS: metrics_to_record(metrics.compute(), count), CONFIG: ConfigRecord({"client-id": cid})}
        )
        return Message(content, reply_to=msg)

    return app


def _checked_client(msg: Message, context: Context, fed: Federation) -> int:
    cid = partition_of(context, fed)
    sent = int(msg.content.config_records[CONFIG]["client-id"])
    if sent != cid:
        raise RuntimeError(f"message for client {sent} reached the node of partition {cid}")
    return cid


def _reset_personal(fed: Federation) -> None:
    """Personal entries of the shared worker back to the initial model's (a client's first round starts
    from them, as in the loop; the worker last trained another client)."""
    personal = fed.module.strategy.personal_names(fed.module.client)
    if personal:
        load_tensors(fed.worker, {n: t for n, t in fed.module.client.state_dict().items() if n in personal})
