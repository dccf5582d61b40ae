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


if RequirementCache(FLWR_REQUIREMENT):
    from fl_lightning.flower.client_app import client_app
    from fl_lightning.flower.federation import Federation, load_federation
    from fl_lightning.flower.server_app import server_app
    from fl_lightning.flower.strategy import FlowerStrategy


def __getattr__(name: str) -> Any:
    """Without Flower, the apps are one-line errors (so ``python -m fl_lightning.flower`` prints one line)."""
    if name in ("client_app", "Federation", "load_federation", "server_app", "FlowerStrategy"):
        require_flwr()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "FLWR_REQUIREMENT",
    "Federation",
    "FlowerStrategy",
    "client_app",
    "load_federation",
    "require_flwr",
    "server_app",
]
