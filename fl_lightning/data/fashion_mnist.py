"""Fashion-MNIST (Xiao et al., 2017) read from its original IDX files, wherever they already are.

The four files (``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``,
``t10k-labels-idx1-ubyte``, each gzip-compressed with a ``.gz`` suffix or not) are looked for, in order:

1. ``<data.root>/FashionMNIST/raw/``: the layout torchvision downloads into;
2. :data:`DEBIAN_FOLDER` (``/usr/share/datasets/fashion-mnist/``), where Debian's
   ``dataset-fashion-mnist`` package installs them (``apt-get install dataset-fashion-mnist``);
3. with ``data.download=true`` only: torchvision downloads them into ``<data.root>/FashionMNIST/raw/``.

The files are read in place (no copy, no extraction to disk). IDX is the format of the MNIST family:
two zero bytes, a type byte (``0x08``: unsigned bytes), the number of dimensions, each dimension as a
big-endian 32-bit integer, then the values in C order.
"""

from __future__ import annotations

import gzip
import logging
import struct
import zlib
from pathlib import Path

import numpy as np
import torch

from fl_lightning.data.datasets import (
    DatasetSplits,
    _first_line,
    _load_torchvision,
    _uint8_to_normalised,
    register_dataset,
)
from fl_lightning.errors import ConfigError

__all__ = ["DEBIAN_FOLDER", "FILES", "find_files", "read_idx"]

log = logging.getLogger(__name__)

#: Where Debian's ``dataset-fashion-mnist`` package installs the files.
DEBIAN_FOLDER = Path("/usr/share/datasets/fashion-mnist")
#: The four IDX files (without ``.gz``): train images, train labels, test images, test labels.
FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
NAME = "fashion_mnist"
NUM_CLASSES = 10
_UBYTE = 0x08  # IDX type code of unsigned bytes, the only type the MNIST family uses
_GZIP_MAGIC = b"\x1f\x8b"


class IdxError(ValueError):
    """A file that is not a complete IDX file of unsigned bytes (the message says what is wrong)."""


def read_idx(path: Path) -> np.ndarray:
    """The ``uint8`` array stored in an IDX file, gzip-compressed or not (told by its first bytes).

    Args:
        path: The file.

    Raises:
        IdxError: If the header is not that of an unsigned-byte IDX file, or the data is shorter or
            longer than the header's dimensions say, or the gzip stream is damaged.
        OSError: If the file cannot be opened.
    """
    with open(path, "rb") as raw:
        compressed = raw.read(2) == _GZIP_MAGIC
    stream = gzip.open(path, "rb") if compressed else open(path, "rb")  # noqa: SIM115 (closed below)
    try:
        with stream as f:
            head = f.read(4)
            if len(head) < 4 or head[:2] != b"\0\0" or head[2] != _UBYTE:
                raise IdxError("not an IDX file of unsigned bytes (bad header)")
            ndim = head[3]
            dims_bytes = f.read(4 * ndim)
            if len(dims_bytes) < 4 * ndim:
                raise IdxError("truncated header")
            dims = struct.unpack(f">{ndim}I", dims_bytes)
            out = np.empty(dims, dtype=np.uint8)
            view = memoryview(out).cast("B")
            filled = 0
            while filled < out.size:
                got = f.readinto(view[filled:])
                if not got:
                    break
                filled += got
            if filled < out.size:
                raise IdxError(f"truncated: {filled} of {out.size} data bytes for shape {list(dims)}")
            if f.read(1):
                raise IdxError(f"trailing bytes after the {out.size} data bytes of shape {list(dims)}")
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise IdxError(f"damaged gzip stream: {_first_line(e)}") from None
    return out


def _existing(folder: Path, name: str) -> Path | None:
    """``folder/name`` or ``folder/name.gz``, whichever exists first (the uncompressed file is quicker)."""
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None


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
        found = [_existing(folder, name) for name in FILES]
        if all(p is not None for p in found):
            return [p for p in found if p is not None], ""
        present = sum(p is not None for p in found)
        notes.append(f"{folder}/" + (f" (only {present} of the 4 files)" if present else ""))
    return None, " nor ".join(notes)


def _read_checked(path: Path, ndim: int, source: str) -> np.ndarray:
    """:func:`read_idx` with every failure turned into one ConfigError line naming the file and the fix."""
    fix = (
        "reinstall the package (`apt-get install --reinstall dataset-fashion-mnist`)"
        if source == "debian"
        else "delete it and fetch it again (data.download=true) or point data.root at a good copy"
    )
    try:
        arr = read_idx(path)
    except (IdxError, OSError) as e:
        raise ConfigError(f"data.dataset={NAME!r}: cannot read {path}: {_first_line(e)}; {fix}") from None
    if arr.ndim != ndim:
        raise ConfigError(
            f"data.dataset={NAME!r}: {path} holds a {arr.ndim}-d array where {ndim}-d "
            f"{'images' if ndim == 3 else 'labels'} are expected; {fix}"
        )
    return arr


@register_dataset(NAME)
def load_fashion_mnist(root: Path, download: bool) -> DatasetSplits:
    """Fashion-MNIST: 60k/10k 28x28 grey clothing images, 10 classes, from the IDX files in place.

    Looks in ``<root>/FashionMNIST/raw/``, then in :data:`DEBIAN_FOLDER`; downloads through torchvision
    into ``root`` only when neither holds the four files and ``download`` is set. The result equals the
    torchvision loader's: ``uint8`` pixels scaled to [0, 1], normalised with the training split's mean
    and std, ``int64`` labels.

    Raises:
        ConfigError: Files missing (the line names both fixes: the Debian package or
            ``data.download=true``), or a file truncated or corrupt (the line names the file).
    """
    paths, searched = find_files(root)
    if paths is None:
        if download:
            return _load_torchvision(NAME, "FashionMNIST", NUM_CLASSES, root, download=True)
        raise ConfigError(
            f"data.dataset={NAME!r}: no Fashion-MNIST files in {searched} (data.root={str(root)!r}); "
            "install them with `apt-get install dataset-fashion-mnist` (Debian/Ubuntu, read in place) or "
            "set data.download=true to fetch them into data.root (needs network)"
        )
    source = "debian" if paths[0].parent == DEBIAN_FOLDER else "root"
    log.info("fashion_mnist: reading %s", paths[0].parent)
    train_x, train_y, test_x, test_y = (
        _read_checked(p, ndim, source) for p, ndim in zip(paths, (3, 1, 3, 1))
    )
    for images, labels, ipath, lpath in (
        (train_x, train_y, paths[0], paths[1]),
        (test_x, test_y, paths[2], paths[3]),
    ):
        if len(images) != len(labels):
            raise ConfigError(
                f"data.dataset={NAME!r}: {ipath} has {len(images)} images but {lpath} has {len(labels)} "
                "labels; the files do not belong together: replace them with one consistent set"
            )
        if labels.size and int(labels.max()) >= NUM_CLASSES:
            raise ConfigError(
                f"data.dataset={NAME!r}: {lpath} has label {int(labels.max())}, outside "
                f"0..{NUM_CLASSES - 1}; it is not a Fashion-MNIST label file: replace it"
            )
    x_train, x_test = _uint8_to_normalised(train_x, test_x, channels_last=False)
    return DatasetSplits(
        name=NAME,
        task="multiclass",
        num_classes=NUM_CLASSES,
        train_x=x_train,
        train_y=torch.from_numpy(train_y.astype(np.int64)),
        test_x=x_test,
        test_y=torch.from_numpy(test_y.astype(np.int64)),
    )
