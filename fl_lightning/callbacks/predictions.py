"""``predict``'s output: the global model's predictions, one CSV row per sample."""

from __future__ import annotations

import csv
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter

log = logging.getLogger("fl_lightning")


class PredictionWriter(BasePredictionWriter):
    """Writes what ``predict_step`` returns to ``predictions.csv``, batch by batch.

    ``python -m fl_lightning predict --ckpt_path C`` adds it (unless a ``BasePredictionWriter`` is among
    ``trainer.callbacks``). The file goes to ``output_dir``, by default the Trainer's ``log_dir``: the
    folder ``<run>/predict/`` of the run whose ``checkpoints/`` holds ``C``, or ``trainer.default_root_dir``
    for a checkpoint elsewhere (or none).

    Columns, for a ``predict_step`` returning ``{"outputs": logits, "predictions": ...}`` as
    :meth:`~fl_lightning.FederatedModule.predict_step` does:

    * ``index``: the sample's position in the predicted dataset (the global test split, in order);
    * ``prediction``: the predicted class (multiclass: ``predictions`` has one value per sample), or
      the predicted labels separated by spaces, empty if none (multilabel: one 0/1 column per label);
    * ``score_0`` ... ``score_<C-1>``: the softmax probability of each class (multiclass), or the
      sigmoid score of each label (multilabel).

    With several prediction dataloaders, dataloader ``k > 0`` writes ``predictions_<k>.csv``; in a
    process group each process writes its share to ``predictions.rank<r>.csv`` (the ``index`` column
    says which samples).

    Args:
        output_dir: Folder of the file (default: the Trainer's ``log_dir``).
        filename: Name of the file for the first dataloader.
    """

    def __init__(self, output_dir: str | None = None, filename: str = "predictions.csv") -> None:
        super().__init__(write_interval="batch")
        self.output_dir = output_dir
        self.filename = filename
        self.paths: dict[int, Path] = {}
        self._files: dict[int, tuple[IO[str], Any]] = {}
        self._rows: dict[int, int] = {}

    def on_predict_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._folder = Path(self.output_dir if self.output_dir is not None else trainer.log_dir or ".")
        self._rank = f".rank{trainer.global_rank}" if trainer.world_size > 1 else ""
        self.paths, self._files, self._rows = {}, {}, {}

    def _path(self, dataloader_idx: int) -> Path:
        stem, dot, suffix = self.filename.rpartition(".")
        stem, suffix = (stem, f".{suffix}") if dot else (self.filename, "")
        return self._folder / f"{stem}{f'_{dataloader_idx}' if dataloader_idx else ''}{self._rank}{suffix}"

    def write_on_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        prediction: Any,
        batch_indices: Sequence[int] | None,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int,
    ) -> None:
        outputs = prediction["outputs"].detach().float().cpu()
        predicted = prediction["predictions"].detach().cpu()
        multilabel = predicted.dim() == 2
        scores = torch.sigmoid(outputs) if multilabel else torch.softmax(outputs, dim=-1)
        writer = self._writer(dataloader_idx, scores.shape[-1])
        start = self._rows[dataloader_idx]
        indices = list(batch_indices) if batch_indices else range(start, start + len(predicted))
        for index, label, row in zip(indices, predicted.tolist(), scores.tolist()):
            shown = " ".join(str(k) for k, on in enumerate(label) if on) if multilabel else label
            writer.writerow([index, shown, *(f"{s:.6g}" for s in row)])
        self._rows[dataloader_idx] += len(predicted)

    def _writer(self, dataloader_idx: int, width: int) -> Any:
        if dataloader_idx not in self._files:
            path = self._path(dataloader_idx)
            path.parent.mkdir(parents=True, exist_ok=True)
            f = open(path, "w", newline="")  # noqa: SIM115 - closed in on_predict_end / teardown
            writer = csv.writer(f)
            writer.writerow(["index", "prediction", *(f"score_{k}" for k in range(width))])
            self._files[dataloader_idx] = (f, writer)
            self._rows[dataloader_idx] = 0
            self.paths[dataloader_idx] = path
        return self._files[dataloader_idx][1]

    def on_predict_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._close()
        for idx, path in self.paths.items():
            log.info("predictions of %d samples written to %s", self._rows[idx], path)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._close()

    def _close(self) -> None:
        for f, _ in self._files.values():
            f.close()
        self._files = {}
