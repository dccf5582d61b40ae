"""Plug-ins that wrap any strategy (``base=``): FedCOG, FastSlow, FineTune, PersonalAtoms,
the robust aggregators (Median, TrimmedMean, Krum, NormBounded), the Attack simulation and
client-level differential privacy (DP).

They are exported from :mod:`fl_lightning.strategies` as well (``class_path:
fl_lightning.strategies.FedCOG``).
"""

from __future__ import annotations

from fl_lightning.strategies.plugins.dp import DP
from fl_lightning.strategies.plugins.fast_slow import FastSlow
from fl_lightning.strategies.plugins.fedcog import FedCOG
from fl_lightning.strategies.plugins.finetune import FineTune
from fl_lightning.strategies.plugins.personal_atoms import PersonalAtoms
from fl_lightning.strategies.plugins.robust import Attack, Krum, Median, NormBounded, TrimmedMean

__all__ = [
    "DP",
    "Attack",
    "FastSlow",
    "FedCOG",
    "FineTune",
    "Krum",
    "Median",
    "NormBounded",
    "PersonalAtoms",
    "TrimmedMean",
]
