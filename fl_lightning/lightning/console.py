"""What a federated run prints: the ``fl_lightning`` logger on stdout, Lightning's noise left out.

Lightning prints advice and status lines written for single-model training (tips, the TPU line, "``max_steps``
reached", checkpoint restore notices, ...). :func:`quiet` drops them, and the warnings that do not apply to a
federated run, for the duration of a ``with`` block only: nothing is filtered at import. :func:`console` is
:func:`quiet` plus the ``fl_lightning`` logger on stdout (the progress lines and the summary); the command
line runs every command inside it, the Flower ServerApp its fit, and the Flower ClientApp builds its run
inside :func:`quiet`. From Python, :func:`printing` does it for a
:class:`~fl_lightning.lightning.trainer.FederatedTrainer`'s ``fit``/``validate``/``test``/``predict`` unless
logging is configured already, so ``trainer.fit(...)`` prints as the command line does.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from lightning.pytorch.utilities.warnings import PossibleUserWarning

#: Lightning messages that are noise in a federated run: advertising tips, the TPU/HPU lines, our own
#: defaults echoed back, and advice that does not apply (in-memory tensors need no loader workers).
NOISE = re.compile(
    r"💡 Tip|(TPU|HPU) available|`Trainer\(val_check_interval=1\)` was configured"
    r"|does not have many workers|isinstance\(treespec, LeafSpec\)` is deprecated"
)

#: Round metrics are computed from state merged across processes before they are logged, so every rank
#: logs the same value; Lightning's advice to add ``sync_dist=True`` (a mean over ranks) does not apply.
SYNC_DIST_ADVICE = r"It is recommended to use `self.log\('(step'|(global|personal|round|train|test)/)"

#: Lightning's status lines and warnings a federated run does not need, hidden unless ``verbose``: the
#: seed and device report, "stopped: max_steps reached" (the summary follows), checkpoint restore notices,
#: the distributed start-up banner, and ``ModelCheckpoint``'s "dirpath has changed" (``validate``/``test``
#: write no checkpoints; a resumed ``fit`` continues in its own folder).
QUIET = re.compile(
    r"Seed set to \d+|GPU available: |LOCAL_RANK: \d+ - CUDA_VISIBLE_DEVICES"
    r"|`Trainer\.fit` stopped: `max_steps="
    r"|Restoring states from the checkpoint path|Restored all states from the checkpoint"
    r"|Loaded model weights from the checkpoint|The dirpath has changed from"
    r"|Initializing distributed: GLOBAL_RANK|All distributed processes registered"
)


#: How many :func:`console` blocks are open (a command's, a Flower app's): :func:`printing` leaves them be.
_open_consoles = 0


class _DropNoise(logging.Filter):
    def __init__(self, pattern: re.Pattern[str]) -> None:
        super().__init__()
        self.pattern = pattern

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.search(record.getMessage())


class _StdoutHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stdout`` is at the time of the record (redirections and capture included)."""

    @property
    def stream(self) -> Any:
        return sys.stdout

    @stream.setter
    def stream(self, value: Any) -> None:
        """The stream is always the current ``sys.stdout``."""


def _drop_lightning_noise() -> Callable[[], None]:
    """Drop :data:`NOISE` and :data:`QUIET` from Lightning's loggers and their handlers; returns the undo."""
    drop = _DropNoise(re.compile(f"{NOISE.pattern}|{QUIET.pattern}"))
    targets: list[logging.Logger | logging.Handler] = []
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):  # the loggers with handlers
        lightning_log = logging.getLogger(name)
        targets += [lightning_log, *lightning_log.handlers]
    for target in targets:
        target.addFilter(drop)

    def undo() -> None:
        for target in targets:
            target.removeFilter(drop)

    return undo


def _filter_warnings() -> None:
    """Inside ``warnings.catch_warnings()``: drop Lightning's warnings that do not apply."""
    warnings.filterwarnings("ignore", message=f".*({NOISE.pattern}|{QUIET.pattern})")
    warnings.filterwarnings("ignore", message=SYNC_DIST_ADVICE, category=PossibleUserWarning)


@contextlib.contextmanager
def quiet(verbose: bool = False) -> Iterator[None]:
    """Lightning's noise and the warnings that do not apply dropped for the block (nothing with ``verbose``).

    Warning filters added inside the block (the command's own, scoped ones) end with it too.
    """
    undo = (lambda: None) if verbose else _drop_lightning_noise()
    try:
        with warnings.catch_warnings():
            if not verbose:
                _filter_warnings()
            yield
    finally:
        undo()


@contextlib.contextmanager
def console(verbose: bool = False) -> Iterator[None]:
    """The console of a command: the ``fl_lightning`` logger on stdout (INFO; DEBUG with ``verbose``: a line
    per round) and :func:`quiet` for the block; the logger is as it was after it."""
    global _open_consoles
    logger = logging.getLogger("fl_lightning")
    level, added = logger.level, None
    if not logger.handlers:
        added = _StdoutHandler()
        added.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(added)
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    _open_consoles += 1
    try:
        with quiet(verbose):
            yield
    finally:
        _open_consoles -= 1
        logger.setLevel(level)
        if added is not None:
            logger.removeHandler(added)


def printing() -> contextlib.AbstractContextManager[None]:
    """:func:`console` for a Trainer's ``fit``/``validate``/``test``/``predict`` from Python, unless one is
    open (a command's) or logging is configured: the ``fl_lightning`` logger has a handler other than
    :func:`console`'s, or the root logger has handlers and shows ``INFO`` (``logging.basicConfig(level=
    "INFO")``: the lines go there, once)."""
    logger, root = logging.getLogger("fl_lightning"), logging.getLogger()
    own = any(not isinstance(h, _StdoutHandler) for h in logger.handlers)
    configured = own or (bool(root.handlers) and root.level <= logging.INFO)
    return contextlib.nullcontext() if _open_consoles or configured else console()
