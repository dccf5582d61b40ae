"""FLAIR (Song et al., NeurIPS 2022): Flickr images of many users with 17 coarse multilabel targets.

**File layout** read here: the federated HDF5 file written by ``prepare_dataset.py`` of
``apple/ml-flair`` (about 80 GB for the full dataset), one group per split and user::

    /{split}/{user_id}/images               uint8 [n, H, W, 3]   (H = W = 256 in the release)
    /{split}/{user_id}/labels               n byte strings, coarse labels joined by "|"
    /{split}/{user_id}/fine_grained_labels  n byte strings (not used here)
    /{split}/{user_id}/image_ids            n byte strings
    /metadata/label_counter                 JSON {label: count}

with ``split`` in ``train``, ``val``, ``test`` (user-disjoint, 41,131 / 5,141 / 5,142 users). Label ``c``
is the ``c``-th of the 17 coarse label names in sorted order (:data:`FLAIR_LABELS`), as in the release's
``label_to_index.json``. Users are read in sorted order of their ids, images in stored order.

**Memory.** The whole release as normalised ``float32`` tensors would need about 272 GB for the
training split at 256×256 (and 35 GB for the test split), so it is not loaded as is. FedCOG's setup
uses 200 training users (about 1,700 images, 1.3 GB as floats at 256×256): :func:`prepare_flair_cache`
writes such a subset (sampled users, optionally resized images, optionally a subsample of the test
split) as a small HDF5 file **in the same layout**, and the ``flair`` dataset loads a file of that
layout entirely into memory (``recipes/fedcog/prepare_flair.py`` is its command line). The loader logs
the size it is about to allocate.

**Natural partition.** ``data.dataset: flair`` with ``data.partition: NaturalUsers`` makes every
user of the file one client (``data.num_clients`` of them, sampled with ``data.seed`` if the file holds
more users); the federation's clients are then sampled per round with ``model.clients_per_round``
(FedCOG: 200 clients, 10 per round). The loader tells each training image's user
(:class:`~fl_lightning.data.datasets.DatasetSplits` ``train_users``); configs that give the partitioner
the file itself (``NaturalUsers(path)``, the same as ``data.root``) read the users' image counts from it.

``h5py`` is an optional dependency (``pip install fl_lightning[flair]``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from fl_lightning.data.datasets import DatasetSource, DatasetSplits, channel_stats_uint8, normalise
from fl_lightning.data.flair_file import (
    DEFAULT_FILE,
    REMAKE,
    flair_file,
    h5py_module,
    open_flair,
    split_group,
    user_arrays,
    user_sizes,
)
from fl_lightning.data.partition import dirichlet_partition, iid_partition
from fl_lightning.errors import ConfigError

log = logging.getLogger(__name__)

#: The 17 coarse FLAIR labels in index order (sorted names, as the release's ``label_to_index.json``).
FLAIR_LABELS: tuple[str, ...] = (
    "animal",
    "art",
    "celebration",
    "equipment",
    "fire",
    "food",
    "games",
    "interior_room",
    "light",
    "liquid",
    "material",
    "music",
    "outdoor",
    "plant",
    "recreation",
    "religion",
    "structure",
)
SPLITS = ("train", "val", "test")
_DELIMITER = "|"


# ------------------------------------------------------------------------------------------ reading
def encode_labels(strings: Sequence[bytes | str], names: Sequence[str] = FLAIR_LABELS) -> np.ndarray:
    """Multi-hot ``uint8 [n, len(names)]`` targets from ``|``-joined label strings (empty: no label).

    Raises:
        ConfigError: For a label name that is not one of ``names``.
    """
    index = {name: i for i, name in enumerate(names)}
    out = np.zeros((len(strings), len(names)), dtype=np.uint8)
    for row, s in enumerate(strings):
        text = s.decode() if isinstance(s, bytes) else str(s)
        for name in filter(None, text.split(_DELIMITER)):
            if name not in index:
                raise ConfigError(
                    f"data.root: FLAIR label {name!r} is not one of the 17 coarse labels; the file must use "
                    "the coarse `labels` of the release"
                )
            out[row, index[name]] = 1
    return out


@dataclass
class FlairPart:
    """Images, targets and owners of one split (or a subset of its users).

    Attributes:
        images: ``uint8 [n, H, W, 3]``.
        labels: ``uint8 [n, 17]`` multi-hot coarse targets.
        users: User ids, in the order their images appear.
        owner: ``int64 [n]``: index into ``users`` of each image's user.
    """

    images: np.ndarray
    labels: np.ndarray
    users: list[str]
    owner: np.ndarray


def read_split(path: str | Path, split: str, users: Sequence[str] | None = None) -> FlairPart:
    """Read the images and coarse targets of ``users`` (default: all, sorted) of one split.

    Raises:
        ConfigError: If the file cannot be read, lacks the split, or a user's data does not have the
            release layout (``images`` uint8 ``[n, H, W, 3]`` of one size, ``n`` label strings).
    """
    with open_flair(path) as h5:
        group = split_group(h5, path, split)
        users = sorted(group.keys()) if users is None else list(users)
        images, labels, owner = [], [], []
        for i, user in enumerate(users):
            if user not in group:
                raise ConfigError(f"data.root: the FLAIR file {path} has no user '{user}' in '{split}'")
            x, y = user_arrays(h5, path, split, user)
            if images and x.shape[1:] != images[0].shape[1:]:
                raise ConfigError(
                    f"data.root: the FLAIR file {path}: /{split}/{user}/images are {list(x.shape[1:])} but "
                    f"earlier users' are {list(images[0].shape[1:])}; images must have one size; {REMAKE}"
                )
            images.append(np.asarray(x[()], dtype=np.uint8))
            labels.append(encode_labels(y[()]))
            owner.append(np.full(len(labels[-1]), i, dtype=np.int64))
    if not images:
        raise ConfigError(f"data.root: the '{split}' split of the FLAIR file {path} has no users")
    return FlairPart(np.concatenate(images), np.concatenate(labels), users, np.concatenate(owner))


def _to_normalised(images: np.ndarray, mean: np.ndarray, std: np.ndarray, chunk: int = 1024) -> torch.Tensor:
    """``uint8 [n, H, W, 3]`` -> normalised ``float32 [n, 3, H, W]``, converted chunk by chunk."""
    n, h, w, c = images.shape
    out = torch.empty((n, c, h, w), dtype=torch.float32)
    for start in range(0, n, chunk):
        block = torch.from_numpy(np.ascontiguousarray(images[start : start + chunk])).permute(0, 3, 1, 2)
        out[start : start + chunk] = normalise(block.to(torch.float32).div_(255.0), mean, std)
    return out


class Flair(DatasetSource):
    """FLAIR's train and test splits, 17 coarse labels (multilabel), from a file of the release layout.

    Loads every training user's images (``data.root``: the file or its folder; the client partition is the
    partitioner's job: ``NaturalUsers`` for one client per user) and the whole test split (other users),
    normalised per channel with the training images' mean and standard deviation. ``data.download`` is not
    supported (the release is downloaded and converted with ``apple/ml-flair``'s scripts).
    """

    registry_name = "flair"
    brings_users = True

    def load(self, root: Path, download: bool) -> DatasetSplits:
        return load_flair(root, download)


def load_flair(root: Path, download: bool) -> DatasetSplits:
    """The splits of :class:`Flair` from ``root`` (the file or its folder)."""
    if download:
        raise ConfigError(
            "data.download=true is not supported for data.dataset='flair'; download and convert it with "
            "apple/ml-flair (download_dataset.py, prepare_dataset.py), then set data.download=false"
        )
    path = flair_file(root)
    train, test = read_split(path, "train"), read_split(path, "test")
    floats = 4 * (train.images.size + test.images.size)
    log.info(
        "FLAIR: %d train / %d test images from %s (%.2f GB as float32)",
        len(train.labels),
        len(test.labels),
        path,
        floats / 1e9,
    )
    mean, std = channel_stats_uint8(train.images, channel_axis=3)
    return DatasetSplits(
        name="flair",
        task="multilabel",
        num_classes=len(FLAIR_LABELS),
        train_x=_to_normalised(train.images, mean, std),
        train_y=torch.from_numpy(train.labels.astype(np.int64)),
        test_x=_to_normalised(test.images, mean, std),
        test_y=torch.from_numpy(test.labels.astype(np.int64)),
        users=train.users,
        train_users=train.owner,  # the test users are other people: no per-user test data
    )


# ------------------------------------------------------------------------------------------ writing
UserData = tuple[np.ndarray, Sequence[str]]


def write_flair(path: str | Path, splits: Mapping[str, Mapping[str, UserData]]) -> None:
    """Write ``{split: {user_id: (uint8 images [n, H, W, 3], label strings)}}`` in the release layout.

    Label strings are ``|``-joined coarse label names. ``fine_grained_labels`` are written empty and
    ``image_ids`` as ``<user>_<i>``; ``/metadata/label_counter`` counts the coarse labels.
    """
    h5py = h5py_module()
    counter: dict[str, int] = {}
    with h5py.File(path, "w") as h5:
        for split, users in splits.items():
            for user, (images, label_strings) in users.items():
                strings = [s.decode() if isinstance(s, bytes) else str(s) for s in label_strings]
                for s in strings:
                    for name in filter(None, s.split(_DELIMITER)):
                        counter[name] = counter.get(name, 0) + 1
                h5[f"/{split}/{user}/labels"] = np.asarray(strings, dtype="S")
                h5[f"/{split}/{user}/fine_grained_labels"] = np.asarray([""] * len(strings), dtype="S")
                h5[f"/{split}/{user}/image_ids"] = np.asarray(
                    [f"{user}_{i}" for i in range(len(strings))], dtype="S"
                )
                h5.create_dataset(f"/{split}/{user}/images", data=np.asarray(images, dtype=np.uint8))
        h5["/metadata/label_counter"] = json.dumps(counter)


def resize_images(images: np.ndarray, size: int) -> np.ndarray:
    """Resize ``uint8 [n, H, W, 3]`` images to ``size`` x ``size`` (bilinear with antialiasing)."""
    if images.shape[1] == size and images.shape[2] == size:
        return images
    x = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float()
    y = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    return y.round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous().numpy()


def prepare_flair_cache(
    src: str | Path,
    dst: str | Path,
    num_users: int = 200,
    image_size: int | None = None,
    max_images_per_user: int | None = 512,
    max_test_images: int | None = None,
    seed: int = 0,
) -> dict[str, int]:
    """Write a small FLAIR file in the release layout: sampled training users and the test split.

    ``num_users`` training users are drawn uniformly without replacement (``seed``), each capped at
    ``max_images_per_user`` images (the FLAIR benchmark caps at 512); the test split is kept whole or
    subsampled to about ``max_test_images`` images (whole users, drawn at random); images are resized
    to ``image_size`` if given. Returns the numbers of users and images written per split.
    """
    h5py_module()  # a ConfigError before anything else if h5py is missing
    src = flair_file(src)
    rng = np.random.default_rng(seed)
    out: dict[str, dict[str, UserData]] = {"train": {}, "test": {}}
    with open_flair(src, "src") as h5:
        for split in ("train", "test"):
            if split not in h5:
                raise ConfigError(f"src: the FLAIR file {src} has no '{split}' split")
            users = sorted(h5[split].keys())
            if split == "train":
                if num_users > len(users):
                    raise ConfigError(
                        f"num_users={num_users} exceeds the {len(users)} training users of {src}"
                    )
                picked = [users[i] for i in np.sort(rng.choice(len(users), size=num_users, replace=False))]
                cap = max_images_per_user
            else:
                order = rng.permutation(len(users))
                picked, total = [], 0
                for i in order:
                    if max_test_images is not None and total >= max_test_images:
                        break
                    picked.append(users[i])
                    total += int(h5[split][users[i]]["images"].shape[0])
                picked.sort()
                cap = None
            for user in picked:
                x, y = user_arrays(h5, src, split, user, "src")
                images = np.asarray(x[:cap], dtype=np.uint8)
                strings = list(y[:cap])
                out[split][user] = (
                    images if image_size is None else resize_images(images, image_size),
                    strings,
                )
    write_flair(dst, out)
    return {
        f"{split}_{what}": (len(users) if what == "users" else sum(len(s) for _, s in users.values()))
        for split, users in out.items()
        for what in ("users", "images")
    }


def write_digits_as_flair(
    path: str | Path,
    num_users: int = 40,
    num_test_users: int = 10,
    image_size: int = 16,
    alpha: float = 0.5,
    seed: int = 0,
) -> dict[str, int]:
    """A small FLAIR-layout file made from scikit-learn's embedded digits, for CPU runs and tests.

    Each 8x8 digit is upscaled to ``image_size`` and tinted with a per-user colour (feature skew). An
    image of digit ``d`` carries the coarse labels ``FLAIR_LABELS[d]`` and ``FLAIR_LABELS[10 + d % 7]``
    (two positives, learnable, 17 labels in all). The training users split the digits' training part
    (the ``digits`` dataset's 80/20 split) with a Dirichlet(``alpha``) label skew and unequal sizes, the
    test users split the test part uniformly. Returns the image counts per split.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images / 16.0 * 255.0).round().astype(np.uint8)
    y = digits.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, stratify=y, random_state=0)
    rng = np.random.default_rng(seed)

    def users_of(xs: np.ndarray, ys: np.ndarray, parts: list[np.ndarray], prefix: str) -> dict[str, UserData]:
        users = {}
        for u, idx in enumerate(parts):
            tint = rng.uniform(0.5, 1.0, size=3)
            grey = torch.from_numpy(xs[idx]).float()[:, None]
            big = F.interpolate(grey, size=(image_size, image_size), mode="bilinear", align_corners=False)
            rgb = (big * torch.from_numpy(tint).float().view(1, 3, 1, 1)).round().clamp(0, 255)
            images = rgb.to(torch.uint8).permute(0, 2, 3, 1).numpy()
            strings = [f"{FLAIR_LABELS[d]}{_DELIMITER}{FLAIR_LABELS[10 + d % 7]}" for d in ys[idx]]
            users[f"{prefix}{u:04d}"] = (images, strings)
        return users

    train_parts = dirichlet_partition(y_tr, num_users, alpha, rng, min_size=5)
    test_parts = iid_partition(len(y_te), num_test_users, rng)
    write_flair(
        path, {"train": users_of(x_tr, y_tr, train_parts, "u"), "test": users_of(x_te, y_te, test_parts, "t")}
    )
    return {"train_images": int(sum(len(p) for p in train_parts)), "test_images": len(y_te)}


__all__ = [
    "DEFAULT_FILE",
    "FLAIR_LABELS",
    "Flair",
    "FlairPart",
    "encode_labels",
    "flair_file",
    "load_flair",
    "prepare_flair_cache",
    "read_split",
    "resize_images",
    "user_sizes",
    "write_digits_as_flair",
    "write_flair",
]
