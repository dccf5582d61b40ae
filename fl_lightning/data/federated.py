"""The federated LightningDataModule: a dataset, a partition over clients, and the round stream."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from jsonargparse import lazy_instance
from lightning.pytorch import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from fl_lightning.data.datasets import DatasetSplits, load_dataset
from fl_lightning.data.partition import Dirichlet, Partitioner, check_num_clients, partition_counts
from fl_lightning.errors import ConfigError, check_number


@dataclass
class ClientData:
    """One client's data: index arrays into the shared training tensors (no copies).

    Attributes:
        client_id: The client's index.
        x, y: The federation's full training tensors (shared by all clients).
        train_idx: This client's local training indices (may repeat under sampling with replacement).
        test_idx: This client's local test indices (empty without a local test split).
    """

    client_id: int
    x: Tensor
    y: Tensor
    train_idx: Tensor
    test_idx: Tensor

    @property
    def num_samples(self) -> int:
        """Local training samples (the client's aggregation weight)."""
        return int(self.train_idx.numel())

    def steps_per_epoch(self, batch_size: int) -> int:
        return max(1, math.ceil(self.num_samples / batch_size))

    def batches(
        self, batch_size: int, num_steps: int, generator: torch.Generator
    ) -> Iterator[tuple[Tensor, Tensor]]:
        """``num_steps`` shuffled mini-batches, reshuffling at each pass over the local data.

        The last batch of a pass may be smaller (no sample is dropped). Shuffling draws from
        ``generator`` only, so the order is a function of the client's RNG stream.
        """
        n = self.num_samples
        done = 0
        while done < num_steps:
            order = self.train_idx[torch.randperm(n, generator=generator)].to(
                self.x.device, non_blocking=True
            )
            for start in range(0, n, batch_size):
                idx = order[start : start + batch_size]
                yield self.x[idx], self.y[idx]
                done += 1
                if done == num_steps:
                    return

    def eval_batches(self, batch_size: int) -> Iterator[tuple[Tensor, Tensor]]:
        """The local test split in order, in batches (the training split if there is no test split)."""
        idx_all = (self.test_idx if self.test_idx.numel() else self.train_idx).to(self.x.device)
        for start in range(0, idx_all.numel(), batch_size):
            idx = idx_all[start : start + batch_size]
            yield self.x[idx], self.y[idx]


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
        dataset: Registered dataset name: ``digits`` (embedded, no download), ``mnist``,
            ``fashion_mnist``, ``cifar10``, ``cifar100``.
        root: Folder holding (or receiving) the torchvision dataset files.
        download: Let torchvision download missing files (needs network).
        num_clients: Number of clients ``m`` in the federation.
        partition: How the training set is split over clients (``Dirichlet``, ``IID``,
            ``Pathological``, ``DirichletWithReplacement``, ``PathologicalWithReplacement``).
        batch_size: Local training mini-batch size.
        eval_batch_size: Batch size for evaluation.
        local_test_fraction: Fraction of each client's samples held out as its local test split
            (same label distribution as its training data) for per-client and personalised
            evaluation; 0 disables it (per-client evaluation then uses the client's training data).
        seed: Seed of the partition and of the local test split.
    """

    def __init__(
        self,
        dataset: str = "digits",
        root: str = "data",
        download: bool = False,
        num_clients: int = 10,
        partition: Partitioner = lazy_instance(Dirichlet, alpha=0.5),
        batch_size: int = 32,
        eval_batch_size: int = 512,
        local_test_fraction: float = 0.2,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if not 0.0 <= local_test_fraction < 1.0:
            raise ConfigError(
                f"data.local_test_fraction={local_test_fraction} must be in [0, 1); 0 disables it"
            )
        if batch_size < 1:
            raise ConfigError(f"data.batch_size={batch_size} must be >= 1")
        if num_clients < 1:
            raise ConfigError(f"data.num_clients={num_clients} must be >= 1")
        if eval_batch_size < 1:
            raise ConfigError(f"data.eval_batch_size={eval_batch_size} must be >= 1; e.g. 512")
        check_number(seed, "data.seed", low=0, hint="e.g. 0")
        self.dataset = dataset
        self.root = root
        self.download = download
        self.num_clients = num_clients
        self.partition = partition
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.local_test_fraction = local_test_fraction
        self.seed = seed
        self.splits: DatasetSplits | None = None
        self.clients: list[ClientData] = []
        self.counts: np.ndarray | None = None

    # ------------------------------------------------------------------------------- setup
    def prepare_data(self) -> None:
        if self.download:
            load_dataset(self.dataset, self.root, download=True)

    def setup(self, stage: str | None = None) -> None:
        if self.splits is not None:
            return
        splits = load_dataset(self.dataset, self.root, download=False)
        labels = splits.train_y.numpy()
        proxy = labels if labels.ndim == 1 else _multilabel_proxy(labels)
        check_num_clients(len(proxy), self.num_clients)
        rng = np.random.default_rng(self.seed)
        parts = self.partition(proxy, self.num_clients, rng)
        self.clients = []
        for cid, idx in enumerate(parts):
            idx = np.asarray(idx, dtype=np.int64)
            n_test = round(len(idx) * self.local_test_fraction) if len(idx) > 1 else 0
            n_test = min(n_test, len(idx) - 1)
            order = rng.permutation(len(idx))
            test_idx, train_idx = np.sort(idx[order[:n_test]]), np.sort(idx[order[n_test:]])
            self.clients.append(
                ClientData(
                    cid,
                    splits.train_x,
                    splits.train_y,
                    torch.from_numpy(train_idx),
                    torch.from_numpy(test_idx),
                )
            )
        self.counts = partition_counts(
            labels, [c.train_idx.numpy() for c in self.clients], splits.num_classes
        )
        self.splits = splits

    def to(self, device: torch.device) -> None:
        """Keep the training tensors on ``device`` (one copy, shared by all clients)."""
        assert self.splits is not None
        x, y = self.splits.train_x.to(device), self.splits.train_y.to(device)
        for c in self.clients:
            c.x, c.y = x, y

    # ------------------------------------------------------------------------------- facts
    @property
    def num_classes(self) -> int:
        assert self.splits is not None, "call setup() first"
        return self.splits.num_classes

    @property
    def task(self) -> str:
        assert self.splits is not None, "call setup() first"
        return self.splits.task

    def fingerprint(self) -> dict[str, Any]:
        """The facts a checkpoint must agree with to be resumed on this data."""
        return {
            "data.dataset": self.dataset,
            "data.num_clients": self.num_clients,
            "data.partition": repr(self.partition),
            "data.seed": self.seed,
            "data.local_test_fraction": self.local_test_fraction,
        }

    # --------------------------------------------------------------------------- loaders
    def train_dataloader(self) -> RoundLoader:
        rounds = self.trainer.max_steps if self.trainer is not None else -1
        if rounds is None or rounds < 1:
            raise ConfigError(
                f"trainer.max_steps={rounds} must be >= 1: it is the number of federated rounds"
            )
        return RoundLoader(rounds)

    def _eval_loader(self) -> DataLoader:
        assert self.splits is not None
        return DataLoader(
            TensorDataset(self.splits.test_x, self.splits.test_y), batch_size=self.eval_batch_size
        )

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader()

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader()

    def predict_dataloader(self) -> DataLoader:
        """The inputs of the global test set, in order, without labels (``predict``)."""
        assert self.splits is not None
        return DataLoader(TensorDataset(self.splits.test_x), batch_size=self.eval_batch_size)


def _multilabel_proxy(labels: np.ndarray) -> np.ndarray:
    """A 1-D label for partitioning multilabel data: the sample's rarest positive label (or 0)."""
    freq = labels.sum(axis=0)
    rank = np.where(labels > 0, freq[None, :], np.inf)
    proxy = rank.argmin(axis=1)
    proxy[~np.isfinite(rank.min(axis=1))] = 0
    return proxy.astype(np.int64)
