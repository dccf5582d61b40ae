"""Loggers of the Lightning adapter: one run folder per run, evaluations at the checkpoint's round.

- :func:`claim_version` / :func:`claim_version_on_first_use`: a TensorBoard or CSV logger without a
  ``version`` gets its ``version_N`` folder created atomically (``os.mkdir``) when it first needs it, so
  runs started together in one folder never share one.
- :func:`resumed_run` / :func:`continue_run`: a ``fit`` from a run's newest checkpoint continues in that
  run's folder (the command line and :class:`~fl_lightning.lightning.trainer.FederatedTrainer` alike);
- :class:`RoundStepLogger`: ``validate``/``test`` of a checkpoint log at the checkpoint's rounds.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only

from fl_lightning.errors import ConfigError
from fl_lightning.lightning.checkpoint import load_checkpoint_file

log = logging.getLogger("fl_lightning")

#: ``ckpt_path`` values Lightning resolves itself instead of naming a file.
SPECIAL_CKPT_PATHS = ("last", "best", "hpc", "registry")


def local_checkpoint(ckpt: Any) -> bool:
    """Whether ``ckpt`` names a local file (not empty, not ``last``/``best``/..., not a URL)."""
    return bool(ckpt) and str(ckpt) not in SPECIAL_CKPT_PATHS and "://" not in str(ckpt)


def checkpoint_rounds(path: Path) -> int | None:
    """The rounds a checkpoint file has done (its ``global_step``); None if it cannot be read."""
    try:
        return int(load_checkpoint_file(path, "cpu", True, mmap=True).get("global_step", 0))
    except ConfigError:
        return None


def resumed_run(ckpt: Any) -> tuple[Path, int] | None:
    """``(run folder, rounds)`` when ``fit`` from ``ckpt`` should continue the checkpoint's own run.

    That is a checkpoint under ``<run>/checkpoints/`` with at least the rounds of the run's ``last.ckpt``
    (it is ``last.ckpt``, or a newer copy); None for anything else (a new run folder).
    """
    if not local_checkpoint(ckpt):
        return None
    path = Path(ckpt).expanduser().resolve()
    if path.parent.name != "checkpoints":
        return None
    run = path.parent.parent
    rounds = checkpoint_rounds(path)
    last = path.parent / "last.ckpt"
    if rounds is None or (last != path and last.exists() and (checkpoint_rounds(last) or 0) > rounds):
        if rounds is not None:
            log.info("resuming from round %d of %s, which went further: a new run folder", rounds, run)
        return None
    return run, rounds


def continue_run(logger: Logger, run: Path, rounds: int) -> bool:
    """:func:`continue_version` of ``logger`` to ``run``, a TensorBoard logger's steps going on from the
    checkpoint's ``rounds`` (what the run logged after them, a round cut short, is dropped: ``purge_step``);
    whether it did."""
    if not continue_version(logger, run):
        return False
    if isinstance(logger, TensorBoardLogger):
        logger._kwargs.setdefault("purge_step", rounds + 1)  # SummaryWriter's argument; no public setter
    return True


class RoundStepLogger(TensorBoardLogger):
    """A TensorBoard logger that writes every scalar at the step :attr:`round_step` once it is set.

    ``validate``/``test``/``predict`` of a checkpoint log into ``<run>/<subcommand>/`` (see the CLI):
    their scalars belong at the checkpoint's rounds, the x-axis of the run's other scalars, while
    Lightning passes its own step counter, which outside ``fit`` is 0. The module sets ``round_step``
    when it knows the checkpoint's rounds. Lightning adds an ``epoch`` scalar to metrics logged without
    a ``step`` (its logger connector, "for convenience"); one epoch holds every round, so it is left out.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.round_step: int | None = None

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if self.round_step is None:
            super().log_metrics(metrics, step)
            return
        super().log_metrics({k: v for k, v in metrics.items() if k != "epoch"}, self.round_step)


def claim_version(parent: Path) -> int:
    """Create the next free ``version_N`` folder under ``parent`` and return its ``N``.

    ``os.mkdir`` either creates the folder or fails because it exists, so two runs started together
    never get the same one: the loser tries the next number.
    """
    parent.mkdir(parents=True, exist_ok=True)
    taken = [int(m.group(1)) for p in parent.iterdir() if (m := re.fullmatch(r"version_(\d+)", p.name))]
    n = max(taken, default=-1) + 1
    while True:
        try:
            os.mkdir(parent / f"version_{n}")
        except FileExistsError:
            n += 1
            continue
        return n


def claim_version_on_first_use(logger: Logger, on_claim: Callable[[Path], None] | None = None) -> None:
    """Have a TensorBoard/CSV ``logger`` without a version claim its ``version_N`` (:func:`claim_version`)
    when it first needs one, i.e. once the Trainer uses it: a Trainer Lightning refuses leaves no folder.

    Only the process of global rank 0 claims: the others write no logs, and Lightning hands them rank 0's
    folder where one is needed (``trainer.log_dir``, checkpoint folders). ``on_claim`` is called with the
    folder created.

    Lightning's loggers choose their version lazily, through private members (``_version``,
    ``_get_next_version``), and have no public hook to claim it atomically or late: they are used here,
    and lightning is capped at <2.7 (the tested release) in pyproject.toml.
    """
    if not isinstance(logger, (TensorBoardLogger, CSVLogger)) or logger._version is not None:
        return
    if rank_zero_only.rank != 0:
        return
    root = Path(logger.root_dir).resolve()

    def claim() -> int:
        try:
            n = claim_version(root)
        except OSError as err:
            raise ConfigError(
                f"trainer.logger: cannot create a run folder in {root} ({err.strerror or err}); "
                "choose a writable save_dir"
            ) from None
        if on_claim is not None:
            on_claim(root / f"version_{n}")
        return n

    logger._get_next_version = claim  # what the logger calls for its version, the first time


def continue_version(logger: Logger, run: Path) -> bool:
    """Point a TensorBoard/CSV ``logger`` without a version at the existing run folder ``run`` when ``run``
    lies in the logger's folder (a resumed run continues there); whether it did."""
    if not isinstance(logger, (TensorBoardLogger, CSVLogger)) or logger._version is not None:
        return False
    if Path(logger.root_dir).resolve() != run.parent:
        return False
    logger._version = run.name  # see claim_version_on_first_use: no public API to set it late
    return True
