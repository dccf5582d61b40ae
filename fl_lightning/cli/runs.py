"""Run folders and ``--ckpt_path``: which folder a command writes to and which config it reads.

- ``fit --ckpt_path <run>/checkpoints/last.ckpt`` continues in ``<run>`` when the checkpoint is the run's
  newest state (:func:`resumed_run`, :func:`resume_logger`); an older checkpoint of a run that went further
  starts a new ``version_N`` (the run's later rounds stay).
- ``validate``/``test``/``predict --ckpt_path <run>/checkpoints/X.ckpt`` read ``<run>/config.yaml``
  (:func:`run_config`) and log into ``<run>/<subcommand>/`` (:func:`evaluation_logger`).
- A run refused before its first round leaves no trace (:func:`remove_new_files`).
"""

from __future__ import annotations

import logging
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import TensorBoardLogger

from fl_lightning.errors import ConfigError
from fl_lightning.lightning.checkpoint import load_checkpoint_file
from fl_lightning.lightning.loggers import (
    SPECIAL_CKPT_PATHS,
    RoundStepLogger,
    checkpoint_rounds,
    local_checkpoint,
    resumed_run,
)

__all__ = [
    "SPECIAL_CKPT_PATHS",
    "checkpoint_rounds",
    "evaluation_logger",
    "files_of",
    "local_checkpoint",
    "remove_new_files",
    "resume_logger",
    "resumed_run",
    "run_config",
    "writing_run_config",
]

log = logging.getLogger("fl_lightning")

#: The subcommands that evaluate a checkpoint; without ``--config`` they read its run's ``config.yaml``.
EVALUATION = ("validate", "test", "predict")


def run_config(argv: list[str]) -> Path | None:
    """``<run>/config.yaml`` for ``validate``/``test``/``predict --ckpt_path <run>/checkpoints/X.ckpt``.

    None for another subcommand, a command line with ``--config``, or a checkpoint outside a run folder.
    """
    if not argv or argv[0] not in EVALUATION:
        return None
    if any(a in ("-c", "--config") or str(a).startswith("--config=") for a in argv):
        return None
    ckpt = None
    for i, arg in enumerate(argv):
        if arg == "--ckpt_path" and i + 1 < len(argv):
            ckpt = argv[i + 1]
        elif str(arg).startswith("--ckpt_path="):
            ckpt = str(arg).split("=", 1)[1]
    if not local_checkpoint(ckpt):
        return None
    path = Path(ckpt)
    config = path.parent.parent / "config.yaml"
    return config if path.parent.name == "checkpoints" and config.is_file() else None


def writing_run_config(ckpt: Any) -> Path | None:
    """The ``config.yaml`` of the run that wrote ``ckpt``, or None if it does not exist (any more).

    It is beside the checkpoint's ``checkpoints/`` folder, or, for a copied checkpoint, beside the folder
    its checkpoint callbacks wrote to (their state records it).
    """
    if not local_checkpoint(ckpt):
        return None
    path = Path(ckpt)
    folders = [path.parent] if path.parent.name == "checkpoints" else []
    try:
        checkpoint = load_checkpoint_file(path, "cpu", mmap=True)
        states = checkpoint.get("callbacks") or {}
        folders += [Path(s["dirpath"]) for s in states.values() if isinstance(s, dict) and s.get("dirpath")]
    except (ConfigError, OSError):
        pass
    for folder in folders:
        config = folder.parent / "config.yaml"
        if config.is_file():
            return config
    return None


def resume_logger(run: Path, rounds: int) -> TensorBoardLogger:
    """The TensorBoard logger of a run continued from its checkpoint of ``rounds`` rounds.

    One TensorBoard run whose steps go on from the checkpoint's rounds: anything the run logged after them
    (a round cut short by a kill) is dropped by TensorBoard (``purge_step``). Call inside the command's
    ``warnings.catch_warnings()``: ``ModelCheckpoint``'s "directory exists and is not empty" is expected
    when a run continues in its own folder, and is not shown.
    """
    warnings.filterwarnings(
        "ignore", message=f"Checkpoint directory {re.escape(str(run))}.* exists and is not empty"
    )
    return TensorBoardLogger(
        save_dir=str(run.parent.parent), name=run.parent.name, version=run.name, purge_step=rounds + 1
    )


def evaluation_logger(ckpt: Any, subcommand: str) -> RoundStepLogger | bool:
    """``<run>/<subcommand>/`` for a checkpoint under ``<run>/checkpoints/``; else no logger (False).

    A ``validate`` or ``test`` of a fitted run then appears in TensorBoard as the run ``version_N/test``
    (its scalars at step = the checkpoint's rounds) instead of as a new ``version_N+1`` folder.
    """
    if not ckpt or Path(ckpt).parent.name != "checkpoints":
        return False
    return RoundStepLogger(save_dir=str(Path(ckpt).parent.parent), name="", version=subcommand)


def files_of(run: Path) -> set[str]:
    """The names in a run folder now (to tell later what a refused resume added)."""
    return {p.name for p in run.iterdir()}


def remove_new_files(new_dirs: list[Path], resumed: tuple[Path, set[str]] | None) -> None:
    """A run refused before its first round leaves no trace: the folders it created, the event files it
    added to the run it was to continue (``resumed``: that run and the names it held before)."""
    for d in new_dirs:
        shutil.rmtree(d, ignore_errors=True)
    if resumed is not None:
        run, before = resumed
        for path in run.glob("events.out.tfevents.*"):
            if path.name not in before:
                path.unlink(missing_ok=True)
