"""What strategies (and user code) program against: the bottom of the package above ``functional``.

- :mod:`~fl_lightning.api.types`: what travels through a round (``Payload``, ``ClientContext``,
  ``ClientResult``, ``RoundInfo``, ``RoundResult``), what a run is made of (``RunSpec``) and the local
  training a client's deployment-time work runs through (``LocalTraining``);
- :mod:`~fl_lightning.api.buffers`: ``TensorBuffers``, a strategy's model-shaped server state;
- :mod:`~fl_lightning.api.aggregation`: the ``Aggregator`` a strategy configures (weighting, receive, reduce);
- :mod:`~fl_lightning.api.collectives`: the process-group collectives the aggregators use;
- :mod:`~fl_lightning.api.strategy`: the ``Strategy`` base, ``StrategyWrapper``, the ``Vectorizable``
  declaration and the registry;
- :mod:`~fl_lightning.api.task`: the ``Task`` (multiclass / multilabel: loss, predictions, metrics);
- :mod:`~fl_lightning.api.metrics`: ``TaskMetrics``, merged by state;
- :mod:`~fl_lightning.api.client`: ``ClientModule``, the client LightningModule;
- :mod:`~fl_lightning.api.attack`: ``SimulatedAttack``, malicious clients (``model.attack``, the ``Attack``
  plug-in), applied by the engine;
- :mod:`~fl_lightning.api.asynchronous`: ``AsyncStrategy``, the base of asynchronous strategies (FedBuff,
  FedAsync): what the server holds of an upload until it arrives, what it releases into the aggregate.

Nothing here imports the engine, the Lightning or Flower adapters, the strategies or the CLI.
"""

from __future__ import annotations

from fl_lightning.api.aggregation import Aggregator, Entry, weighted_mean
from fl_lightning.api.asynchronous import DELTA, AsyncStrategy
from fl_lightning.api.attack import SimulatedAttack
from fl_lightning.api.buffers import TensorBuffers
from fl_lightning.api.client import ClientModule, merge_train_states
from fl_lightning.api.metrics import TaskMetrics
from fl_lightning.api.strategy import (
    HOOKS,
    PERSONAL,
    STRATEGIES,
    Strategy,
    StrategyWrapper,
    Vectorizable,
    get_strategy,
    list_strategies,
    load_personal,
    register_strategy,
)
from fl_lightning.api.task import TASKS, Task
from fl_lightning.api.types import (
    ClientContext,
    ClientResult,
    LocalTraining,
    Payload,
    RoundInfo,
    RoundResult,
    RunSpec,
    TrainState,
)

__all__ = [
    "DELTA",
    "HOOKS",
    "PERSONAL",
    "STRATEGIES",
    "TASKS",
    "Aggregator",
    "AsyncStrategy",
    "ClientContext",
    "ClientModule",
    "ClientResult",
    "Entry",
    "LocalTraining",
    "Payload",
    "RoundInfo",
    "RoundResult",
    "RunSpec",
    "SimulatedAttack",
    "Strategy",
    "StrategyWrapper",
    "Task",
    "TaskMetrics",
    "TensorBuffers",
    "TrainState",
    "Vectorizable",
    "get_strategy",
    "list_strategies",
    "load_personal",
    "merge_train_states",
    "register_strategy",
    "weighted_mean",
]
