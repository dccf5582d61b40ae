"""FederatedDataModule: the validation split held out from the training data before partitioning."""

import numpy as np
import pytest
import torch

from fl_lightning.data import Dirichlet, FederatedDataModule
from fl_lightning.data.federated import stratified_holdout
from fl_lightning.errors import ConfigError


def _data(**kw) -> FederatedDataModule:
    dm = FederatedDataModule(num_clients=4, partition=Dirichlet(alpha=0.5, min_size=10), **kw)
    dm.setup("fit")
    return dm


def _loader_labels(loader) -> torch.Tensor:
    return torch.cat([y for _, y in loader])


def test_validation_split_is_disjoint_from_every_client_and_the_test_set():
    dm = _data(val_fraction=0.1)
    val = set(dm.val_idx.tolist())
    n = len(dm.splits.train_y)
    assert len(val) == len(dm.val_idx) and abs(len(val) - 0.1 * n) <= 10  # one rounding per class
    for c in dm.clients:
        assert val.isdisjoint(c.train_idx.tolist()) and val.isdisjoint(c.test_idx.tolist())
    clients = sum(c.num_samples + c.test_idx.numel() for c in dm.clients)
    assert clients + len(val) == n  # nothing lost: the rest is partitioned
    assert torch.equal(_loader_labels(dm.val_dataloader()), dm.splits.train_y[dm.val_idx])
    assert torch.equal(_loader_labels(dm.test_dataloader()), dm.splits.test_y)
    assert dm.val_split == "validation"


def test_validation_split_is_stratified_and_seeded():
    labels = np.repeat(np.arange(5), [100, 50, 20, 200, 10])
    held, rest = stratified_holdout(labels, 0.1, np.random.default_rng(0))
    assert np.bincount(labels[held]).tolist() == [10, 5, 2, 20, 1]
    assert np.array_equal(np.sort(np.concatenate([held, rest])), np.arange(len(labels)))
    again, _ = stratified_holdout(labels, 0.1, np.random.default_rng(0))
    other, _ = stratified_holdout(labels, 0.1, np.random.default_rng(1))
    assert np.array_equal(held, again) and not np.array_equal(held, other)
    assert torch.equal(_data(val_fraction=0.1, seed=3).val_idx, _data(val_fraction=0.1, seed=3).val_idx)


def test_without_a_validation_split_validation_uses_the_test_set_and_the_partition_is_unchanged():
    dm = _data()
    assert dm.val_idx.numel() == 0 and dm.val_split == "test"
    assert torch.equal(_loader_labels(dm.val_dataloader()), dm.splits.test_y)
    parts = dm.partition(dm.splits.train_y.numpy(), 4, np.random.default_rng(dm.seed))  # as before the option
    for c, part in zip(dm.clients, parts, strict=True):
        assert sorted(c.train_idx.tolist() + c.test_idx.tolist()) == sorted(np.asarray(part).tolist())
    assert "data.val_fraction" not in dm.fingerprint()  # checkpoints from before the option still load
    assert _data(val_fraction=0.2).fingerprint()["data.val_fraction"] == 0.2


@pytest.mark.parametrize("fraction", [-0.1, 1.0])
def test_bad_val_fraction_names_the_field(fraction):
    with pytest.raises(ConfigError, match=r"data.val_fraction="):
        FederatedDataModule(val_fraction=fraction)
