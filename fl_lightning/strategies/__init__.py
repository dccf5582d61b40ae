"""Federated strategies: one file and one small class each, registered by name.

Every module in this package is imported here, and each strategy class it defines with
``@register_strategy`` is added to the registry and exported from ``fl_lightning.strategies`` (so a
YAML config can say ``class_path: fl_lightning.strategies.FedProx`` or just ``FedProx``). Adding a
strategy is adding a file.
"""

from __future__ import annotations

import importlib
import pkgutil

from fl_lightning.errors import ConfigError
from fl_lightning.strategies.base import ClientContext, RoundInfo, Strategy, StrategyWrapper

STRATEGIES: dict[str, type[Strategy]] = {}


def register_strategy(cls: type[Strategy]) -> type[Strategy]:
    """Class decorator adding a :class:`Strategy` subclass to the registry under ``cls.name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} needs a non-empty class attribute `name` to be registered")
    STRATEGIES[cls.name] = cls
    globals()[cls.__name__] = cls
    return cls


def list_strategies() -> list[str]:
    """Class names of all registered strategies: the values ``--model.strategy`` takes (``FedProx``)."""
    return sorted((cls.__name__ for cls in STRATEGIES.values()), key=str.lower)


def get_strategy(name: str, **kwargs: object) -> Strategy:
    """Instantiate a registered strategy by class name (``FedProx``) or registry name (``fedprox``).

    Both are matched case-insensitively.
    """
    key = name.lower()
    cls = STRATEGIES.get(key) or next((c for c in STRATEGIES.values() if c.__name__.lower() == key), None)
    if cls is None:
        raise ConfigError(
            f"model.strategy={name!r} is not a known strategy; choose one of {', '.join(list_strategies())}"
        )
    return cls(**kwargs)


for _info in pkgutil.iter_modules(__path__):
    if _info.name != "base":
        importlib.import_module(f"{__name__}.{_info.name}")

from fl_lightning.strategies.fedavg import FedAvg  # noqa: E402  (re-exported for type checkers)
from fl_lightning.strategies.fedprox import FedProx  # noqa: E402

__all__ = [
    "STRATEGIES",
    "ClientContext",
    "FedAvg",
    "FedProx",
    "RoundInfo",
    "Strategy",
    "StrategyWrapper",
    "get_strategy",
    "list_strategies",
    "register_strategy",
]
