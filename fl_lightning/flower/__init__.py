"""Deployment through Flower: an fl_lightning config as a Flower ``ServerApp`` and ``ClientApp``.

The same client code (:func:`fl_lightning.core.local.train_client`) and strategy hooks as the
single-process simulation run on Flower SuperNodes, and an fl_lightning strategy's server half runs in
Flower's ServerApp (:class:`FlowerStrategy`). Needs the optional extra: ``pip install 'fl_lightning[flwr]'``.

    from fl_lightning.flower import client_app, server_app
    serverapp = server_app("configs/fedavg_digits.yaml")
    clientapp = client_app("configs/fedavg_digits.yaml")

See README.md, "Deployment with Flower".
"""

from __future__ import annotations

import importlib
from typing import Any

from lightning_utilities.core.imports import RequirementCache

#: The Flower releases this package is tested with (Message API: ``flwr.serverapp.strategy``, 1.41).
FLWR_REQUIREMENT = "flwr>=1.41"


def require_flwr(requirement: str = FLWR_REQUIREMENT) -> None:
    """Raise a one-line ``ModuleNotFoundError`` naming the extra to install unless ``requirement`` is met."""
    available = RequirementCache(requirement)
    if not available:
        raise ModuleNotFoundError(
            f"fl_lightning.flower needs {requirement} (not installed); pip install 'fl_lightning[flwr]'"
        )


#: Public names and the submodule that defines them (imported on first use, after :func:`require_flwr`,
#: so ``python -m fl_lightning.flower`` without Flower prints one line instead of a traceback).
_EXPORTS = {
    "client_app": "client_app",
    "Federation": "federation",
    "load_federation": "federation",
    "server_app": "server_app",
    "FlowerStrategy": "strategy",
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    require_flwr()
    module = importlib.import_module(f"{__name__}.{_EXPORTS[name]}")
    return getattr(module, name)


__all__ = [
    "FLWR_REQUIREMENT",
    "Federation",
    "FlowerStrategy",
    "client_app",
    "load_federation",
    "require_flwr",
    "server_app",
]
