"""FCUBE: NIID-Bench's synthetic feature-skew dataset, 3-d points of a cube split by a plane, 4 parties.

Li, Diao, Chen, He, "Federated Learning on Non-IID Data Silos: An Experimental Study" (ICDE 2022), Sec. IV
("FCUBE"), as its code generates it (``partition_data`` of ``utils.py``, dataset ``generated``, in
Xtra-Computing/NIID-Bench):

* **The cube and the label rule.** Points lie in the cube ``[-1, 1]^3``; the plane ``x1 = 0`` separates the
  classes: label 0 if ``x1 > 0``, else 1.
* **Training data: 4 parties of 1,000 points, by octants.** For party ``k`` (0..3) every point draws
  ``(p1, p2, p3)`` uniformly from ``[0, 1)^3``; ``p2`` is negated for parties 2 and 3, ``p3`` for parties 1
  and 3. Its even-numbered points are ``(p1, p2, p3)`` (label 0), its odd-numbered ones the mirror image
  ``(-p1, -p2, -p3)`` (label 1). So each party holds two opposite octants, one per class, 500 points each:
  party 0 the octants ``(+,+,+)`` and ``(-,-,-)``, party 1 ``(+,+,-)`` and ``(-,-,+)``, party 2 ``(+,-,+)``
  and ``(-,+,-)``, party 3 ``(+,-,-)`` and ``(-,+,+)``. The label rule is the same everywhere; the parties'
  input distributions differ (feature skew). NIID-Bench stores the 4,000 points party after party and
  gives party ``k`` the ``k``-th quarter (its ``real`` partition with 4 parties).
* **Test data: 1,000 points** uniform in the whole cube, labelled by the same rule (the global test set;
  the parties have no test data of their own).

The dataset brings its users: ``data.partition=NaturalUsers`` gives each party one client; any other
partition pools the 4,000 points and re-splits them (one line says so). NIID-Bench draws with Python's
unseeded ``random``; here a ``numpy`` generator seeded with ``seed`` draws the same distribution in the
same order (party by party, point by point, ``p1, p2, p3``), so a seed fixes the data. Its model for FCUBE
is a single linear layer ``3 -> 2`` (``PerceptronModel``): :class:`~fl_lightning.models.LogisticRegression`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fl_lightning.data.datasets import DatasetSource, DatasetSplits
from fl_lightning.errors import ConfigError

__all__ = ["FCUBE", "PARTIES", "fcube_label", "fcube_test", "fcube_train"]

NAME = "fcube"
#: NIID-Bench's parties (the cube's octant pairs).
PARTIES = 4


def fcube_label(x: np.ndarray) -> np.ndarray:
    """The label rule: 0 where ``x1 > 0``, else 1 (``int64``)."""
    return np.where(x[:, 0] > 0, 0, 1).astype(np.int64)


def fcube_train(
    samples_per_party: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The parties' points ``float32 [4 n, 3]``, labels ``int64`` and party of each point, party by party."""
    xs, ys, owners = [], [], []
    for party in range(PARTIES):
        p = rng.random((samples_per_party, 3))
        signs = np.array([1.0, -1.0 if party > 1 else 1.0, -1.0 if party % 2 == 1 else 1.0])
        p = p * signs
        odd = np.arange(samples_per_party) % 2 == 1
        p[odd] = -p[odd]  # odd-numbered points: the mirror image, label 1
        xs.append(p)
        ys.append(odd.astype(np.int64))
        owners.append(np.full(samples_per_party, party, dtype=np.int64))
    return np.concatenate(xs).astype(np.float32), np.concatenate(ys), np.concatenate(owners)


def fcube_test(test_size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``test_size`` points uniform in ``[-1, 1]^3`` (``float32``) and their labels."""
    x = rng.random((test_size, 3)) * 2 - 1
    return x.astype(np.float32), fcube_label(x)


class FCUBE(DatasetSource):
    """NIID-Bench's FCUBE (see the module): 4 parties of 1,000 3-d points, two opposite octants each, split
    by the plane ``x1 = 0``; 1,000 test points from the whole cube. Generated: ``data.root`` and
    ``data.download`` are not used.

    Args:
        samples_per_party: Points per party (NIID-Bench: 1,000); even, so both classes have half.
        test_size: Points of the global test set (NIID-Bench: 1,000).
        seed: Seed of the generator (the partition has its own, ``data.seed``).

    Raises:
        ConfigError: For a size out of range (the line names the field).
    """

    registry_name = NAME
    brings_users = True
    reads_files = False

    def __init__(self, samples_per_party: int = 1000, test_size: int = 1000, seed: int = 0) -> None:
        for field, value, low in (("samples_per_party", samples_per_party, 2), ("test_size", test_size, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(
                    f"data.dataset.{field}={value!r} must be an integer >= {low}; NIID-Bench: 1000"
                )
        if samples_per_party % 2:
            raise ConfigError(
                f"data.dataset.samples_per_party={samples_per_party} must be even (half of a party's points "
                "are the mirror images of the other half); NIID-Bench: 1000"
            )
        self.samples_per_party = samples_per_party
        self.test_size = test_size
        self.seed = seed

    def load(self, root: Path, download: bool) -> DatasetSplits:
        rng = np.random.default_rng(self.seed)
        train_x, train_y, owners = fcube_train(self.samples_per_party, rng)
        test_x, test_y = fcube_test(self.test_size, rng)
        return DatasetSplits(
            name=NAME,
            task="multiclass",
            num_classes=2,
            train_x=torch.from_numpy(train_x),
            train_y=torch.from_numpy(train_y),
            test_x=torch.from_numpy(test_x),
            test_y=torch.from_numpy(test_y),
            users=[f"party_{k}" for k in range(PARTIES)],
            train_users=owners,
        )
