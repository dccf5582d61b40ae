"""The natural partition: one client per user of a dataset that brings its own users."""

from __future__ import annotations

import numpy as np

from fl_lightning.data.flair_file import flair_file, user_sizes
from fl_lightning.data.partition.base import Partitioner
from fl_lightning.errors import ConfigError


def natural_user_partition(
    owners: np.ndarray, num_users: int, num_clients: int, rng: np.random.Generator, dataset: str = ""
) -> tuple[list[np.ndarray], np.ndarray]:
    """One client per user: the positions of each chosen user's samples in ``owners``.

    Users without samples (e.g. all held out for validation) are left out. With fewer clients than users,
    ``num_clients`` users are drawn without replacement; clients are numbered in user order.

    Args:
        owners: ``[N]`` index of each sample's user, in ``0..num_users-1``.
        num_users: Number of users of the dataset.
        num_clients: Number of clients ``m`` (``data.num_clients``).
        rng: Source of randomness (which users, when ``m`` is below the number of users).
        dataset: The dataset's name, for the error message.

    Returns:
        ``(parts, users)``: ``m`` sorted int64 index arrays into ``owners`` and the chosen users' indices.

    Raises:
        ConfigError: If ``m`` exceeds the number of users with samples (the message says what to set).
    """
    owners = np.asarray(owners, dtype=np.int64)
    counts = np.bincount(owners, minlength=num_users)
    available = np.flatnonzero(counts)
    if num_clients > len(available):
        of = f" of {dataset!r}" if dataset else ""
        raise ConfigError(
            f"data.num_clients={num_clients} disagrees with the {len(available)} users{of}: NaturalUsers "
            "makes "
            f"one client per user; set data.num_clients={len(available)} (or leave it unset), or fewer for a "
            "random sample of users"
        )
    if num_clients == len(available):
        chosen = available
    else:
        chosen = np.sort(rng.choice(available, size=num_clients, replace=False))
    order = np.argsort(owners, kind="stable")
    bounds = np.searchsorted(owners[order], np.arange(num_users + 1))
    parts = [np.sort(order[bounds[u] : bounds[u + 1]]).astype(np.int64) for u in chosen]
    return parts, chosen


# ---------------------------------------------------------------------------------- configurable classes
class NaturalUsers(Partitioner):
    """One client per user of a dataset that brings its own users (the natural partition).

    ``shakespeare`` (a play's speaking role), ``leaf`` (LEAF's users), ``fedprox_synthetic`` (a device) and
    ``flair`` (a Flickr user) tell each training sample's user; the data module gives client ``k`` the
    samples of the ``k``-th chosen user (:func:`natural_user_partition`) and, where the users have their
    own test data (LEAF's per-user split), that user's test samples as the client's local test split.
    ``data.num_clients`` unset means one client per user; fewer draws a seeded sample of users; more is
    an error saying how many there are. A dataset without users is a one-line error.

    Args:
        path: Only for FLAIR configs that name the file: the FLAIR HDF5 file (or its folder), the same as
            ``data.root``; the users' image counts are read from it (the training samples are ordered by
            user). None (default): the dataset's own users.
    """

    name = "natural_users"

    def __init__(self, path: str | None = None) -> None:
        self.path = None if path is None else str(path)

    def __call__(self, labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        """The FLAIR file's users as consecutive blocks of the training samples (``path`` mode)."""
        if self.path is None:
            raise ConfigError(
                "data.partition=NaturalUsers splits by the dataset's users, which the data module passes "
                "to split_users; as a plain partition function it needs data.partition.path (a FLAIR file)"
            )
        sizes = [n for _, n in user_sizes(flair_file(self.path), "train", "data.partition.path")]
        if sum(sizes) != len(labels):
            raise ConfigError(
                f"data.partition.path='{self.path}' has {sum(sizes)} training images but the dataset has "
                f"{len(labels)}; set it to the same file as data.root"
            )
        owners = np.repeat(np.arange(len(sizes)), sizes)
        if num_clients > len(sizes):
            raise ConfigError(
                f"data.num_clients={num_clients} exceeds the {len(sizes)} users of '{self.path}'; use at "
                f"most {len(sizes)} (one client per user)"
            )
        return natural_user_partition(owners, len(sizes), num_clients, rng)[0]

    def split_users(
        self, owners: np.ndarray, num_users: int, num_clients: int, rng: np.random.Generator, dataset: str
    ) -> tuple[list[np.ndarray], np.ndarray]:
        """The clients of the users ``owners`` names (see :func:`natural_user_partition`)."""
        return natural_user_partition(owners, num_users, num_clients, rng, dataset)
