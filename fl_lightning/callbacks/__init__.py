"""Callbacks: federated hooks for user callbacks, a round progress bar, the server lr per round,
the end-of-run summary and communication to a target accuracy."""

from __future__ import annotations

from fl_lightning.callbacks.base import FederatedCallback
from fl_lightning.callbacks.communication import CommunicationToTarget
from fl_lightning.callbacks.lr_monitor import RoundLearningRateMonitor
from fl_lightning.callbacks.progress import FederatedProgressBar
from fl_lightning.callbacks.summary import FederatedSummary, summarize

__all__ = [
    "CommunicationToTarget",
    "FederatedCallback",
    "FederatedProgressBar",
    "FederatedSummary",
    "RoundLearningRateMonitor",
    "summarize",
]
