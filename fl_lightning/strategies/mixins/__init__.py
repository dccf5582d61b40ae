"""Mixins that change a strategy's local step: list them before the base strategy.

``class FedSAM(SharpnessAware, FedAvg)``: the two-pass SAM step; ``MoreauEnvelope``: the bi-level
client loop of pFedMe and TDPFed (a ``Strategy`` subclass itself).
"""

from __future__ import annotations

from fl_lightning.strategies.mixins.moreau import MoreauEnvelope
from fl_lightning.strategies.mixins.sharpness import SharpnessAware

__all__ = ["MoreauEnvelope", "SharpnessAware"]
