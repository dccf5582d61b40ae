"""The Lightning adapter: a round is one training step of :class:`FederatedModule`.

- :mod:`~fl_lightning.lightning.module`: ``FederatedModule`` (logging, validation of the global model,
  the federated callback hooks, checkpoint state) over the engine;
- :mod:`~fl_lightning.lightning.checkpoint`: atomic checkpoint writes, ``last.ckpt`` every round, what a
  resume must agree on;
- :mod:`~fl_lightning.lightning.loggers`: the logger of ``validate``/``test`` runs.
"""

from __future__ import annotations

from fl_lightning.lightning.checkpoint import AtomicCheckpointIO, LastRoundCheckpoint
from fl_lightning.lightning.module import FederatedModule

__all__ = ["AtomicCheckpointIO", "FederatedModule", "LastRoundCheckpoint"]
