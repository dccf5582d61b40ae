"""``python -m fl_lightning list [WHAT]``: the names a config takes (strategies, models, datasets, partitions,
transforms, systems, round_policy)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fl_lightning.data.datasets import list_datasets
from fl_lightning.data.partition import PARTITIONERS
from fl_lightning.data.transforms import TRANSFORMS
from fl_lightning.engine import system
from fl_lightning.engine.system.policy import FIELDS as POLICY_FIELDS
from fl_lightning.models import MODELS
from fl_lightning.strategies import list_strategies

#: What ``python -m fl_lightning list`` prints: the config field and its accepted values.
LISTS: dict[str, tuple[str, Any]] = {
    "strategies": ("--model.strategy=NAME", list_strategies),
    "models": (
        "model.client.init_args.net: {class_path: fl_lightning.models.NAME}",
        lambda: sorted((c.__name__ for c in MODELS.values()), key=str.lower),
    ),
    "datasets": ("--data.dataset=NAME", list_datasets),  # the classes (a former lowercase name also works)
    "partitions": ("--data.partition=NAME", lambda: [c.__name__ for c in PARTITIONERS.values()]),
    "transforms": ("--data.client_transform=NAME", lambda: [c.__name__ for c in TRANSFORMS.values()]),
    "systems": ("--model.system=NAME", lambda: system_models()),
    "round_policy": ("--model.round_policy.NAME=VALUE", lambda: round_policy_fields()),
}


def system_models() -> list[str]:
    """The system models a config's ``model.system`` takes: the subclasses of ``SystemModel`` that
    :mod:`fl_lightning.engine.system` exports (``fl_lightning.system`` from Python), less the null model
    ``Instant`` that a run without ``model.system`` uses."""
    exported = [getattr(system, name) for name in system.__all__]
    return [
        c.__name__
        for c in exported
        if isinstance(c, type)
        and issubclass(c, system.SystemModel)
        and c not in (system.SystemModel, system.Instant)
    ]


def round_policy_fields() -> list[str]:
    """The fields of the round policy (``model.round_policy``, ``fl_lightning.system.RoundPolicy``), which
    every system model applies; ``policy`` with its values."""
    return [f"{name} (drop|partial)" if name == "policy" else name for name in POLICY_FIELDS]


def list_names(argv: list[str]) -> None:
    """``python -m fl_lightning list [WHAT]``: the names a config takes (WHAT one of :data:`LISTS`; default
    all)."""
    parser = argparse.ArgumentParser(
        prog="python -m fl_lightning list",
        description="The names a config takes, by config field.",
        allow_abbrev=False,
    )
    parser.add_argument("what", nargs="?", help=f"one of {', '.join(LISTS)} (default: all)")
    what = parser.parse_args(argv).what
    if what is not None and what not in LISTS:
        sys.stderr.write(f"error: list: {what!r} is not one of {', '.join(LISTS)}\n")
        raise SystemExit(2)
    for name in [what] if what else LISTS:
        field, names = LISTS[name]
        sys.stdout.write(f"{name} ({field}):\n  " + ", ".join(names()) + "\n")
