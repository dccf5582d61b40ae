"""Tiny-ImageNet-200 (Le & Yang, 2015), read from its standard folder (it is not downloaded).

Unzip ``tiny-imagenet-200.zip`` into ``data.root``::

    <root>/tiny-imagenet-200/wnids.txt                              the 200 class ids (label order)
    <root>/tiny-imagenet-200/train/<wnid>/images/*.JPEG             500 images per class
    <root>/tiny-imagenet-200/val/images/*.JPEG, val/val_annotations.txt   50 labelled images per class

64×64 RGB images: 100,000 for training and the 10,000 labelled validation images as the test split (the
official test images have no labels). In memory as float32 the training split takes about 4.9 GB.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from fl_lightning.data.datasets import DatasetSource, DatasetSplits, uint8_to_normalised
from fl_lightning.errors import ConfigError

__all__ = ["FOLDER", "TinyImageNet"]

FOLDER = "tiny-imagenet-200"


def _read_images(files: list[Path]) -> np.ndarray:
    """``uint8 [N, H, W, 3]`` RGB pixels of ``files`` (grey images are converted)."""
    return np.stack([np.asarray(Image.open(f).convert("RGB"), dtype=np.uint8) for f in files])


class TinyImageNet(DatasetSource):
    """Tiny-ImageNet-200: 100k/10k 64×64 RGB images, 200 classes, from ``<data.root>/tiny-imagenet-200``
    (not downloaded: unzip ``tiny-imagenet-200.zip`` there)."""

    registry_name = "tiny_imagenet"

    def load(self, root: Path, download: bool) -> DatasetSplits:
        return _load(root)


def _load(root: Path) -> DatasetSplits:
    folder = Path(root) / FOLDER
    if not (folder / "wnids.txt").is_file():
        raise ConfigError(
            f"data.dataset='tiny_imagenet' needs {folder}/wnids.txt: unzip tiny-imagenet-200.zip into "
            f"data.root={str(root)!r} (it is not downloaded)"
        )
    wnids = (folder / "wnids.txt").read_text().split()
    label = {w: i for i, w in enumerate(wnids)}
    train_files: list[Path] = []
    train_y: list[int] = []
    for w in wnids:
        files = sorted((folder / "train" / w / "images").glob("*.JPEG"))
        train_files += files
        train_y += [label[w]] * len(files)
    test_files: list[Path] = []
    test_y: list[int] = []
    for line in (folder / "val" / "val_annotations.txt").read_text().splitlines():
        fields = line.split("\t")
        if len(fields) >= 2:
            test_files.append(folder / "val" / "images" / fields[0])
            test_y.append(label[fields[1]])
    if not train_files or not test_files:
        raise ConfigError(f"data.dataset='tiny_imagenet': no images under {folder}/train or {folder}/val")
    train_x, test_x = uint8_to_normalised(
        _read_images(train_files), _read_images(test_files), channels_last=True
    )
    return DatasetSplits(
        name="tiny_imagenet",
        task="multiclass",
        num_classes=len(wnids),
        train_x=train_x,
        train_y=torch.tensor(train_y, dtype=torch.int64),
        test_x=test_x,
        test_y=torch.tensor(test_y, dtype=torch.int64),
    )
