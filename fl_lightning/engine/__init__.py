"""The round, written once, and where the clients' local work runs.

- :mod:`~fl_lightning.engine.round`: the :class:`~fl_lightning.engine.round.Engine` (sample, message,
  attack, failure policy, aggregate, server update and step, round metrics, stop reasons);
- :mod:`~fl_lightning.engine.executors`: one client at a time, vectorised groups, a process group's share;
- :mod:`~fl_lightning.engine.local`: a client's side (its local steps, the check of its upload, the model
  it deploys), the same on every executor and on a Flower SuperNode;
- :mod:`~fl_lightning.engine.vectorized`: several clients' local steps as one batched computation;
- :mod:`~fl_lightning.engine.state`: every client's persistent state, off the accelerator;
- :mod:`~fl_lightning.engine.attack`: simulated malicious clients (``model.attack``);
- :mod:`~fl_lightning.engine.distributed`: the clients' assignment to processes.

No Lightning Trainer here: the adapters (:mod:`fl_lightning.lightning`, :mod:`fl_lightning.flower`) drive it.
"""

from __future__ import annotations

from fl_lightning.engine.attack import SimulatedAttack
from fl_lightning.engine.executors import Executor, ProcessGroup, Sequential, Vectorized
from fl_lightning.engine.local import LocalConfig, evaluate, evaluate_deployed, train_client
from fl_lightning.engine.round import Engine, EngineConfig, RoundListener, RoundOutcome, ServerStep
from fl_lightning.engine.state import ClientStateStore

__all__ = [
    "ClientStateStore",
    "Engine",
    "EngineConfig",
    "Executor",
    "LocalConfig",
    "ProcessGroup",
    "RoundListener",
    "RoundOutcome",
    "Sequential",
    "ServerStep",
    "SimulatedAttack",
    "Vectorized",
    "evaluate",
    "evaluate_deployed",
    "train_client",
]
