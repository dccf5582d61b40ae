"""A node's own data: the files one federation member holds, read where they are (a Flower SuperNode's
``data-dir``), with its own local test split.

A data folder holds one of three layouts (looked for in this order):

1. **An array file**: one ``*.npz`` file (``numpy.savez``) with ``x`` (inputs ``[N, ...]``) and ``y``
   (integer labels ``[N]``, or 0/1 targets ``[N, C]`` for multilabel data), and optionally ``x_test`` and
   ``y_test``: the node's local test split.
2. **The idx files of (Fashion-)MNIST**: ``train-images-idx3-ubyte`` and ``train-labels-idx1-ubyte``
   (each gzip-compressed with a ``.gz`` suffix or not), and optionally ``t10k-images-idx3-ubyte`` and
   ``t10k-labels-idx1-ubyte`` as the local test split (:mod:`fl_lightning.data.idx`).
3. **An image-folder tree**: one subfolder per class holding its images (``.png``, ``.jpg``, ``.jpeg``,
   ``.bmp``, ``.gif``, ``.webp``; one size for all), either directly in the folder or under ``train/``
   with an optional ``test/`` tree of the same shape as the local test split. A class folder is named by
   its label (``0``, ``1``, ...), or by a name of ``classes`` (the names in label order, the same on every
   node), so that every node gives a class the same label even when it holds only some of the classes.

Inputs stored as bytes (``uint8``: images, idx files, an ``x`` array of ``uint8``) are scaled to [0, 1];
float inputs are used as stored. ``normalize=(mean, std)`` then applies ``(x - mean) / std`` to every
input, so the nodes' inputs can match what the model was built for (e.g. the statistics the server's own
test set was normalised with). Without test files, ``test_fraction`` of the node's samples (a random draw
seeded by ``seed``) is held out as its local test split.

Every failure (a folder that is not there, no layout found, an unreadable file, labels outside the
model's classes) is one :class:`~fl_lightning.errors.ConfigError` line naming the folder or file and the fix.
"""

from __future__ import annotations

import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from fl_lightning.data.idx import IDX_FILES, IdxError, find_idx, read_idx
from fl_lightning.errors import ConfigError

__all__ = ["IMAGE_SUFFIXES", "LAYOUTS", "NodeFiles", "read_node_files"]

#: The layouts a data folder may hold, as the error message names them.
LAYOUTS = (
    "one .npz file with arrays x and y (optional x_test, y_test)",
    "the idx files train-images-idx3-ubyte and train-labels-idx1-ubyte (optional t10k-*; .gz or not)",
    "an image-folder tree: <class>/<image> (or train/<class>/... with an optional test/<class>/...)",
)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")
_IDX = IDX_FILES


@dataclass
class NodeFiles:
    """A node's samples as tensors: inputs ``float32``, labels ``int64 [N]`` (or ``float32 [N, C]``).

    Attributes:
        folder: The data folder read.
        layout: ``"npz"``, ``"idx"`` or ``"image-folder"``.
        x, y: The node's training samples (all its samples when the files hold no test split).
        test_x, test_y: Its local test split from the files (None: held out from ``x``/``y`` instead).
    """

    folder: Path
    layout: str
    x: Tensor
    y: Tensor
    test_x: Tensor | None = None
    test_y: Tensor | None = None

    @property
    def num_samples(self) -> int:
        return len(self.y)

    def split(self, test_fraction: float, seed: Sequence[int]) -> tuple[Tensor, Tensor]:
        """``(train_idx, test_idx)``: sorted rows of ``x``. Without a test split in the files,
        ``round(test_fraction * N)`` random rows (at most N - 1; seeded by ``seed``) are held out."""
        n = self.num_samples
        if self.test_x is not None:
            return torch.arange(n), torch.arange(len(self.test_y))  # type: ignore[arg-type]
        n_test = min(round(n * test_fraction), n - 1) if n > 1 else 0
        order = np.random.default_rng(list(seed)).permutation(n)
        return torch.from_numpy(np.sort(order[n_test:])), torch.from_numpy(np.sort(order[:n_test]))


def _fail(where: Path, what: str, fix: str) -> ConfigError:
    return ConfigError(f"data-dir {str(where)!r}: {what}; {fix}")


def _inputs(x: np.ndarray, where: Path, normalize: tuple[float, float] | None) -> Tensor:
    """Inputs as ``float32``: ``uint8`` scaled to [0, 1]; then ``(x - mean) / std`` if ``normalize``."""
    if x.dtype == np.uint8:
        t = torch.from_numpy(np.ascontiguousarray(x)).to(torch.float32).div_(255.0)
    elif np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer):
        t = torch.from_numpy(np.ascontiguousarray(x)).to(torch.float32)
    else:
        raise _fail(where, f"inputs of type {x.dtype}", "store numbers (float or uint8)")
    if normalize is not None:
        mean, std = normalize
        t.sub_(mean).div_(std if std else 1.0)
    return t


def _labels(y: np.ndarray, where: Path) -> Tensor:
    if y.ndim == 1:
        if not np.issubdtype(y.dtype, np.integer):
            if np.issubdtype(y.dtype, np.floating) and np.all(np.mod(y, 1) == 0):
                y = y.astype(np.int64)
            else:
                raise _fail(where, f"labels of type {y.dtype}", "store integer class labels 0..C-1")
        return torch.from_numpy(y.astype(np.int64))
    if y.ndim == 2:  # multilabel 0/1 targets
        return torch.from_numpy(np.asarray(y, dtype=np.float32))
    raise _fail(
        where, f"labels of shape {list(y.shape)}", "store y as [N] class labels or [N, C] 0/1 targets"
    )


def _read_npz(path: Path, normalize: tuple[float, float] | None) -> NodeFiles:
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        line = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise _fail(path, f"cannot read it ({line})", "replace it with a numpy.savez file") from None
    missing = [k for k in ("x", "y") if k not in arrays]
    if missing:
        raise _fail(
            path,
            f"no array {missing[0]!r} (it holds {sorted(arrays)})",
            "save the inputs as x and the labels as y",
        )
    if ("x_test" in arrays) != ("y_test" in arrays):
        raise _fail(path, "x_test without y_test (or y_test without x_test)", "save both, or neither")
    for xs, ys in (("x", "y"), ("x_test", "y_test")):
        if xs in arrays and len(arrays[xs]) != len(arrays[ys]):
            raise _fail(
                path,
                f"{len(arrays[xs])} inputs {xs} but {len(arrays[ys])} labels {ys}",
                "save one label per input",
            )
    if not len(arrays["y"]):
        raise _fail(path, "no samples in x", "give the node some training samples")
    out = NodeFiles(path.parent, "npz", _inputs(arrays["x"], path, normalize), _labels(arrays["y"], path))
    if "x_test" in arrays:
        out.test_x, out.test_y = _inputs(arrays["x_test"], path, normalize), _labels(arrays["y_test"], path)
    return out


def _read_idx_checked(path: Path, ndim: int) -> np.ndarray:
    try:
        return read_idx(path, ndim)
    except (IdxError, OSError) as err:
        line = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise _fail(path, f"cannot read it ({line})", "replace it with a complete idx file") from None


def _read_idx(folder: Path, normalize: tuple[float, float] | None) -> NodeFiles:
    paths = [find_idx(folder, n) for n in _IDX]
    if paths[0] is None or paths[1] is None:
        missing = _IDX[0] if paths[0] is None else _IDX[1]
        raise _fail(folder, f"{missing}(.gz) is missing", "put the training images and labels side by side")
    if (paths[2] is None) != (paths[3] is None):
        raise _fail(folder, "only one of the t10k-* files", "give both test files, or neither")
    splits = []
    for images, labels in ((paths[0], paths[1]), (paths[2], paths[3])):
        if images is None or labels is None:
            splits.append(None)
            continue
        x, y = _read_idx_checked(images, 3), _read_idx_checked(labels, 1)
        if len(x) != len(y):
            raise _fail(
                images,
                f"{len(x)} images but {labels.name} has {len(y)} labels",
                "use files that belong together",
            )
        splits.append((_inputs(x[:, None], images, normalize), torch.from_numpy(y.astype(np.int64))))
    train, test = splits
    assert train is not None
    out = NodeFiles(folder, "idx", *train)
    if test is not None:
        out.test_x, out.test_y = test
    return out


def _class_label(name: str, classes: Sequence[str] | None, where: Path) -> int:
    if classes:
        if name not in classes:
            raise _fail(
                where,
                f"class folder {name!r} is not one of the classes {list(classes)}",
                "rename it, or add it to the federation's class list (run config data-classes)",
            )
        return list(classes).index(name)
    if name.isdigit():
        return int(name)
    raise _fail(
        where,
        f"class folder {name!r} is not a label number",
        "name class folders 0, 1, ... or give the class names in label order (run config data-classes)",
    )


def _read_tree(
    root: Path, classes: Sequence[str] | None, normalize: tuple[float, float] | None
) -> tuple[Tensor, Tensor]:
    from PIL import Image, UnidentifiedImageError

    images, labels = [], []
    shape: tuple[int, ...] | None = None
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        label = _class_label(folder.name, classes, folder)
        for path in sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES):
            try:
                with Image.open(path) as img:
                    mode = "L" if img.mode in ("1", "L", "I;16", "I", "F") else "RGB"
                    arr = np.asarray(img.convert(mode))
            except (OSError, UnidentifiedImageError, ValueError) as err:
                line = (str(err).strip().splitlines() or [type(err).__name__])[0]
                raise _fail(path, f"cannot read the image ({line})", "replace or remove it") from None
            arr = arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)
            if shape is None:
                shape = arr.shape
            elif arr.shape != shape:
                raise _fail(
                    path,
                    f"an image of shape {list(arr.shape)} among images of {list(shape)}",
                    "give all images one size",
                )
            images.append(arr)
            labels.append(label)
    if not images:
        raise _fail(
            root,
            "no images in its class folders",
            f"put images ({', '.join(IMAGE_SUFFIXES)}) in <class>/ folders",
        )
    return _inputs(np.stack(images), root, normalize), torch.tensor(labels, dtype=torch.int64)


def _read_image_folder(
    folder: Path, classes: Sequence[str] | None, normalize: tuple[float, float] | None
) -> NodeFiles:
    train_root = folder / "train" if (folder / "train").is_dir() else folder
    x, y = _read_tree(train_root, classes, normalize)
    out = NodeFiles(folder, "image-folder", x, y)
    if train_root != folder and (folder / "test").is_dir():
        out.test_x, out.test_y = _read_tree(folder / "test", classes, normalize)
        if out.test_x.shape[1:] != x.shape[1:]:
            raise _fail(
                folder / "test",
                f"images of shape {list(out.test_x.shape[1:])}",
                f"give them the training images' {list(x.shape[1:])}",
            )
    return out


def read_node_files(
    folder: str | Path,
    classes: Sequence[str] | None = None,
    normalize: tuple[float, float] | None = None,
) -> NodeFiles:
    """The samples of a node's data folder (see the module's docstring for the layouts).

    Args:
        folder: The node's data folder (``flower-supernode --node-config 'data-dir="..."'``).
        classes: Class names in label order, for an image-folder tree with named class folders.
        normalize: ``(mean, std)`` applied to every input after bytes are scaled to [0, 1].

    Raises:
        ConfigError: One line naming the folder or file and the fix.
    """
    where = Path(folder).expanduser()
    if not where.is_dir():
        what = "is a file, not a folder" if where.exists() else "does not exist"
        raise _fail(
            where, what, "give the SuperNode the folder that holds its data (--node-config data-dir=...)"
        )
    try:
        entries = sorted(where.iterdir())
    except OSError as err:
        raise _fail(
            where, f"cannot be read ({err.strerror or err})", "let the SuperNode's user read it"
        ) from None
    arrays = [p for p in entries if p.suffix == ".npz" and p.is_file()]
    if len(arrays) > 1:
        raise _fail(where, f"{len(arrays)} .npz files ({arrays[0].name}, {arrays[1].name}, ...)", "keep one")
    if arrays:
        return _read_npz(arrays[0], normalize)
    if any(
        p.name.startswith("train-images-idx3-ubyte") or p.name.startswith("train-labels-idx1-ubyte")
        for p in entries
    ):
        return _read_idx(where, normalize)
    if any(p.is_dir() for p in entries):
        return _read_image_folder(where, classes, normalize)
    raise _fail(where, "holds none of the data layouts", "give it " + "; or ".join(LAYOUTS))
