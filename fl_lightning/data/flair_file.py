"""The FLAIR HDF5 file's users: where the file is and how many images each user has.

The part of the FLAIR reader (:mod:`fl_lightning.data.flair`) that the ``NaturalUsers`` partition also
needs (its ``path`` mode reads the users' image counts), so that neither imports the other. ``h5py`` is an
optional dependency (``pip install fl_lightning[flair]``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from lightning_utilities.core.imports import RequirementCache

from fl_lightning.errors import ConfigError

__all__ = [
    "DEFAULT_FILE",
    "REMAKE",
    "flair_file",
    "h5py_module",
    "open_flair",
    "split_group",
    "user_arrays",
    "user_sizes",
]

#: File looked up under ``data.root`` when it is a folder (the name used in ``apple/ml-flair``'s README).
DEFAULT_FILE = "flair_federated.hdf5"
_H5PY = RequirementCache("h5py")


def h5py_module() -> ModuleType:
    if not _H5PY:
        raise ConfigError(
            f"data.dataset='flair' needs h5py ({_H5PY}); install it with `pip install h5py` "
            "or `pip install fl_lightning[flair]`"
        )
    import h5py

    return h5py


def flair_file(root: str | Path) -> Path:
    """The FLAIR HDF5 file: ``root`` itself if it is a file, else ``root/flair_federated.hdf5``.

    Raises:
        ConfigError: If neither exists.
    """
    root = Path(root).expanduser()
    path = root if root.is_file() else root / DEFAULT_FILE
    if not path.is_file():
        raise ConfigError(
            f"data.root='{root}' holds no FLAIR HDF5 file (looked for {path}); point data.root at the file "
            "written by apple/ml-flair's prepare_dataset.py or by recipes/fedcog/prepare_flair.py"
        )
    return path


REMAKE = "re-create it with recipes/fedcog/prepare_flair.py or apple/ml-flair's prepare_dataset.py"


@contextlib.contextmanager
def open_flair(path: str | Path, field: str = "data.root") -> Iterator[Any]:
    """Open a FLAIR file for reading; a missing, truncated, non-HDF5 or unreadable file is a ConfigError."""
    h5py = h5py_module()
    try:
        with h5py.File(path, "r") as h5:
            yield h5
    except OSError as err:
        msg = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConfigError(f"{field}: cannot read the FLAIR file {path} as HDF5 ({msg}); {REMAKE}") from None


def user_arrays(
    h5: Any, path: str | Path, split: str, user: str, field: str = "data.root"
) -> tuple[Any, Any]:
    """The ``images`` and ``labels`` datasets of one user, checked against the release layout."""
    h5py = h5py_module()
    where = f"{field}: the FLAIR file {path}: /{split}/{user}"
    node = h5[split][user]
    if not isinstance(node, h5py.Group):
        raise ConfigError(f"{where} is not a group with 'images' and 'labels'; {REMAKE}")
    for name in ("images", "labels"):
        if not isinstance(node.get(name), h5py.Dataset):
            raise ConfigError(f"{where} has no '{name}' dataset; {REMAKE}")
    images, labels = node["images"], node["labels"]
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[3] != 3:
        raise ConfigError(
            f"{where}/images is {images.dtype} {list(images.shape)}, expected uint8 [n, H, W, 3]; {REMAKE}"
        )
    if labels.dtype.kind not in "SOU" or labels.shape != (images.shape[0],):
        raise ConfigError(
            f"{where}/labels is {labels.dtype} {list(labels.shape)}, expected {images.shape[0]} label "
            f"strings (one per image); {REMAKE}"
        )
    return images, labels


def split_group(h5: Any, path: str | Path, split: str, field: str = "data.root") -> Any:
    if split not in h5:
        raise ConfigError(f"{field}: the FLAIR file {path} has no '{split}' split (found {sorted(h5)})")
    return h5[split]


def user_sizes(path: str | Path, split: str, field: str = "data.root") -> list[tuple[str, int]]:
    """``(user_id, number of images)`` of every user of ``split``, sorted by user id.

    Raises:
        ConfigError: If the file cannot be read or does not have the release layout (naming ``field``).
    """
    with open_flair(path, field) as h5:
        group = split_group(h5, path, split, field)
        return [(u, int(user_arrays(h5, path, split, u, field)[0].shape[0])) for u in sorted(group.keys())]
