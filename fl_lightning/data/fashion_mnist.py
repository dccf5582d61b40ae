"""Fashion-MNIST (Xiao et al., 2017) read from its original IDX files, wherever they already are.

The four files (``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``,
``t10k-labels-idx1-ubyte``, each gzip-compressed with a ``.gz`` suffix or not) are looked for, in order:

1. ``<data.root>/FashionMNIST/raw/``: the layout torchvision downloads into;
2. :data:`DEBIAN_FOLDER` (``/usr/share/datasets/fashion-mnist/``), where Debian's
   ``dataset-fashion-mnist`` package installs them (``apt-get install dataset-fashion-mnist``);
3. with ``data.download=true`` only: torchvision downloads them into ``<data.root>/FashionMNIST/raw/``.

The files are read in place (no copy, no extraction to disk) by :mod:`fl_lightning.data.idx`.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from fl_lightning.data.datasets import (
    DatasetSource,
    DatasetSplits,
    first_line,
    load_torchvision,
    uint8_to_normalised,
)
from fl_lightning.data.idx import IDX_FILES, IdxError, find_idx, read_idx_pair
from fl_lightning.errors import ConfigError

__all__ = ["DEBIAN_FOLDER", "FILES", "FashionMNIST", "find_files"]

log = logging.getLogger(__name__)

#: Where Debian's ``dataset-fashion-mnist`` package installs the files.
DEBIAN_FOLDER = Path("/usr/share/datasets/fashion-mnist")
#: The four IDX files (without ``.gz``): train images, train labels, test images, test labels.
FILES = IDX_FILES
NAME = "fashion_mnist"
NUM_CLASSES = 10


def find_files(root: Path) -> tuple[list[Path] | None, str]:
    """The four files from the first folder that holds all of them: the data.root layout, then Debian's.

    Args:
        root: ``data.root``.

    Returns:
        ``(paths, searched)``: the paths in :data:`FILES` order (None when no folder holds all four) and
        a description of the folders searched, for the error message.
    """
    folders = [Path(root) / "FashionMNIST" / "raw", DEBIAN_FOLDER]
    notes = []
    for folder in folders:
        found = [find_idx(folder, name) for name in FILES]
        if all(p is not None for p in found):
            return [p for p in found if p is not None], ""
        present = sum(p is not None for p in found)
        notes.append(f"{folder}/" + (f" (only {present} of the 4 files)" if present else ""))
    return None, " nor ".join(notes)


class FashionMNIST(DatasetSource):
    """Fashion-MNIST: 60k/10k 28x28 grey clothing images, 10 classes, from the IDX files in place.

    Looks in ``<root>/FashionMNIST/raw/``, then in :data:`DEBIAN_FOLDER`; downloads through torchvision
    into ``root`` only when neither holds the four files and ``data.download`` is set. The result equals the
    torchvision loader's: ``uint8`` pixels scaled to [0, 1], normalised with the training split's mean
    and std, ``int64`` labels. Missing files, or a file truncated or corrupt, are one line naming the file
    and the fix (the Debian package or ``data.download=true``).
    """

    registry_name = NAME

    def load(self, root: Path, download: bool) -> DatasetSplits:
        paths, searched = find_files(root)
        if paths is None:
            if download:
                return load_torchvision(NAME, "FashionMNIST", NUM_CLASSES, root, download=True)
            raise ConfigError(
                f"data.dataset={NAME!r}: no Fashion-MNIST files in {searched} (data.root={str(root)!r}); "
                "install them with `apt-get install dataset-fashion-mnist` (Debian/Ubuntu, read in place) or "
                "set data.download=true to fetch them into data.root (needs network)"
            )
        fix = (
            "reinstall the package (`apt-get install --reinstall dataset-fashion-mnist`)"
            if paths[0].parent == DEBIAN_FOLDER
            else "delete it and fetch it again (data.download=true) or point data.root at a good copy"
        )
        log.info("fashion_mnist: reading %s", paths[0].parent)
        try:
            train_x, train_y = read_idx_pair(paths[0], paths[1])
            test_x, test_y = read_idx_pair(paths[2], paths[3])
        except (IdxError, OSError) as e:
            raise ConfigError(f"data.dataset={NAME!r}: cannot read {first_line(e)}; {fix}") from None
        for labels, lpath in ((train_y, paths[1]), (test_y, paths[3])):
            if labels.size and int(labels.max()) >= NUM_CLASSES:
                raise ConfigError(
                    f"data.dataset={NAME!r}: {lpath} has label {int(labels.max())}, outside "
                    f"0..{NUM_CLASSES - 1}; it is not a Fashion-MNIST label file: replace it"
                )
        x_train, x_test = uint8_to_normalised(train_x, test_x, channels_last=False)
        return DatasetSplits(
            name=NAME,
            task="multiclass",
            num_classes=NUM_CLASSES,
            train_x=x_train,
            train_y=torch.from_numpy(train_y.astype(np.int64)),
            test_x=x_test,
            test_y=torch.from_numpy(test_y.astype(np.int64)),
        )
