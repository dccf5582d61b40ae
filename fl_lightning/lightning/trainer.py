"""The round-as-step Trainer: :func:`federated_trainer`, for the command line, Flower and Python alike.

A :class:`~fl_lightning.lightning.module.FederatedModule` runs one federated round per training step.
:func:`federated_trainer` builds the Trainer ``fit`` runs (a :class:`FederatedTrainer`)::

    trainer = federated_trainer(max_steps=40, callbacks=[ModelCheckpoint(monitor="global/acc", mode="max")])
    trainer.fit(FederatedModule(...), datamodule=FederatedDataModule(...))

A plain ``lightning.Trainer`` with its epoch defaults would validate once, after the last round, and write
neither ``last.ckpt`` nor the summary: the module refuses it with one line naming
:func:`federated_trainer` (see :func:`~fl_lightning.lightning.module.check_trainer_options`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, ProgressBar
from lightning.pytorch.loggers import Logger, TensorBoardLogger

from fl_lightning.callbacks import FederatedProgressBar, FederatedSummary
from fl_lightning.errors import ConfigError, check_number
from fl_lightning.lightning.checkpoint import AtomicCheckpointIO, LastRoundCheckpoint
from fl_lightning.lightning.console import printing
from fl_lightning.lightning.loggers import (
    claim_version_on_first_use,
    continue_run,
    folder_label,
    resumed_run,
    run_label,
)

log = logging.getLogger("fl_lightning")

#: The Trainer arguments that make one training step one round: validate the global model after every
#: round (``global/*``, what ``ModelCheckpoint``/``EarlyStopping`` monitor), log every round, no sanity
#: validation before round 1 and no model summary (the server module holds only the global model).
ROUND_DEFAULTS: dict[str, Any] = {
    "val_check_interval": 1,
    "check_val_every_n_epoch": None,
    "log_every_n_steps": 1,
    "num_sanity_val_steps": 0,
    "enable_model_summary": False,
}

#: Rounds when none are given (``trainer.max_steps`` of the command line).
DEFAULT_ROUNDS = 40


class FederatedTrainer(Trainer):
    """A Lightning ``Trainer`` whose unit of progress is a round (built by :func:`federated_trainer`).

    On top of Lightning's: ``fit(..., ckpt_path=<run>/checkpoints/last.ckpt)`` continues in that run
    folder, as the command line does (one TensorBoard run whose steps go on from the checkpoint's rounds),
    when the checkpoint is the run's newest state and the logger's folder is the run's parent and not
    chosen yet; and ``fit``/``validate``/``test``/``predict`` print the progress lines and the summary on
    stdout, leaving out Lightning's notices that do not apply to federated rounds (as ``with console():``
    does), unless the ``fl_lightning`` logger or the root logger (at ``INFO`` or below) has a handler of its
    own.
    """

    def fit(self, model: Any, *args: Any, ckpt_path: Any = None, **kwargs: Any) -> None:
        with printing(), self._continued(ckpt_path):
            super().fit(model, *args, ckpt_path=ckpt_path, **kwargs)

    def validate(self, *args: Any, **kwargs: Any) -> Any:
        with printing():
            return super().validate(*args, **kwargs)

    def test(self, *args: Any, **kwargs: Any) -> Any:
        with printing():
            return super().test(*args, **kwargs)

    def predict(self, *args: Any, **kwargs: Any) -> Any:
        with printing():
            return super().predict(*args, **kwargs)

    @contextlib.contextmanager
    def _continued(self, ckpt_path: Any) -> Iterator[None]:
        """Point the loggers at the checkpoint's run folder when ``fit`` continues that run."""
        resume = resumed_run(ckpt_path)
        with warnings.catch_warnings():
            if resume is not None:
                run, rounds = resume
                if any([continue_run(lg, run, rounds) for lg in self.loggers]):
                    # ModelCheckpoint's "directory exists and is not empty" is expected in one's own folder
                    warnings.filterwarnings(
                        "ignore", message=r"Checkpoint directory .* exists and is not empty"
                    )
            yield


def federated_trainer(
    max_steps: int = DEFAULT_ROUNDS,
    *,
    callbacks: Callback | Iterable[Callback] | None = None,
    logger: Logger | Iterable[Logger] | bool | None = None,
    plugins: Any = None,
    default_root_dir: str | os.PathLike | None = None,
    name: str | None = "auto",
    **trainer_kwargs: Any,
) -> FederatedTrainer:
    """A Lightning ``Trainer`` whose unit of progress is a federated round.

    ``max_steps`` is the number of rounds. On top of the arguments given (any ``Trainer`` argument, e.g.
    ``accelerator``, ``precision``, ``enable_progress_bar``), it sets:

    - :data:`ROUND_DEFAULTS` (validation after every round, ...), where not given;
    - the callbacks: :class:`~fl_lightning.callbacks.FederatedProgressBar` (unless a progress bar is given
      or ``enable_progress_bar=False``), :class:`~fl_lightning.lightning.checkpoint.LastRoundCheckpoint`
      (``checkpoints/last.ckpt`` after every round, unless ``enable_checkpointing=False``; a
      ``ModelCheckpoint(save_last=...)`` given leaves ``last.ckpt`` to it), and
      :class:`~fl_lightning.callbacks.FederatedSummary` (``summary.json``, the printed summary, the HPARAMS
      tab from the module's and data module's arguments; unless one is given). A ``ModelCheckpoint`` given
      without a ``filename`` names its files by round (:func:`name_checkpoints_by_round`);
    - the plugin :class:`~fl_lightning.lightning.checkpoint.AtomicCheckpointIO` (checkpoints written
      atomically, loaded with ``weights_only=True``), unless a ``CheckpointIO`` is given;
    - the run folder: without a logger (``None`` or ``True``), TensorBoard in
      ``<default_root_dir>/lightning_logs/version_N-<label>`` (``name``); that folder, and that of any
      TensorBoard/CSV logger given without a version, is created atomically when the run first logs, so runs
      started together in one folder get their own; a ``fit`` resumed from a run's ``last.ckpt`` continues
      in that run's folder, labelled or not (:class:`FederatedTrainer`).

    Args:
        max_steps: Rounds to run (``trainer.max_steps``); a run resumed with ``ckpt_path`` goes on up to it.
        callbacks: The Trainer's callbacks, as for ``Trainer``.
        logger: As for ``Trainer`` (``False``: no logs, no run folder).
        plugins: As for ``Trainer``.
        default_root_dir: Where ``lightning_logs/`` goes (default: the working folder).
        name: A label of the run folder, ``version_N-<name>`` (TensorBoard's run name too); ``"auto"`` (the
            default, as on the command line): the strategy, partition, client transform and system model of
            the module and data the Trainer holds when the run first logs
            (``version_3-fedbuff-dirichlet-devices``, :func:`~fl_lightning.lightning.loggers.run_label`;
            a bare ``version_N`` if it holds none yet, e.g. ``trainer.log_dir`` read before ``fit``); None,
            ``""`` or ``"none"``: a bare ``version_N``.
        **trainer_kwargs: Any other ``Trainer`` argument.

    Raises:
        ConfigError: ``val_check_interval`` not above 0, or a log folder that cannot be written.
    """
    return round_trainer(
        max_steps,
        callbacks=callbacks,
        logger=logger,
        plugins=plugins,
        default_root_dir=default_root_dir,
        name=name,
        **trainer_kwargs,
    )


def round_trainer(
    max_steps: int = DEFAULT_ROUNDS,
    *,
    callbacks: Callback | Iterable[Callback] | None = None,
    logger: Logger | Iterable[Logger] | bool | None = None,
    plugins: Any = None,
    default_root_dir: str | os.PathLike | None = None,
    name: str | None = "auto",
    hparams: Mapping[str, Any] | None = None,
    on_new_run_folder: Callable[[Path], None] | None = None,
    **trainer_kwargs: Any,
) -> FederatedTrainer:
    """:func:`federated_trainer` with what the command line adds (see there for the other arguments).

    Args:
        hparams: The run's hyperparameters, flat ``{"model.strategy": "FedProx", ...}``, for the summary's
            HPARAMS row (the command line passes its config); None: the module's and data module's.
        on_new_run_folder: Called with each run folder created for the run (the command line removes it when
            the run is refused before its first round).
    """
    args = {**ROUND_DEFAULTS, **trainer_kwargs}
    name = folder_label(name)
    interval = args.get("val_check_interval")
    if interval is not None:  # Lightning takes 0, then divides by it in the first round
        check_number(
            interval, "trainer.val_check_interval", low=0, low_open=True, hint="1 evaluates after every round"
        )
    given = _as_list(callbacks)
    added: list[Callback] = []
    if args.get("enable_progress_bar") is not False and not any(isinstance(c, ProgressBar) for c in given):
        added.append(FederatedProgressBar())
    if args.get("enable_checkpointing") is not False:
        added += last_round_checkpoint(given)
    name_checkpoints_by_round(given)
    summaries = [c for c in given if isinstance(c, FederatedSummary)]
    for summary in summaries:
        if summary.hparams is None and hparams is not None:
            summary.hparams = dict(hparams)
    if not summaries:
        added.append(FederatedSummary(hparams=hparams))
    given_plugins = _as_list(plugins)
    if not any(isinstance(p, CheckpointIO) for p in given_plugins):
        given_plugins.append(AtomicCheckpointIO())
    if logger in (None, True):
        root = Path(default_root_dir or os.getcwd())
        check_writable(root, "trainer.default_root_dir")
        logger = TensorBoardLogger(save_dir=str(root), name="lightning_logs", version=None)
    built: list[Trainer] = []

    def label() -> str | None:
        """The run folder's label (``"auto"``: known once the Trainer holds the module and its data)."""
        if name != "auto":
            return name
        trainer = built[0] if built else None
        module = trainer.lightning_module if trainer is not None else None
        return run_label(module, trainer.datamodule) if module is not None else None

    for lg in _as_list(logger) if logger is not False else []:
        claim_version_on_first_use(lg, on_new_run_folder, label)
    with printing():  # Lightning's device lines and tips, left out as in a command
        trainer = FederatedTrainer(
            max_steps=max_steps,
            callbacks=[*given, *added],
            logger=logger,
            plugins=given_plugins,
            default_root_dir=default_root_dir,
            **args,
        )
    built.append(trainer)
    check_writable(trainer.default_root_dir, "trainer.default_root_dir")
    for lg in trainer.loggers:
        if lg.save_dir is not None:
            check_writable(lg.save_dir, "trainer.logger.init_args.save_dir")
    return trainer


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def name_checkpoints_by_round(callbacks: Iterable[Callback]) -> None:
    """``ModelCheckpoint`` files named ``round=<rounds done>.ckpt`` where no ``filename`` was given.

    Lightning's default, ``{epoch}-{step}``, reads ``epoch=0-step=12.ckpt`` in a federated run (one
    epoch holds every round; the step is the round count). A given ``filename`` is kept as it is.
    """
    for cb in callbacks:
        if (
            isinstance(cb, ModelCheckpoint)
            and not isinstance(cb, LastRoundCheckpoint)
            and cb.filename is None
        ):
            cb.filename = "round={step}"
            cb.auto_insert_metric_name = False


def last_round_checkpoint(given: list[Callback]) -> list[Callback]:
    """A :class:`LastRoundCheckpoint` unless one is given; it takes ``last.ckpt`` over from the others."""
    if any(isinstance(c, LastRoundCheckpoint) for c in given):
        return []
    dirpath = None
    for cb in given:
        if isinstance(cb, ModelCheckpoint) and cb.save_last:
            log.warning(
                "trainer.callbacks: ModelCheckpoint(save_last=%s) would rewrite last.ckpt only in rounds "
                "that improve its monitor; fl_lightning writes it after every round instead (drop save_last)",
                cb.save_last,
            )
            cb.save_last = None
            dirpath = dirpath or cb.dirpath
    return [LastRoundCheckpoint(dirpath=dirpath)]


def check_writable(path: str | os.PathLike, field: str) -> None:
    """Raise a one-line :class:`ConfigError` unless ``path`` (a local folder) can be created and written."""
    path = os.fspath(path)
    if "://" in path:  # a remote file system: its own client reports problems
        return
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"{field}={path} is a file, not a folder; choose a writable folder")
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as err:
        raise ConfigError(
            f"{field}={path}: cannot write there ({err.strerror or err}); choose a writable folder"
        ) from None
