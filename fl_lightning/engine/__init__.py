"""The round, written once, and where the clients' local work runs.

- :mod:`~fl_lightning.engine.round`: the :class:`~fl_lightning.engine.round.Engine` (sample, message,
  attack, failure policy, aggregate, server update and step, round metrics, stop reasons);
- :mod:`~fl_lightning.engine.work`: what an executor receives (the round's ``Work``, a frozen record) and
  the ``Executor`` interface: the round and the executors meet there, neither imports the other;
- :mod:`~fl_lightning.engine.executors`: one client at a time, vectorised groups, a process group's share,
  and ``default_executor``, which the adapter that sets the engine up calls;
- :mod:`~fl_lightning.engine.local`: a client's side (its local steps, written once for one client and a
  stacked group, the check of its upload, the model it deploys), the same on every executor and on a
  Flower SuperNode;
- :mod:`~fl_lightning.engine.vectorized`: several clients' local steps as one batched computation;
  :mod:`~fl_lightning.engine.batched`: a group's linear chain batched by hand, its SGD step fused into the
  backward; :mod:`~fl_lightning.engine.calibrate`: on a CPU, batched or one at a time, as measured;
- :mod:`~fl_lightning.engine.state`: every client's persistent state, off the accelerator;
- :mod:`~fl_lightning.engine.attack`: the run's one simulated attack (``model.attack`` or the ``Attack``
  plug-in);
- :mod:`~fl_lightning.engine.distributed`: the clients' assignment to processes.

No Lightning Trainer here: the adapters (:mod:`fl_lightning.lightning`, :mod:`fl_lightning.flower`) drive it.
"""

from __future__ import annotations

from fl_lightning.engine.attack import SimulatedAttack
from fl_lightning.engine.executors import ProcessGroup, Sequential, Vectorized, default_executor, run_client
from fl_lightning.engine.local import LocalConfig, evaluate, evaluate_deployed, train_client
from fl_lightning.engine.round import Engine, EngineConfig, RoundListener, RoundOutcome, ServerStep
from fl_lightning.engine.state import ClientStateStore
from fl_lightning.engine.work import Executor, Work

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
    "Work",
    "default_executor",
    "evaluate",
    "evaluate_deployed",
    "run_client",
    "train_client",
]
