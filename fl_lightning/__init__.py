"""fl_lightning: federated learning on PyTorch Lightning.

``python -m fl_lightning fit`` trains FedAvg on the embedded digits data; from Python, fit a
``FederatedModule`` on a ``FederatedDataModule`` with ``federated_trainer()`` (README.md, "From Python").
Strategies are in :mod:`fl_lightning.strategies`, networks in :mod:`fl_lightning.models`, partitions and
client transforms in :mod:`fl_lightning.data`, system models in :mod:`fl_lightning.system`, callbacks in
:mod:`fl_lightning.callbacks`; how a run executes (vectorised clients, compile, threads, the client state
store) is a ``Runtime``, ``FederatedModule(runtime=Runtime(vectorize="auto"))``.
"""

from fl_lightning.api.client import ClientModule
from fl_lightning.data import FederatedDataModule
from fl_lightning.engine.runtime import Runtime
from fl_lightning.errors import ConfigError, RunError
from fl_lightning.lightning.console import console
from fl_lightning.lightning.module import FederatedModule
from fl_lightning.lightning.trainer import FederatedTrainer, federated_trainer
from fl_lightning.strategies import Strategy, get_strategy, list_strategies, register_strategy

__version__ = "0.1.0"

__all__ = [
    "ClientModule",
    "ConfigError",
    "FederatedDataModule",
    "FederatedModule",
    "FederatedTrainer",
    "RunError",
    "Runtime",
    "Strategy",
    "console",
    "federated_trainer",
    "get_strategy",
    "list_strategies",
    "register_strategy",
]
