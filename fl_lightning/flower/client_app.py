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

**A node with its own data** (``--node-config 'partition-id=<id> data-dir="<folder>"'``) is client
``partition-id`` and trains on the files of its folder (:mod:`fl_lightning.data.local_files`: an ``.npz``
array file, (Fashion-)MNIST idx files or an image-folder tree), never on the config's dataset, which only
the server reads (for its own evaluation); every node is then one client, so ``num-partitions`` is
``data.num_clients``. The run config's ``data-classes`` (class names in label order, for image folders
named by class) and ``data-normalize`` (``"<mean> <std>"``) say how every node reads its files. The node
reads its folder at its first ``train`` or ``evaluate`` message and keeps it; a folder it cannot read is that
message's error (one line naming the node's folder), so the server counts the client as failed for that
round, and reads it again at the next message.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fl_lightning.api.types import ClientResult
from fl_lightning.engine.local import check_upload
from fl_lightning.engine.work import Work
from fl_lightning.errors import ConfigError
from fl_lightning.flower.executor import LOCAL_STEPS, NUM_PARTITIONS, PARTITION_ID, node_answer
from fl_lightning.flower.federation import Federation, cached_federation, cached_node_federation, cached_run
from fl_lightning.flower.records import (
    CONFIG,
    EVAL_METRICS,
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
#: Key of a node's ``node_config``: the folder of the node's own data.
DATA_DIR = "data-dir"
#: Run-config keys of how nodes read their own data: class names in label order (comma-separated), and
#: ``"<mean> <std>"`` applied to every input.
CLASSES_KEY, NORMALIZE_KEY = "data-classes", "data-normalize"


def partition_of(context: Context, num_clients: int, path: Path | str) -> tuple[int, int]:
    """The node's ``(partition-id, num-partitions)``, checked against the config's ``data.num_clients``.

    A node hosts the clients whose id is its partition id modulo the number of partitions: one client per
    node with ``num-partitions = data.num_clients``, several with fewer nodes (Flower's default local
    simulation has 2). A node with its own data (``data-dir``) is one client: ``num-partitions`` must be
    ``data.num_clients``.
    """
    if PARTITION_ID not in context.node_config:
        raise ConfigError(
            f"flower: the SuperNode has no {PARTITION_ID}; start it with --node-config "
            f"'{PARTITION_ID}=<0..{num_clients - 1}> {NUM_PARTITIONS}={num_clients}'"
        )
    pid = int(context.node_config[PARTITION_ID])
    parts = int(context.node_config.get(NUM_PARTITIONS, num_clients))
    if not 1 <= parts <= num_clients or not 0 <= pid < parts:
        raise ConfigError(
            f"flower: node {PARTITION_ID}={pid} {NUM_PARTITIONS}={parts} does not fit data.num_clients="
            f"{num_clients} of {path}; use {NUM_PARTITIONS} <= {num_clients} (a node hosts "
            f"the clients whose id is its {PARTITION_ID} modulo {NUM_PARTITIONS}) and {PARTITION_ID} in "
            f"0..{NUM_PARTITIONS}-1"
        )
    if DATA_DIR in context.node_config and parts != num_clients:
        raise ConfigError(
            f"flower: node {PARTITION_ID}={pid} has its own data ({DATA_DIR}), so it is one client: give "
            f"every node {NUM_PARTITIONS}={num_clients} (data.num_clients of {path}: one per node)"
        )
    return pid, parts


def node_reading(context: Context) -> tuple[list[str] | None, tuple[float, float] | None]:
    """How the run's nodes read their own files: the run config's class names and normalisation."""
    names = str(context.run_config.get(CLASSES_KEY, "") or "")
    classes = [c.strip() for c in names.split(",") if c.strip()] or None
    text = str(context.run_config.get(NORMALIZE_KEY, "") or "").replace(",", " ").split()
    if not text:
        return classes, None
    try:
        mean, std = (float(v) for v in text)
    except ValueError:
        raise ConfigError(
            f'run config {NORMALIZE_KEY}="{" ".join(text)}": give two numbers, "<mean> <std>" (e.g. '
            '"0.2860 0.3530"), or "" for none'
        ) from None
    return classes, (mean, std)


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

    def config_path(context: Context) -> str:
        path = context.run_config.get(CONFIG_KEY, config)
        if path is None:
            raise ConfigError(
                f'flower: no fl_lightning config; set [tool.flwr.app.config] {CONFIG_KEY} = "<file>.yaml"'
            )
        return str(path)

    def federation(context: Context) -> Federation:
        path = config_path(context)
        data_dir = context.node_config.get(DATA_DIR)
        if data_dir is None:
            return cached_federation(path, overrides, root)
        num_clients = cached_run(path, overrides, root).datamodule.num_clients or 0
        pid, _ = partition_of(context, num_clients, path)
        classes, normalize = node_reading(context)
        try:
            return cached_node_federation(path, str(data_dir), pid, overrides, root, classes, normalize)
        except ConfigError as err:
            raise ConfigError(f"node {PARTITION_ID}={pid}: {err}") from None

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        path = config_path(context)
        own = DATA_DIR in context.node_config
        if own:  # the node's files are read at its first train or evaluate message, not here
            num_clients = cached_run(path, overrides, root).datamodule.num_clients or 0
        else:
            num_clients = cached_federation(path, overrides, root).num_clients
        return node_answer(*partition_of(context, num_clients, path), msg, own_data=own)

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
        cid = work.clients[0]
        sent = work.message(cid).get("weights", {})
        load_tensors(work.model, sent)  # the node's copy of the global model: the server's weights
        # what Sequential.evaluate does for each client, with one metrics object the node keeps (a fresh
        # TaskMetrics per message costs milliseconds)
        metrics = fed.scratch_metrics()
        weights = {k: v for k, v in work.model.state_dict().items() if v.is_floating_point()}
        work.evaluate_client(work.worker(), weights, cid, metrics)
        values = {k: float(v) for k, v in metrics.compute().items()}
        content = RecordDict(
            {
                EVAL_STATE: tensors_to_record(metrics.state_tensors()),
                EVAL_METRICS: MetricRecord(values),
                CONFIG: ConfigRecord({"client-id": work.clients[0]}),
            }
        )
        return Message(content, reply_to=msg)

    return app


def _checked_client(msg: Message, context: Context, fed: Federation) -> int:
    """The client id the message is for, checked to be one this node hosts."""
    pid, parts = partition_of(context, fed.num_clients, fed.path)
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
