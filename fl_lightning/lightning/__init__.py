"""The Lightning adapter: a round is one training step of :class:`FederatedModule`.

- :mod:`~fl_lightning.lightning.module`: ``FederatedModule`` (logging, validation of the global model,
  the federated callback hooks, checkpoint state) over the engine;
- :mod:`~fl_lightning.lightning.trainer`: :func:`federated_trainer`, the Trainer whose step is a round
  (a :class:`FederatedTrainer`: its defaults, ``last.ckpt`` every round, the summary, atomic checkpoints,
  the run folder, a resume in the checkpoint's folder, the printout), used by the command line, the Flower
  ServerApp and Python alike;
- :mod:`~fl_lightning.lightning.checkpoint`: atomic checkpoint writes, ``last.ckpt`` every round, what a
  resume must agree on;
- :mod:`~fl_lightning.lightning.loggers`: run folders claimed atomically, the logger of ``validate``/``test``;
- :mod:`~fl_lightning.lightning.console`: Lightning's noise left out of a command's output.
"""

from __future__ import annotations

from fl_lightning.lightning.checkpoint import AtomicCheckpointIO, LastRoundCheckpoint
from fl_lightning.lightning.console import console, quiet
from fl_lightning.lightning.module import FederatedModule
from fl_lightning.lightning.trainer import ROUND_DEFAULTS, FederatedTrainer, federated_trainer

__all__ = [
    "ROUND_DEFAULTS",
    "AtomicCheckpointIO",
    "FederatedModule",
    "FederatedTrainer",
    "LastRoundCheckpoint",
    "console",
    "federated_trainer",
    "quiet",
]
