"""An fl_lightning run built from its YAML config, for the Flower apps.

Both apps read the config a user gives ``python -m fl_lightning fit --config``, through the same parser
and builder as ``fit`` (:func:`fl_lightning.config.build_run`, so the same seed gives the same initial model
and the same partition). The ServerApp builds the whole run, Trainer included (:func:`load_run`: the
round-as-step Trainer of :func:`~fl_lightning.lightning.trainer.federated_trainer`), and fits it with the
clients' work sent to the SuperNodes; a ClientApp builds the model, the strategy and the data without a
Trainer (:func:`load_federation`) and trains its own partition.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from fl_lightning.api.client import ClientModule
from fl_lightning.config import RunBuilder, build_run
from fl_lightning.data.federated import FederatedDataModule
from fl_lightning.engine.local import cpu_threads
from fl_lightning.errors import ConfigError
from fl_lightning.lightning.module import FederatedModule


@dataclass
class Federation:
    """The pieces of an fl_lightning run that a Flower ClientApp uses.

    Attributes:
        path: The YAML config it was built from.
        module: The server module (global model ``module.client``, ``module.strategy``, ``module.engine``,
            set up with the data's clients).
        data: The federated data, set up (every client's partition, the global test set).
        device: Where clients train.
    """

    path: Path
    module: FederatedModule
    data: FederatedDataModule
    device: torch.device
    _worker: ClientModule | None = field(default=None, repr=False)

    @property
    def num_clients(self) -> int:
        return self.data.num_clients

    @property
    def worker(self) -> ClientModule:
        """The client module every client of this process trains in turn (a copy of the initial model)."""
        if self._worker is None:
            self._worker = copy.deepcopy(self.module.client).to(self.device)
        return self._worker


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


def load_federation(
    config: str | Path, overrides: Sequence[str] = (), root: str | Path | None = None
) -> Federation:
    """Build a client's view of the run of ``config`` (plus command-line style ``overrides``).

    Seeds the process's global RNGs with the config's ``seed_everything`` first, as ``fit`` does, so
    the initial global model equals that of ``python -m fl_lightning fit --config <config>``, and sets the
    engine up on the data's clients (its checks run here too).

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
    module.connect_data(data)  # as fit's setup: the same checks, one-line errors
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
