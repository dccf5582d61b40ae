"""Callbacks: federated hooks for user callbacks, a round progress bar, the server lr per round,
the end-of-run summary, communication to a target accuracy, the global model on the clients' training data
and ``predict``'s CSV writer."""

from __future__ import annotations

from fl_lightning.callbacks.base import FederatedCallback
from fl_lightning.callbacks.communication import CommunicationToTarget
from fl_lightning.callbacks.global_train import GlobalTrainMetrics
from fl_lightning.callbacks.lr_monitor import RoundLearningRateMonitor
from fl_lightning.callbacks.predictions import PredictionWriter
from fl_lightning.callbacks.progress import FederatedProgressBar
from fl_lightning.callbacks.summary import FederatedSummary, summarize

__all__ = [
    "CommunicationToTarget",
    "FederatedCallback",
    "FederatedProgressBar",
    "FederatedSummary",
    "GlobalTrainMetrics",
    "PredictionWriter",
    "RoundLearningRateMonitor",
    "summarize",
]
