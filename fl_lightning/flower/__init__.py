"""Deployment through Flower: an fl_lightning config as a Flower ``ServerApp`` and ``ClientApp``.

The ServerApp fits the config as ``fit`` does (the same round engine, callbacks, logs and checkpoints);
only the clients' local work runs elsewhere: :class:`~fl_lightning.flower.executor.FlowerExecutor` sends it
to the SuperNodes through Flower's grid, where the ClientApp runs the same client functions as every
executor (:mod:`fl_lightning.engine.local`). Needs the optional extra: ``pip install 'fl_lightning[flwr]'``.

    from fl_lightning.flower import client_app, server_app
    serverapp = server_app("configs/fedavg_digits.yaml")
    clientapp = client_app("configs/fedavg_digits.yaml")

See README.md, "Deployment with Flower".
"""

from __future__ import annotations

from typing import Any

from lightning_utilities.core.imports import RequirementCache

#: The Flower releases this package is tested with (the Message API, Grid, ``flwr run`` of 1.42).
FLWR_REQUIREMENT = "flwr>=1.42,<1.43"


def require_flwr(requirement: str = FLWR_REQUIREMENT) -> None:
    """Raise a one-line ``ModuleNotFoundError`` naming the extra to install unless ``requirement`` is met."""
    available = RequirementCache(requirement)
    if not available:
        raise ModuleNotFoundError(
            f"fl_lightning.flower needs {requirement} (not installed); pip install 'fl_lightning[flwr]'"
        )


if RequirementCache(FLWR_REQUIREMENT):
    from fl_lightning.flower.client_app import client_app
    from fl_lightning.flower.executor import FlowerExecutor
    from fl_lightning.flower.federation import Federation, load_federation, load_run
    from fl_lightning.flower.server_app import fit_on_grid, server_app


def __getattr__(name: str) -> Any:
    """Without Flower, the apps are one-line errors (so ``python -m fl_lightning.flower`` prints one line)."""
    if name in __all__ and name not in ("FLWR_REQUIREMENT", "require_flwr"):
        require_flwr()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "FLWR_REQUIREMENT",
    "Federation",
    "FlowerExecutor",
    "client_app",
    "fit_on_grid",
    "load_federation",
    "load_run",
    "require_flwr",
    "server_app",
]
