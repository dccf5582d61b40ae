"""An fl_lightning run built from its YAML config, for the Flower apps.

Both apps read the config a user gives ``python -m fl_lightning fit --config``, through the same parser
(:class:`~fl_lightning.cli.FederatedCLI`, so the same seed gives the same initial model and the same
partition), without building a Trainer: the server side uses the global model, the strategy, the
round loop's settings (sampling, local steps) and the number of rounds (``trainer.max_steps``); a
client uses the client module, the strategy's client hooks and its own partition of the data.
"""

from __future__ import annotations

import contextlib
import copy
import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fl_lightning.cli import FederatedCLI
from fl_lightning.core.client import ClientModule
from fl_lightning.core.metrics import TaskMetrics
from fl_lightning.core.module import FederatedModule
from fl_lightning.data.federated import FederatedDataModule
from fl_lightning.errors import ConfigError

_SMALL_MODEL = 1_000_000  # parameters; as FederatedModule.setup: one intra-op thread below this on CPU


class _ConfigOnlyCLI(FederatedCLI):
    """The CLI's parsing and instantiation of model and data, without a Trainer."""

    def instantiate_trainer(self, **kwargs: Any) -> None:
        return None


@dataclass
class Federation:
    """The pieces of an fl_lightning run that a Flower app uses.

    Attributes:
        path: The YAML config it was built from.
        module: The server module (global model ``module.client``, ``module.strategy``, ``module.loop``).
        data: The federated data, set up (every client's partition, the global test set).
        num_rounds: ``trainer.max_steps`` of the config (the number of rounds).
        device: Where clients train and the server aggregates.
    """

    path: Path
    module: FederatedModule
    data: FederatedDataModule
    num_rounds: int
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

    def metrics(self) -> TaskMetrics:
        """Fresh evaluation metrics for the data's task."""
        return TaskMetrics.for_task(self.data.task, self.data.num_classes)


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


def load_federation(
    config: str | Path, overrides: Sequence[str] = (), root: str | Path | None = None
) -> Federation:
    """Build the run of ``config`` (plus command-line style ``overrides``, e.g. ``--trainer.max_steps=3``).

    Seeds the process's global RNGs with the config's ``seed_everything`` first, as ``fit`` does, so
    the initial global model equals that of ``python -m fl_lightning fit --config <config>``.

    Raises:
        ConfigError: One line, for a missing file or a bad value (the CLI's own message).
    """
    path = resolve_config(config, root)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            cli = _ConfigOnlyCLI(args=["--config", str(path), *overrides], run=False)
    except SystemExit:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        text = lines[-1].removeprefix("error: ") if lines else "cannot be parsed"
        raise ConfigError(f"{path}: {text}") from None
    module, data = cli.model, cli.datamodule
    accelerator = str(cli.config.get("trainer.accelerator", "auto"))
    gpu = torch.cuda.is_available() and accelerator in ("auto", "gpu", "cuda")
    device = torch.device("cuda" if gpu else "cpu")
    data.setup("fit")
    module._check_model(data)  # the config errors `fit` gives for a model that does not fit the data
    module.loop.config.batch_size = data.batch_size
    module.loop.sample(data.num_clients, 0)  # validates clients_per_round against the federation
    module.strategy.setup(module.client, data.num_clients)
    module.client.to(device)
    module.strategy.to(device)
    threads = module.threads_per_process
    if (
        threads is None
        and device.type == "cpu"
        and sum(p.numel() for p in module.client.parameters()) < _SMALL_MODEL
    ):
        threads = 1
    if threads is not None:
        torch.set_num_threads(threads)
    rounds = int(cli.config.get("trainer.max_steps") or 0)
    return Federation(path, module, data, rounds if rounds > 0 else 40, device)


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
