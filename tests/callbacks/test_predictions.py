"""PredictionWriter: one CSV row per sample with its index, prediction and per-class scores."""

import csv

import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset

from fl_lightning.callbacks import PredictionWriter


class Fixed(LightningModule):
    """``predict_step`` as FederatedModule's: logits and the predicted class (or labels)."""

    def __init__(self, multilabel: bool) -> None:
        super().__init__()
        self.multilabel = multilabel

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        (x,) = batch
        preds = (x > 0).long() if self.multilabel else x.argmax(dim=-1)
        return {"outputs": x, "predictions": preds}


def _predict(tmp_path, logits, multilabel, loaders=1, batch_size=2):
    writer = PredictionWriter(output_dir=str(tmp_path))
    trainer = Trainer(callbacks=[writer], logger=False, enable_progress_bar=False, enable_model_summary=False)
    data = [DataLoader(TensorDataset(logits), batch_size=batch_size) for _ in range(loaders)]
    trainer.predict(Fixed(multilabel), data if loaders > 1 else data[0], return_predictions=False)
    return writer


def _rows(path):
    with path.open(newline="") as f:
        return list(csv.reader(f))


def test_multiclass_rows_hold_the_index_the_class_and_softmax_probabilities(tmp_path):
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 3.0, 0.0], [0.5, 0.5, 4.0]])
    writer = _predict(tmp_path, logits, multilabel=False)
    rows = _rows(tmp_path / "predictions.csv")
    assert writer.paths == {0: tmp_path / "predictions.csv"}
    assert rows[0] == ["index", "prediction", "score_0", "score_1", "score_2"]
    assert [r[:2] for r in rows[1:]] == [["0", "0"], ["1", "1"], ["2", "2"]]
    scores = torch.tensor([[float(v) for v in r[2:]] for r in rows[1:]])
    torch.testing.assert_close(scores, logits.softmax(dim=1), atol=1e-6, rtol=1e-5)


def test_multilabel_rows_list_the_predicted_labels_and_sigmoid_scores(tmp_path):
    logits = torch.tensor([[1.0, -1.0, 2.0, -3.0], [-1.0, -1.0, -1.0, -1.0], [0.5, 0.5, 0.5, 0.5]])
    _predict(tmp_path, logits, multilabel=True)
    rows = _rows(tmp_path / "predictions.csv")
    assert [r[:2] for r in rows[1:]] == [["0", "0 2"], ["1", ""], ["2", "0 1 2 3"]]
    scores = torch.tensor([[float(v) for v in r[2:]] for r in rows[1:]])
    torch.testing.assert_close(scores, logits.sigmoid(), atol=1e-6, rtol=1e-5)


def test_a_second_dataloader_writes_its_own_file_with_its_own_indices(tmp_path):
    logits = torch.randn(5, 3)
    writer = _predict(tmp_path, logits, multilabel=False, loaders=2)
    assert writer.paths == {0: tmp_path / "predictions.csv", 1: tmp_path / "predictions_1.csv"}
    for path in writer.paths.values():
        assert [r[0] for r in _rows(path)[1:]] == ["0", "1", "2", "3", "4"]


@pytest.mark.parametrize("multilabel", [False, True])
def test_the_file_is_complete_when_predict_returns(tmp_path, multilabel):
    _predict(tmp_path, torch.randn(7, 4), multilabel=multilabel, batch_size=3)
    assert len(_rows(tmp_path / "predictions.csv")) == 1 + 7
