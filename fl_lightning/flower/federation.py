"""An fl_lightning run built from its YAML config, for the Flower apps.

Both apps read the config a user gives ``python -m fl_lightning fit --config``, through the same parser
and builder as ``fit`` (:func:`fl_lightning.config.build_run`, so the same seed gives the same initial model
and the same partition). The ServerApp builds the whole run, Trainer included (:func:`load_run`: the
round-as-step Trainer of :func:`~fl_lightning.lightning.trainer.federated_trainer`), and fits it with the
clients' work sent to the SuperNodes; a ClientApp builds the model, the strategy and the data without a
Trainer (:func:`load_federation`) and trains its own partition.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Trainer

from fl_lightning.config import RunBuilder, build_run
from fl_lightning.data.federated import FederatedDataModule
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
        data: The federated data, set up (every client's partition, the global test set).
        device: Where clients train.
    """

    path: Path
    module: FederatedModule
    data: FederatedDataModule
    device: torch.device

    @property
    def num_clients(self) -> int:
        return self.data.num_clients

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
    module, data = run.model, run.datamodule
    accelerator = str(run.config.get("trainer.accelerator", "auto"))
    gpu = torch.cuda.is_available() and accelerator in ("auto", "gpu", "cuda")
    device = torch.device("cuda" if gpu else "cpu")
    data.setup("fit")
    module.use_executor(Sequential())  # a node trains its own clients, one at a time
    precision = node_precision(run.config.get("trainer.precision"), device)
    module.connect_data(data, precision)  # as fit's setup: the same checks, one-line errors
    module.client.to(device)
    module.strategy.to(device)
    if device.type == "cpu":
        threads = cpu_threads(module.client, module.threads_per_process, processes=1)
        if threads is not None:
            torch.set_num_threads(threads)
    return Federation(path, module, data, device)


_CACHE: dict[tuple[str, tuple[str, ...]], Federation] = {}


def cached_federation(
    config: str | Path, overrides: Sequence[str] = (), root: str | Path | None = None
) -> Federation:
    """:func:`load_federation`, built once per process for each (config, overrides).

    A Flower simulation runs many virtual nodes in a few worker processes: they share the model, data
    and worker of their process; each node's own state lives in its ``context.state``.
    """
    key = (str(resolve_config(config, root).resolve()), tuple(overrides))
    if key not in _CACHE:
        _CACHE[key] = load_federation(config, overrides, root)
    return _CACHE[key]
