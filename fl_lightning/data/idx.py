"""The IDX files of the MNIST family, read in one place (Fashion-MNIST's loader and a node's own files).

IDX: two zero bytes, a type byte (``0x08``: unsigned bytes), the number of dimensions, each dimension as a
big-endian 32-bit integer, then the values in C order; the files may be gzip-compressed (told by their
first bytes, whatever their suffix).
"""

from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path

import numpy as np

__all__ = ["IDX_FILES", "IdxError", "find_idx", "read_idx", "read_idx_pair"]

#: The four files of the MNIST family (without ``.gz``): train images, train labels, test images and labels.
IDX_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
_UBYTE = 0x08  # IDX type code of unsigned bytes, the only type the MNIST family uses
_GZIP_MAGIC = b"\x1f\x8b"


class IdxError(ValueError):
    """A file that is not a complete IDX file of unsigned bytes (the message says what is wrong)."""


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def read_idx(path: Path, ndim: int | None = None) -> np.ndarray:
    """The ``uint8`` array stored in an IDX file, gzip-compressed or not.

    Args:
        path: The file.
        ndim: The dimensions expected (3: images ``[N, H, W]``, 1: labels ``[N]``); None: any.

    Raises:
        IdxError: If the header is not that of an unsigned-byte IDX file, the data is shorter or longer
            than the header's dimensions say, the gzip stream is damaged, or the array has not ``ndim``
            dimensions.
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
            dims_bytes = f.read(4 * head[3])
            if len(dims_bytes) < 4 * head[3]:
                raise IdxError("truncated header")
            dims = struct.unpack(f">{head[3]}I", dims_bytes)
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
    if ndim is not None and out.ndim != ndim:
        what = "images [N, H, W]" if ndim == 3 else "labels [N]"
        raise IdxError(f"holds a {out.ndim}-d array where {ndim}-d {what} are expected")
    return out


def find_idx(folder: Path, name: str) -> Path | None:
    """``folder/name`` or ``folder/name.gz``, whichever exists first (the uncompressed file is quicker)."""
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None


def read_idx_pair(images: Path, labels: Path) -> tuple[np.ndarray, np.ndarray]:
    """Images ``uint8 [N, H, W]`` and labels ``uint8 [N]`` of two files that belong together.

    Raises:
        IdxError: As :func:`read_idx` (the message starts with the file's path), or when the counts differ.
        OSError: If a file cannot be opened.
    """
    arrays = []
    for path, ndim in ((images, 3), (labels, 1)):
        try:
            arrays.append(read_idx(path, ndim))
        except IdxError as e:
            raise IdxError(f"{path}: {e}") from None
    x, y = arrays
    if len(x) != len(y):
        raise IdxError(f"{images} has {len(x)} images but {labels} has {len(y)} labels")
    return x, y
