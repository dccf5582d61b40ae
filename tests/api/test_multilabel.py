"""A multilabel task end to end: BCE clients, multilabel metrics globally, per client and merged."""

import torch

from fl_lightning.api.client import ClientModule
from fl_lightning.data.datasets import _DATASETS, DatasetSplits, register_dataset
from fl_lightning.lightning.module import FederatedModule
from fl_lightning.models import SmallCNN

from conftest import make_data

LABELS = 5


def _synthetic(root, download) -> DatasetSplits:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 1, 8, 8, generator=g)
    # label j is on when the mean of image row j is positive: learnable, several labels per sample
    y = (x[:, 0, :LABELS, :].mean(dim=2) > 0).float()
    return DatasetSplits("ml_test", "multilabel", LABELS, x[:240], y[:240], x[240:], y[240:])


def test_multilabel_federation_logs_macro_and_micro_metrics(fit):
    register_dataset("_multilabel_test")(_synthetic)
    try:
        torch.manual_seed(0)
        client = ClientModule(
            SmallCNN(1, LABELS, width=4, hidden=16), task="multilabel", lr=0.5, momentum=0.0
        )
        module = FederatedModule(client, local_steps=3)
        trainer = fit(module, data=make_data(dataset="_multilabel_test"), rounds=3)
    finally:
        _DATASETS.pop("_multilabel_test")
    metrics = trainer.callback_metrics
    for key in ("c_f1", "o_f1", "c_precision", "o_recall", "map_macro", "map_micro", "loss"):
        assert f"global/{key}" in metrics and f"personal/{key}" in metrics, key
    assert set(module.client_eval[0]) >= {"c_f1", "o_f1", "map_micro"}
    assert module.history[-1].train["train_loss"] < module.history[0].train["train_loss"]
