"""Loggers of the Lightning adapter: one run folder per run, evaluations at the checkpoint's round.

- :func:`claim_version` / :func:`claim_version_on_first_use`: a TensorBoard or CSV logger without a
  ``version`` gets its ``version_N`` folder created atomically (``os.mkdir``) when it first needs it, so
  runs started together in one folder never share one; a run's ``name`` labels it ``version_N-<label>``
  (:func:`folder_label`; ``auto``, the default, is :func:`run_label`:
  ``version_3-fedbuff-dirichlet-devices``).
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
from fl_lightning.runs import run_number

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


def run_label(module: Any, datamodule: Any) -> str:
    """A run's readable label: its strategy, partition, client transform and system model, lower case
    (``fedbuff-dirichlet-devices``), each where there is one."""
    parts = [
        getattr(module, "strategy", None),
        getattr(datamodule, "partition", None),
        getattr(datamodule, "client_transform", None),
        getattr(module, "system", None),
    ]
    names = [
        (getattr(p, "_lazy_class_type", None) or type(p)).__name__.lower() for p in parts if p is not None
    ]
    return "-".join(names)


#: ``name`` values that ask for a bare ``version_N`` folder (no label).
NO_LABEL = ("", "none", "null")


def folder_label(name: str | None) -> str | None:
    """The label a run's ``name`` asks for: None (a bare ``version_N``) for None, ``""``, ``none`` or
    ``null``; else ``name`` as given (``"auto"``: :func:`run_label`, once the module and data are known)."""
    if name is None or name.strip().lower() in NO_LABEL:
        return None
    return name


def as_label(name: str) -> str:
    """``name`` as a folder label: letters, digits and ``._+=-`` (others become ``-``)."""
    return re.sub(r"[^\w.+=-]+", "-", name).strip("-")


def claim_version(parent: Path, label: str | None = None) -> str:
    """Create the next free ``version_N`` (``version_N-<label>``) folder under ``parent``; its name.

    ``N`` counts every run folder, labelled or not, and two runs started together never get the same one:
    ``os.mkdir("version_N")`` either creates the folder or fails because it exists (the loser tries the next
    number); the winner then gives ``N`` up if a labelled ``version_N-...`` appeared meanwhile (a run whose
    claim was renamed to its label), else renames its claim to its label.
    """
    parent.mkdir(parents=True, exist_ok=True)
    taken = [n for p in parent.iterdir() if (n := run_number(p)) is not None]
    n = max(taken, default=-1) + 1
    suffix = f"-{as_label(label)}" if label and as_label(label) else ""
    while True:
        claim = parent / f"version_{n}"
        try:
            os.mkdir(claim)
        except FileExistsError:
            n += 1
            continue
        if any(p != claim and run_number(p) == n for p in parent.iterdir()):
            os.rmdir(claim)
            n += 1
            continue
        if not suffix:
            return claim.name
        os.rename(claim, parent / f"{claim.name}{suffix}")
        return f"{claim.name}{suffix}"


def claim_version_on_first_use(
    logger: Logger,
    on_claim: Callable[[Path], None] | None = None,
    label: Callable[[], str | None] | None = None,
) -> None:
    """Have a TensorBoard/CSV ``logger`` without a version claim its ``version_N`` (:func:`claim_version`)
    when it first needs one, i.e. once the Trainer uses it: a Trainer Lightning refuses leaves no folder.
    ``label()`` (when given) names it ``version_N-<label>`` then.

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

    def claim() -> str:
        try:
            name = claim_version(root, label() if label is not None else None)
        except OSError as err:
            raise ConfigError(
                f"trainer.logger: cannot create a run folder in {root} ({err.strerror or err}); "
                "choose a writable save_dir"
            ) from None
        if on_claim is not None:
            on_claim(root / name)
        return name

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
