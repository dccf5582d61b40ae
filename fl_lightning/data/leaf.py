"""LEAF's federated datasets read from the JSON files its preprocessing writes (no download here).

``data.dataset: leaf`` with ``data.root`` = LEAF's ``data/<name>/data`` folder after ``preprocess.sh``
(TalwalkarLab/leaf) reads every ``*.json`` of its ``train/`` and ``test/`` subfolders (sorted by name)::

    {"users": [u, ...], "num_samples": [n, ...], "user_data": {u: {"x": [...], "y": [...]}, ...}}

``data.dataset: Leaf`` (former spelling: ``leaf`` with ``data.leaf.*``). Each user is one of the dataset's own
users (``data.partition: NaturalUsers``: one client per user). With LEAF's by-sample split (``-t sample``,
the default) every user has train and test data, and a client's local test split is its user's test data;
with the by-user split (``-t user``) the test users are others, the test set is only the global one, and
``data.local_test_fraction`` carves local test splits as usual (one line says so). Nothing is decided
silently in between: a training user without test data is left out of client evaluation (``personal/*``,
``z_client/*``), never scored on its training data, and a user present only in the test files keeps its
samples in the global test set while the other users keep their own test data; the run says how many of
each in one line.

Which dataset the files hold is told by their samples (or ``data.dataset.name``):

=============  ===========================================  ======================================  =======
name           ``x`` in the JSON                            tensor here                             classes
=============  ===========================================  ======================================  =======
femnist        784 floats in [0, 1] (28x28 grey, flattened)  ``float32 [N, 1, 28, 28]``, normalised   62
shakespeare    a string of 80 characters                    ``uint8 [N, 80]`` LEAF vocabulary ids   80
sent140        ``[id, date, query, user, text]``            ``int64 [N, 25]`` word ids (below)      2
celeba         an image file name                           ``float32 [N, 3, 84, 84]``, normalised  2
synthetic      a vector of floats                           ``float32 [N, D]`` as stored            max+1
=============  ===========================================  ======================================  =======

**Sent140's tokens** (a choice: LEAF's models need GloVe embeddings, which no machine here can fetch): a
tweet is split into words as LEAF's ``language_utils.split_line`` does (``[\\w']+|[.,!?;]``), the first
``max_words`` (25, LEAF's ``line_to_indices``) become ids in a vocabulary of the ``vocab_size`` (10,000)
most frequent words of the training tweets (ties in order of first appearance), and a word outside it and
the padding share the id ``vocab_size`` (as in LEAF, where both are ``len(word2id)``). ``LogisticRegression``
reads such ids as a bag of words (multinomial logistic regression on word counts), ``CharLSTM`` embeds them.

**CelebA's images** are read from LEAF's raw image folder, ``<data.root>/raw/img_align_celeba/`` (or
``data.dataset.image_root``), and resized to 84x84 RGB as LEAF's CNN does.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from fl_lightning.data.datasets import DatasetSource, DatasetSplits, normalise, uint8_to_normalised
from fl_lightning.data.text import LEAF_LETTERS, OOV, encode
from fl_lightning.errors import ConfigError

__all__ = [
    "KINDS",
    "Leaf",
    "LeafSplit",
    "guess_kind",
    "leaf_splits",
    "read_leaf_folder",
    "sent140_tokens",
    "split_line",
]

log = logging.getLogger(__name__)

NAME = "leaf"
KINDS = ("femnist", "shakespeare", "sent140", "celeba", "synthetic")
_WORDS = re.compile(r"[\w']+|[.,!?;]")
_REMAKE = "re-create it with LEAF's preprocess.sh"


class Leaf(DatasetSource):
    """LEAF's federated datasets from the JSON files of its preprocessing in ``data.root`` (see the module).

    ``data.download`` is not supported: LEAF's ``preprocess.sh`` downloads and converts the data.

    Args:
        name: Which LEAF dataset the files hold; None: told by the samples.
        image_root: CelebA's image folder; None: ``<data.root>/raw/img_align_celeba`` (LEAF's layout).
        image_size: CelebA images are resized to this square size (LEAF: 84).
        vocab_size: Sent140: the most frequent training words kept.
        max_words: Sent140: words per tweet (LEAF: 25).
    """

    registry_name = NAME
    brings_users = True
    former_options = ("leaf", "LeafData")

    def __init__(
        self,
        name: Literal["femnist", "shakespeare", "sent140", "celeba", "synthetic"] | None = None,
        image_root: str | None = None,
        image_size: int = 84,
        vocab_size: int = 10_000,
        max_words: int = 25,
    ) -> None:
        if name is not None and name not in KINDS:
            raise ConfigError(f"data.dataset.name={name!r} must be one of {', '.join(KINDS)} (or null)")
        for field, value in (
            ("image_size", image_size),
            ("vocab_size", vocab_size),
            ("max_words", max_words),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"data.dataset.{field}={value!r} must be an integer >= 1")
        self.name = name
        self.image_root = image_root
        self.image_size = image_size
        self.vocab_size = vocab_size
        self.max_words = max_words

    def load(self, root: Path, download: bool) -> DatasetSplits:
        if download:
            raise ConfigError(
                "data.download=true is not supported for data.dataset=Leaf; run LEAF's preprocess.sh for the "
                "dataset, then point data.root at its data/<name>/data folder"
            )
        return leaf_splits(root, self)


@dataclass
class LeafSplit:
    """One split's users and samples, as read (``x`` and ``y`` as in the JSON, in user order).

    Attributes:
        users: User ids in order of appearance (files sorted by name).
        x, y: Every sample's input and label.
        owner: ``int64 [N]``: index into ``users`` of each sample's user.
    """

    users: list[str]
    x: list[Any]
    y: list[Any]
    owner: np.ndarray


def _load_json(path: Path) -> dict[str, Any]:
    try:
        with open(path) as f:
            data = json.load(f)
    except json.JSONDecodeError as err:
        raise ConfigError(
            f"data.root: {path} is not valid JSON (line {err.lineno}, column {err.colno}: {err.msg}); "
            f"{_REMAKE}"
        ) from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"data.root: cannot read {path} ({err}); {_REMAKE}") from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"data.root: {path} holds a JSON {type(data).__name__}, not LEAF's object; {_REMAKE}"
        )
    return data


def _read_file(path: Path, users: list[str], xs: list[Any], ys: list[Any], owners: list[np.ndarray]) -> None:
    data = _load_json(path)
    for key, kind in (("users", list), ("user_data", dict)):
        if not isinstance(data.get(key), kind):
            what = "has no" if key not in data else f"has a {type(data[key]).__name__} as"
            raise ConfigError(
                f"data.root: {path} {what} '{key}' (LEAF's layout: users, num_samples, user_data); {_REMAKE}"
            )
    for user in data["users"]:
        entry = data["user_data"].get(user)
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("x"), list)
            or not isinstance(entry.get("y"), list)
        ):
            raise ConfigError(
                f"data.root: {path}: user_data['{user}'] needs 'x' and 'y' lists (the user is in 'users'); "
                f"{_REMAKE}"
            )
        if len(entry["x"]) != len(entry["y"]):
            raise ConfigError(
                f"data.root: {path}: user_data['{user}'] has {len(entry['x'])} 'x' but "
                f"{len(entry['y'])} 'y'; "
                f"{_REMAKE}"
            )
        bad = next((v for v in entry["y"] if not _is_label(v)), None)
        if bad is not None:
            raise ConfigError(
                f"data.root: {path}: user_data['{user}']['y'] holds {bad!r}, not a class number (or, for "
                f"Shakespeare, a character); {_REMAKE}"
            )
        owners.append(np.full(len(entry["y"]), len(users), dtype=np.int64))
        users.append(str(user))
        xs += entry["x"]
        ys += entry["y"]


def _is_label(v: Any) -> bool:
    if isinstance(v, str):
        return len(v) == 1
    return isinstance(v, (int, float)) and not isinstance(v, bool) and float(v).is_integer()


def read_leaf_folder(folder: Path) -> LeafSplit:
    """Every user of the ``*.json`` files of ``folder`` (sorted by name).

    Raises:
        ConfigError: Naming the file and the key, for a file that is not JSON or not LEAF's layout.
    """
    users: list[str] = []
    xs: list[Any] = []
    ys: list[Any] = []
    owners: list[np.ndarray] = []
    for path in sorted(folder.glob("*.json")):
        _read_file(path, users, xs, ys, owners)
    owner = np.concatenate(owners) if owners else np.zeros(0, dtype=np.int64)
    return LeafSplit(users, xs, ys, owner)


def _folder(root: Path, split: str) -> Path:
    folder = root / split
    if not root.is_dir() or not folder.is_dir() or not any(folder.glob("*.json")):
        raise ConfigError(
            f"data.root='{root}' is not a LEAF data folder: {folder} has no .json files; point data.root at "
            "LEAF's data/<name>/data folder (with train/ and test/) after running its preprocess.sh"
        )
    return folder


def guess_kind(x: Any) -> str:
    """Which LEAF dataset a sample's ``x`` comes from (see the module's table)."""
    if isinstance(x, str):
        return "celeba" if x.lower().endswith((".jpg", ".jpeg", ".png")) else "shakespeare"
    if isinstance(x, list) and len(x) == 5 and all(isinstance(v, str) for v in x):
        return "sent140"
    if isinstance(x, list) and len(x) == 784 and all(isinstance(v, (int, float)) for v in x):
        return "femnist"
    if isinstance(x, list) and x and all(isinstance(v, (int, float)) for v in x):
        return "synthetic"
    raise ConfigError(
        f"data.root: a sample's x ({str(x)[:60]}) is not one of LEAF's datasets ({', '.join(KINDS)}); "
        "set data.dataset.name"
    )


def split_line(line: str) -> list[str]:
    """LEAF's ``language_utils.split_line``: words (with apostrophes) and the punctuation ``.,!?;``."""
    return _WORDS.findall(line)


def sent140_tokens(
    train: list[str], test: list[str], vocab_size: int, max_words: int
) -> tuple[np.ndarray, np.ndarray]:
    """Word ids ``int64 [n, max_words]`` of the training and test tweets (see the module docstring)."""
    words = [split_line(t) for t in train]
    counts = Counter(w for ws in words for w in ws)
    index = {w: i for i, (w, _) in enumerate(counts.most_common(vocab_size))}

    def ids(tweets: list[list[str]]) -> np.ndarray:
        out = np.full((len(tweets), max_words), vocab_size, dtype=np.int64)
        for row, ws in enumerate(tweets):
            got = [index.get(w, vocab_size) for w in ws[:max_words]]
            out[row, : len(got)] = got
        return out

    return ids(words), ids([split_line(t) for t in test])


def _labels(ys: list[Any], num_classes: int | None, path: Path, kind: str) -> np.ndarray:
    try:
        y = np.asarray([int(float(v)) for v in ys], dtype=np.int64)
    except (TypeError, ValueError):
        raise ConfigError(f"data.root: {path}: a 'y' of {kind} is not a class number; {_REMAKE}") from None
    if y.size and (y.min() < 0 or (num_classes is not None and y.max() >= num_classes)):
        raise ConfigError(
            f"data.root: {path}: a 'y' is {int(y.min()) if y.min() < 0 else int(y.max())}, outside "
            f"0..{(num_classes or 1) - 1} for {kind}; {_REMAKE}"
        )
    return y


def _floats(xs: list[Any], width: int | None, path: Path, kind: str) -> np.ndarray:
    try:
        x = np.asarray(xs, dtype=np.float32)
    except (TypeError, ValueError):
        raise ConfigError(
            f"data.root: {path}: the 'x' of {kind} are not equal-length number lists; {_REMAKE}"
        ) from None
    if x.ndim != 2 or (width is not None and x.shape[1] != width):
        raise ConfigError(
            f"data.root: {path}: the 'x' of {kind} have shape {list(x.shape)}, expected [n, {width or 'D'}]; "
            f"{_REMAKE}"
        )
    return x


def _windows(part: LeafSplit, path: Path) -> torch.Tensor:
    codes = [encode(str(x)) for x in part.x]
    if len({len(c) for c in codes}) > 1:
        raise ConfigError(f"data.root: {path}: the 'x' of shakespeare are not all of one length; {_REMAKE}")
    return torch.from_numpy(np.stack(codes) if codes else np.zeros((0, 80), dtype=np.uint8))


def _images(names: list[str], folder: Path, size: int) -> np.ndarray:
    from PIL import Image

    out = np.empty((len(names), size, size, 3), dtype=np.uint8)
    for i, name in enumerate(names):
        path = folder / name
        try:
            with Image.open(path) as img:
                out[i] = np.asarray(img.convert("RGB").resize((size, size)))
        except OSError as err:
            raise ConfigError(
                f"data.dataset.image_root: cannot read the CelebA image {path} ({err})"
            ) from None
    return out


def leaf_splits(root: Path, options: Leaf | None = None) -> DatasetSplits:
    """The LEAF dataset in ``root`` (``train/`` and ``test/`` JSON files) as tensors with its users.

    Users in both splits have their own test data (``test_users``); a user only in the test files keeps its
    samples in the global test set (its rows of ``test_users`` are -1) and a training user without test
    samples has no rows there; each case is one warning line. When no test user is a training user (LEAF's
    by-user split) ``test_users`` is None: the test files are the global test set only (one line).
    """
    options = options or Leaf()
    train_dir, test_dir = _folder(root, "train"), _folder(root, "test")
    train, test = read_leaf_folder(train_dir), read_leaf_folder(test_dir)
    if not train.y:
        raise ConfigError(f"data.root: the JSON files of {train_dir} hold no samples; {_REMAKE}")
    kind = options.name or guess_kind(train.x[0])
    vocab_size = None
    if kind == "femnist":
        num_classes = 62
        tr, te = (
            _floats(s.x, 784, d, kind).reshape(-1, 1, 28, 28)
            for s, d in ((train, train_dir), (test, test_dir))
        )
        mean, std = np.array([tr.mean()]), np.array([tr.std()])
        train_x = normalise(torch.from_numpy(tr), mean, std)
        test_x = normalise(torch.from_numpy(te), mean, std)
    elif kind == "shakespeare":
        num_classes = vocab_size = len(LEAF_LETTERS)
        train_x, test_x = (_windows(part, d) for part, d in ((train, train_dir), (test, test_dir)))
        for part in (train, test):
            part.y = [int(encode(str(c))[0]) if len(str(c)) == 1 else OOV for c in part.y]
    elif kind == "sent140":
        num_classes = 2
        texts = [
            [str(x[4]) if isinstance(x, list) and len(x) > 4 else str(x) for x in s.x] for s in (train, test)
        ]
        tr_ids, te_ids = sent140_tokens(texts[0], texts[1], options.vocab_size, options.max_words)
        train_x, test_x = torch.from_numpy(tr_ids), torch.from_numpy(te_ids)
        vocab_size = options.vocab_size + 1
    elif kind == "celeba":
        num_classes = 2
        folder = (
            Path(options.image_root).expanduser() if options.image_root else root / "raw" / "img_align_celeba"
        )
        if not folder.is_dir():
            raise ConfigError(
                f"data.dataset.image_root: no CelebA image folder {folder}; put LEAF's raw images there "
                "(data/celeba/data/raw/img_align_celeba) or set data.dataset.image_root"
            )
        tr, te = (_images([str(n) for n in s.x], folder, options.image_size) for s in (train, test))
        train_x, test_x = uint8_to_normalised(tr, te, channels_last=True)
    elif kind == "synthetic":
        width = len(train.x[0])
        train_x = torch.from_numpy(_floats(train.x, width, train_dir, kind))
        test_x = torch.from_numpy(_floats(test.x, width, test_dir, kind))
        num_classes = 1 + max(int(float(v)) for v in [*train.y, *test.y])
    else:
        raise ConfigError(f"data.dataset.name={kind!r} must be one of {', '.join(KINDS)}")
    train_y = _labels(train.y, num_classes, train_dir, kind)
    test_y = _labels(test.y, num_classes, test_dir, kind)
    index = {u: i for i, u in enumerate(train.users)}
    owners = np.asarray([index.get(u, -1) for u in test.users], dtype=np.int64)
    per_user = bool((owners >= 0).any())
    log.info(
        "leaf %s: %d users, %d train / %d test samples (%s test users)",
        kind,
        len(train.users),
        len(train_y),
        len(test_y),
        "the same" if per_user else "other",
    )
    test_users = owners[test.owner] if len(test.owner) else np.zeros(0, dtype=np.int64)
    if not per_user and test.users:
        log.warning(
            "leaf: none of the %d test users is a training user (LEAF's by-user split): the test files are "
            "the global test set only, and each client's local test split is data.local_test_fraction of its "
            "training data",
            len(test.users),
        )
    elif per_user:
        only_test = [u for u, o in zip(test.users, owners) if o < 0]
        if only_test:
            log.warning(
                "leaf: %d user(s) appear only in the test files (%d samples, e.g. %r): their samples stay in "
                "the global test set and belong to no client; the other users keep their own test data",
                len(only_test),
                int((test_users < 0).sum()),
                only_test[0],
            )
        untested = len(train.users) - len(np.unique(test_users[test_users >= 0]))
        if untested:
            log.warning(
                "leaf: %d of the %d training users have no test data: they are left out of client "
                "evaluation (personal/*, z_client/*), not scored on their training data",
                untested,
                len(train.users),
            )
    return DatasetSplits(
        name=f"leaf:{kind}",
        task="multiclass",
        num_classes=int(num_classes),
        train_x=train_x,
        train_y=torch.from_numpy(train_y),
        test_x=test_x,
        test_y=torch.from_numpy(test_y),
        vocab_size=vocab_size,
        users=list(train.users),
        train_users=train.owner,
        test_users=test_users if per_user else None,
    )
