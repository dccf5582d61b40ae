"""An fl_lightning run built from its YAML config, for the Flower apps.

Both apps read the config a user gives ``python -m fl_lightning fit --config``, through the same parser
and builder as ``fit`` (:func:`fl_lightning.config.build_run`, so the same seed gives the same initial model
and the same partition). The ServerApp builds the whole run, Trainer included (:func:`load_run`: the
round-as-step Trainer of :func:`~fl_lightning.lightning.trainer.federated_trainer`), and fits it with the
clients' work sent to the SuperNodes; a ClientApp builds the model, the strategy and the data without a
Trainer (:func:`load_federation`) and trains its own partition, or, on a node that brings its own data
(``data-dir``), the same model and strategy on that node's files (:func:`load_node_federation`).
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch import Trainer

from fl_lightning.config import RunBuilder, build_run
from fl_lightning.data.datasets import DatasetSplits
from fl_lightning.data.federated import ClientData, FederatedDataModule
from fl_lightning.data.local_files import NodeFiles, read_node_files
from fl_lightning.engine.executors import Sequential
from fl_lightning.engine.local import cpu_threads
from fl_lightning.engine.work import Executor
from fl_lightning.errors import ConfigError
from fl_lightning.lightning.module import FederatedModule


@dataclass
class Federation:
    """The pieces of an fl_lightning run that a Flower ClientApp uses.

    Attributes:
        path: The YAML config it was built from.
        module: The server module (global model ``module.client``, ``module.strategy``, ``module.engine``,
            set up with the data's clients, the node's precision plugin and a one-client-at-a-time
            executor: the ClientApp runs the engine's client path).
        data: The federated data, set up (every client's partition, the global test set; on a node with
            its own data, that node's files as the data of its client).
        device: Where clients train.
        files: The node's own files (None: the config's dataset, partitioned).
    """

    path: Path
    module: FederatedModule
    data: FederatedDataModule
    device: torch.device
    files: NodeFiles | None = None
    _metrics: Any = None

    @property
    def num_clients(self) -> int:
        return self.data.num_clients

    def scratch_metrics(self) -> Any:
        """One set of the run's evaluation metrics, reset (made once: a node evaluates one client at a
        time)."""
        if self._metrics is None:
            self._metrics = self.module.engine.metrics()
        self._metrics.reset()
        return self._metrics

    @property
    def executor(self) -> Executor:
        """The engine's executor, which runs the node's clients one at a time."""
        assert self.module.engine.executor is not None
        return self.module.engine.executor


def resolve_config(config: str | Path, root: str | Path | None = None) -> Path:
    """``config`` (relative to ``root`` if given and ``config`` is relative), checked to be a file."""
    path = Path(config).expanduser()
    if root is not None and not path.is_absolute():
        path = Path(root) / path
    if not path.is_file():
        raise ConfigError(
            f"flower: config {str(path)!r} is not a file; pass the YAML that `python -m fl_lightning fit "
            '--config` takes (in a Flower app: [tool.flwr.app.config] config = "<path in the app folder>")'
        )
    return path


def _build(path: Path, overrides: Sequence[str], trainer: bool = True) -> RunBuilder:
    """The run of ``path`` + ``overrides``; a bad value is ``fit``'s one line, after the file's name."""
    try:
        return build_run(["--config", str(path), *overrides], trainer=trainer)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


def load_run(config: str | Path, overrides: Sequence[str] = (), root: str | Path | None = None) -> RunBuilder:
    """The whole run of ``config`` (plus ``overrides``) as ``fit`` builds it: ``run.trainer``, ``run.model``,
    ``run.datamodule`` (the global RNGs seeded with ``seed_everything`` first, as ``fit`` does).

    Raises:
        ConfigError: One line, for a missing file or a bad value (``fit``'s own message).
    """
    return _build(resolve_config(config, root), overrides)


def node_precision(precision: Any, device: torch.device) -> Any:
    """The Lightning precision plugin of ``trainer.precision`` on ``device``, as ``fit`` builds it there.

    Lightning's own choice (a one-device Trainer is made for it and dropped, its info lines muted), so a
    node trains and evaluates its clients as ``fit`` would on its device.

    Raises:
        ConfigError: One line, for a precision that cannot apply on this node.
    """
    quiet = logging.getLogger("lightning.pytorch")
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        trainer = Trainer(
            accelerator="gpu" if device.type == "cuda" else "cpu",
            devices=1,
            precision=precision,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
    except Exception as err:  # e.g. a plugin whose package the node lacks
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ConfigError(
            f"flower: trainer.precision={precision!r} cannot apply on this node ({first})"
        ) from None
    finally:
        quiet.setLevel(level)
    return trainer.precision_plugin


def load_federation(
    config: str | Path, overrides: Sequence[str] = (), root: str | Path | None = None
) -> Federation:
    """Build a client's view of the run of ``config`` (plus command-line style ``overrides``).

    Seeds the process's global RNGs with the config's ``seed_everything`` first, as ``fit`` does, so
    the initial global model equals that of ``python -m fl_lightning fit --config <config>``, and sets the
    engine up on the data's clients with the config's ``trainer.precision`` (:func:`node_precision`) and
    a :class:`~fl_lightning.engine.executors.Sequential` executor (its checks run here too).

    Raises:
        ConfigError: One line, for a missing file or a bad value (``fit``'s own message).
    """
    path = resolve_config(config, root)
    run = _build(path, overrides, trainer=False)
    run.datamodule.setup("fit")
    return _federation(path, run)


def load_node_federation(
    config: str | Path,
    data_dir: str | Path,
    client_id: int,
    overrides: Sequence[str] = (),
    root: str | Path | None = None,
    classes: Sequence[str] | None = None,
    normalize: tuple[float, float] | None = None,
    run: RunBuilder | None = None,
) -> Federation:
    """The view of a node that brings its own data: the run of ``config`` (model, strategy, local
    settings, seed), with the files of ``data_dir`` as client ``client_id``'s data
    (:func:`~fl_lightning.data.local_files.read_node_files`; the config's dataset is not read).

    The node's local test split is its test files, or ``data.local_test_fraction`` of its samples drawn with
    ``(data.seed, client_id)``; its batch sizes are the config's. The number of classes is that of the
    model's output (the same on every node); a label outside it is an error.

    Args:
        run: The config's run without a Trainer, built already (:func:`cached_run`); None: built here.

    Raises:
        ConfigError: One line: the data folder (missing, unreadable, no known layout, labels the model
            cannot take), or the config.
    """
    path = resolve_config(config, root)
    files = read_node_files(data_dir, classes, normalize)
    run = run if run is not None else _build(path, overrides, trainer=False)
    use_node_files(run.datamodule, files, client_id, run.model)
    return _federation(path, run, files)


def use_node_files(
    dm: FederatedDataModule, files: NodeFiles, client_id: int, module: FederatedModule
) -> None:
    """Make ``dm`` (built from the config, not set up) hold ``files`` as client ``client_id``'s data.

    Every client id gets the node's samples (a node trains only its own client; the others' entries only
    give the engine the federation's size), the task is the model's and the classes its outputs.

    Raises:
        ConfigError: One line naming the data folder and the fix.
    """
    where = f"data-dir {str(files.folder)!r}"
    if dm.client_transform is not None:
        raise ConfigError(
            f"{where}: data.client_transform simulates how clients' samples differ; a node with its own "
            "data (data-dir) has its real samples: remove data.client_transform from the config"
        )
    if dm.num_clients is None:
        raise ConfigError(f"{where}: set data.num_clients to the number of nodes (each node is one client)")
    net = module.client
    sample = files.x[:1]
    try:
        with torch.no_grad():
            was = net.training
            out = net.eval()(sample)
            net.train(was)
    except RuntimeError as err:
        line = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ConfigError(
            f"{where}: model.client.net cannot take its inputs of shape {tuple(sample.shape[1:])} ({line}); "
            "store inputs of the shape the model takes"
        ) from None
    num_classes = int(out.shape[-1])
    task = str(getattr(net, "task", "multiclass"))
    for y, name in ((files.y, "y"), (files.test_y, "y_test")):
        if y is None or not len(y):
            continue
        if task == "multilabel" and (y.dim() != 2 or y.shape[1] != num_classes):
            raise ConfigError(
                f"{where}: the model is multilabel with {num_classes} labels but {name} has shape "
                f"{list(y.shape)}; store [N, {num_classes}] 0/1 targets"
            )
        if task != "multilabel" and (y.dim() != 1 or int(y.min()) < 0 or int(y.max()) >= num_classes):
            bad = (
                list(y.shape)
                if y.dim() != 1
                else int(y.max())
                if int(y.max()) >= num_classes
                else int(y.min())
            )
            raise ConfigError(
                f"{where}: label {bad} of {name} is outside the model's {num_classes} classes 0.."
                f"{num_classes - 1}; label the samples 0..{num_classes - 1} (as on every node)"
            )
    test_x = files.test_x if files.test_x is not None else files.x[:0]
    test_y = files.test_y if files.test_y is not None else files.y[:0]
    dm.splits = DatasetSplits(
        name=f"data-dir:{files.folder}",
        task=task,
        num_classes=num_classes,
        train_x=files.x,
        train_y=files.y,
        test_x=test_x,
        test_y=test_y,
    )
    train_idx, test_idx = files.split(dm.local_test_fraction, (dm.seed, client_id))
    own_test = {"test_x": files.test_x, "test_y": files.test_y} if files.test_x is not None else {}
    dm.clients = [
        ClientData(c, files.x, files.y, train_idx, test_idx, **own_test) for c in range(dm.num_clients)
    ]
    dm.counts = None


def _federation(path: Path, run: RunBuilder, files: NodeFiles | None = None) -> Federation:
    """The federation of a built ``run`` whose data module is set up: the engine on the node's device."""
    module, data = run.model, run.datamodule
    accelerator = str(run.config.get("trainer.accelerator", "auto"))
    gpu = torch.cuda.is_available() and accelerator in ("auto", "gpu", "cuda")
    device = torch.device("cuda" if gpu else "cpu")
    module.use_executor(Sequential())  # a node trains its own clients, one at a time
    precision = node_precision(run.config.get("trainer.precision"), device)
    module.connect_data(data, precision)  # as fit's setup: the same checks, one-line errors
    module.client.to(device)
    module.strategy.to(device)
    if device.type == "cpu":
        threads = cpu_threads(module.client, module.runtime.threads_per_process, processes=1)
        if threads is not None:
            torch.set_num_threads(threads)
    return Federation(path, module, data, device, files)


#: How many runs and federations a process keeps (a ClientApp process kept running serves run after run).
CACHE_SIZE = 4
_CACHE: OrderedDict[tuple, Any] = OrderedDict()


def _cached(key: tuple, build: Callable[[], Any]) -> Any:
    """``build()``, kept under ``key`` (the least recently used of more than :data:`CACHE_SIZE` dropped);
    a build that raises is not kept."""
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    value = build()
    _CACHE[key] = value
    while len(_CACHE) > CACHE_SIZE:
        _CACHE.popitem(last=False)
    return value


def config_key(config: str | Path, overrides: Sequence[str] = (), root: str | Path | None = None) -> tuple:
    """What a run depends on: the config file (its path and content) and the overrides."""
    path = resolve_config(config, root)
    return (str(path.resolve()), hashlib.sha256(path.read_bytes()).hexdigest(), tuple(overrides))


def cached_federation(
    config: str | Path, overrides: Sequence[str] = (), root: str | Path | None = None
) -> Federation:
    """:func:`load_federation`, built once per process for each (config file and content, overrides).

    A Flower simulation runs many virtual nodes in a few worker processes: they share the model, data
    and worker of their process; each node's own state lives in its ``context.state``. A ClientApp process
    kept running (``python -m fl_lightning.flower clientapp``) reuses it from message to message.
    """
    key = ("federation", *config_key(config, overrides, root))
    return _cached(key, lambda: load_federation(config, overrides, root))


def cached_run(
    config: str | Path, overrides: Sequence[str] = (), root: str | Path | None = None
) -> RunBuilder:
    """The config's run without a Trainer and with its data module not set up (the config's dataset not
    read), built once per process for each (config file and content, overrides)."""
    key = ("run", *config_key(config, overrides, root))
    return _cached(key, lambda: _build(resolve_config(config, root), overrides, trainer=False))


def cached_node_federation(
    config: str | Path,
    data_dir: str | Path,
    client_id: int,
    overrides: Sequence[str] = (),
    root: str | Path | None = None,
    classes: Sequence[str] | None = None,
    normalize: tuple[float, float] | None = None,
) -> Federation:
    """:func:`load_node_federation`, built once per process for each (config, data folder and its
    modification time, client id, classes, normalisation); a folder that failed to read is read again at
    the next message, so a node whose files were fixed joins the next round."""
    folder = Path(data_dir).expanduser()
    stamp = folder.stat().st_mtime_ns if folder.is_dir() else None
    key = (
        "node",
        *config_key(config, overrides, root),
        str(folder.resolve()),
        stamp,
        client_id,
        tuple(classes or ()),
        normalize,
    )

    def build() -> Federation:
        run = _build(resolve_config(config, root), overrides, trainer=False)
        return load_node_federation(config, data_dir, client_id, overrides, root, classes, normalize, run)

    return _cached(key, build)


def export_node_data(config: str | Path, out: str | Path, overrides: Sequence[str] = ()) -> list[Path]:
    """Write each client's data of the config's split as the files of a node that brings its own data:
    ``<out>/client-<id>/data.npz`` with ``x``, ``y`` (its training samples, in the split's order) and
    ``x_test``, ``y_test`` (its local test split). A federation of nodes reading them (``data-dir``) trains
    as ``fit`` does on the config (without a client transform, which is not exported).

    Raises:
        ConfigError: One line for a bad config, or a client transform (not exportable as files).
    """
    fed = load_federation(config, overrides)
    if fed.data.client_transform is not None:
        raise ConfigError("node-data: the config has a data.client_transform; export the data without it")
    written = []
    for c in fed.data.clients:
        test_x = c.x if c.test_x is None else c.test_x
        test_y = c.y if c.test_y is None else c.test_y
        folder = Path(out) / f"client-{c.client_id}"
        folder.mkdir(parents=True, exist_ok=True)
        np.savez(
            folder / "data.npz",
            x=c.x[c.train_idx].cpu().numpy(),
            y=c.y[c.train_idx].cpu().numpy(),
            x_test=test_x[c.test_idx].cpu().numpy(),
            y_test=test_y[c.test_idx].cpu().numpy(),
        )
        written.append(folder / "data.npz")
    return written
