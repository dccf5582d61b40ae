"""Characters as model inputs: LEAF's Shakespeare vocabulary and its next-character windows.

LEAF (Caldas et al., "LEAF: A Benchmark for Federated Settings", 2018) turns each speaking role's text
into samples ``(x, y)``: ``x`` the 80 characters at positions ``i .. i+79``, ``y`` the character at ``i + 80``
(``data/shakespeare/preprocess/shake_utils.py``), over the vocabulary of ``models/utils/language_utils.py``
(:data:`LEAF_LETTERS`, 80 symbols). A character outside it is looked up there with ``str.find``, which
gives ``-1``, i.e. the last row (``}``): here it is mapped to that index, :data:`OOV`, on purpose.

Windows are stored as ``uint8`` indices (one byte per character); networks that embed them (``CharLSTM``)
read them as ``long``.
"""

from __future__ import annotations

import re

import numpy as np

__all__ = ["LEAF_LETTERS", "OOV", "SEQ_LEN", "encode", "leaf_text", "windows"]

#: LEAF's Shakespeare vocabulary (``ALL_LETTERS`` of ``models/utils/language_utils.py``), in index order.
LEAF_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
#: Index of a character outside the vocabulary (LEAF's ``find`` gives -1: the last symbol).
OOV = len(LEAF_LETTERS) - 1
#: LEAF's window length.
SEQ_LEN = 80


class _Table(dict):
    """``str.translate`` table: a vocabulary character to its index (a code point), anything else to OOV."""

    def __missing__(self, key: int) -> int:
        return OOV


_TABLE = _Table({ord(ch): i for i, ch in enumerate(LEAF_LETTERS)})


def encode(text: str) -> np.ndarray:
    """``uint8`` vocabulary indices of ``text`` (characters outside :data:`LEAF_LETTERS` are :data:`OOV`)."""
    return np.frombuffer(text.translate(_TABLE).encode("latin-1"), dtype=np.uint8)


def leaf_text(lines: list[str]) -> str:
    """A role's lines joined as LEAF does: each line ends with a newline, newlines become spaces, and runs
    of two or more spaces become one (``shake_utils.__txt_to_data``)."""
    return re.sub(r"  +", " ", "".join(f"{line}\n" for line in lines).replace("\n", " "))


def windows(codes: np.ndarray, seq_len: int = SEQ_LEN) -> tuple[np.ndarray, np.ndarray]:
    """LEAF's next-character samples of one text.

    ``x[i] = codes[i : i + seq_len]`` and ``y[i] = codes[i + seq_len]`` for ``i`` in
    ``0 .. len - seq_len - 1`` (no sample for a text of at most ``seq_len`` characters).

    Returns:
        ``(x, y)``: ``uint8 [n, seq_len]`` (a copy) and ``int64 [n]``.
    """
    n = len(codes) - seq_len
    if n <= 0:
        return np.zeros((0, seq_len), dtype=np.uint8), np.zeros(0, dtype=np.int64)
    x = np.lib.stride_tricks.sliding_window_view(codes[:-1], seq_len)[:n].copy()
    return x, codes[seq_len:].astype(np.int64)
