"""fl_lightning: federated learning on PyTorch Lightning.

``python -m fl_lightning fit`` trains FedAvg on the embedded digits data; from Python, fit a
``FederatedModule`` on a ``FederatedDataModule`` with ``federated_trainer()`` (README.md, "From Python").
"""

from fl_lightning.api.client import ClientModule
from fl_lightning.data import FederatedDataModule
from fl_lightning.errors import ConfigError, RunError
from fl_lightning.lightning.module import FederatedModule
from fl_lightning.lightning.trainer import federated_trainer
from fl_lightning.strategies import Strategy, get_strategy, list_strategies, register_strategy

__version__ = "0.1.0"

__all__ = [
    "ClientModule",
    "ConfigError",
    "FederatedDataModule",
    "FederatedModule",
    "RunError",
    "Strategy",
    "federated_trainer",
    "get_strategy",
    "list_strategies",
    "register_strategy",
]
