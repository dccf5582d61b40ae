"""Tests of fl_lightning.data.datasets on the embedded digits and on tiny files in the real formats.

Nothing here touches the network: the torchvision loaders read IDX / pickle files written by the
tests under ``tmp_path``, in the layout torchvision 0.29 expects.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from fl_lightning.data.datasets import (
    DATASETS,
    DatasetSplits,
    Synthetic,
    list_datasets,
    load_dataset,
    register_dataset,
)
from fl_lightning.errors import ConfigError


def expected_normalised(train_u8: np.ndarray, test_u8: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Reference: [0, 1] scaling, then per-channel train mean/std (arrays are [N, C, H, W])."""
    tr, te = train_u8.astype(np.float64) / 255.0, test_u8.astype(np.float64) / 255.0
    mean = tr.mean(axis=(0, 2, 3), keepdims=True)
    std = tr.std(axis=(0, 2, 3), keepdims=True)
    return (tr - mean) / std, (te - mean) / std


# -------------------------------------------------------------------------------------------- digits
def test_digits_shapes_classes_and_normalisation():
    d = load_dataset("digits")
    assert isinstance(d, DatasetSplits)
    assert d.name == "digits" and d.task == "multiclass" and d.num_classes == 10
    assert d.train_x.shape == (1437, 1, 8, 8) and d.test_x.shape == (360, 1, 8, 8)
    assert d.input_shape == (1, 8, 8)
    assert d.train_x.dtype == torch.float32 and d.train_y.dtype == torch.int64
    assert d.train_y.shape == (1437,) and d.test_y.shape == (360,)
    assert abs(d.train_x.mean().item()) < 1e-5
    assert abs(d.train_x.std(correction=0).item() - 1.0) < 1e-4
    # Stratified split: every class in both splits, about 80/20 of each.
    train_counts = torch.bincount(d.train_y, minlength=10)
    test_counts = torch.bincount(d.test_y, minlength=10)
    assert (test_counts >= 35).all() and (train_counts >= 135).all()
    ratio = test_counts.double() / (train_counts + test_counts).double()
    assert ((ratio - 0.2).abs() < 0.01).all()


def test_digits_split_is_fixed():
    a, b = load_dataset("digits"), load_dataset("digits", root="elsewhere")
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_y, b.test_y)


def test_digits_matches_sklearn_split_normalised_with_train_statistics():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x_tr, x_te, y_tr, y_te = train_test_split(
        digits.images, digits.target, test_size=0.2, stratify=digits.target, random_state=0
    )
    mean, std = x_tr.mean(), x_tr.std()
    d = load_dataset("digits")
    np.testing.assert_array_equal(d.train_y.numpy(), y_tr)
    np.testing.assert_array_equal(d.test_y.numpy(), y_te)
    np.testing.assert_allclose(d.train_x.numpy()[:, 0], (x_tr - mean) / std, atol=1e-5)
    np.testing.assert_allclose(d.test_x.numpy()[:, 0], (x_te - mean) / std, atol=1e-5)


# ------------------------------------------------------------------------------------------- registry
def test_registry_lists_builtin_datasets():
    assert {"Digits", "MNIST", "FashionMNIST", "CIFAR10", "CIFAR100", "FCUBE"} <= set(list_datasets())
    assert {"digits", "mnist", "fashion_mnist", "cifar10", "cifar100", "fcube"} <= set(DATASETS)


def test_unknown_dataset_lists_choices():
    with pytest.raises(ConfigError, match=r"data\.dataset='imagenet' is unknown; choose one of .*Digits"):
        load_dataset("imagenet")


def test_register_dataset_adds_a_loader(tmp_path):
    @register_dataset("_tiny_test")
    def _tiny(root: Path, download: bool) -> DatasetSplits:
        x = torch.zeros(2, 1, 2, 2)
        y = torch.tensor([0, 1])
        return DatasetSplits("_tiny_test", "multiclass", 2, x, y, x, y)

    try:
        assert "_tiny_test" in DATASETS and "TinyTest" in list_datasets()
        assert load_dataset("_tiny_test", tmp_path).input_shape == (1, 2, 2)
    finally:
        DATASETS.pop("_tiny_test")


@pytest.mark.parametrize("name", ["mnist", "cifar10", "cifar100"])
def test_missing_files_name_the_root(tmp_path, name):
    with pytest.raises(
        ConfigError, match=rf"data\.dataset='{name}': no files under data\.root='.*'.*data\.download=true"
    ):
        load_dataset(name, tmp_path, download=False)


# ----------------------------------------------------------------------------------- MNIST (IDX files)
def write_idx_images(path: Path, images: np.ndarray, compress: bool = False) -> None:
    n, h, w = images.shape
    data = struct.pack(">IIII", 2051, n, h, w) + images.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(data) if compress else data)


def write_idx_labels(path: Path, labels: np.ndarray, compress: bool = False) -> None:
    data = struct.pack(">II", 2049, len(labels)) + labels.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(data) if compress else data)


@pytest.mark.parametrize(("name", "folder"), [("mnist", "MNIST"), ("fashion_mnist", "FashionMNIST")])
def test_mnist_family_from_idx_files(tmp_path, name, folder):
    rng = np.random.default_rng(0)
    train_x = rng.integers(0, 256, size=(20, 28, 28), dtype=np.uint8)
    test_x = rng.integers(0, 256, size=(10, 28, 28), dtype=np.uint8)
    train_y = np.arange(20) % 10
    test_y = (np.arange(10) * 3) % 10
    raw = tmp_path / folder / "raw"  # torchvision: <root>/<ClassName>/raw/<file without .gz>
    raw.mkdir(parents=True)
    write_idx_images(raw / "train-images-idx3-ubyte", train_x)
    write_idx_labels(raw / "train-labels-idx1-ubyte", train_y)
    write_idx_images(raw / "t10k-images-idx3-ubyte", test_x)
    write_idx_labels(raw / "t10k-labels-idx1-ubyte", test_y)

    d = load_dataset(name, tmp_path, download=False)
    assert d.name == name and d.num_classes == 10 and d.task == "multiclass"
    assert d.train_x.shape == (20, 1, 28, 28) and d.test_x.shape == (10, 1, 28, 28)
    assert d.train_x.dtype == torch.float32 and d.train_y.dtype == torch.int64
    np.testing.assert_array_equal(d.train_y.numpy(), train_y)
    np.testing.assert_array_equal(d.test_y.numpy(), test_y)
    exp_train, exp_test = expected_normalised(train_x[:, None], test_x[:, None])
    np.testing.assert_allclose(d.train_x.numpy(), exp_train, atol=1e-5)
    np.testing.assert_allclose(d.test_x.numpy(), exp_test, atol=1e-5)
    assert abs(d.train_x.mean().item()) < 1e-5


# ------------------------------------------------------------------ Fashion-MNIST (data.root or Debian)
FMNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


def tiny_fmnist(seed: int = 0) -> tuple[np.ndarray, ...]:
    """20 train and 10 test 28x28 images with labels covering the 10 classes."""
    rng = np.random.default_rng(seed)
    train_x = rng.integers(0, 256, size=(20, 28, 28), dtype=np.uint8)
    test_x = rng.integers(0, 256, size=(10, 28, 28), dtype=np.uint8)
    return train_x, rng.permutation(np.arange(20) % 10), test_x, rng.permutation(10)


def write_fmnist(folder: Path, arrays: tuple[np.ndarray, ...], compress: bool) -> list[Path]:
    """The four IDX files of ``arrays`` in ``folder`` (``.gz`` names when compressed)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / (name + (".gz" if compress else "")) for name in FMNIST_FILES]
    for path, arr in zip(paths, arrays):
        (write_idx_images if arr.ndim == 3 else write_idx_labels)(path, arr, compress)
    return paths


@pytest.fixture
def debian(tmp_path, monkeypatch) -> Path:
    """Debian's folder moved under tmp_path (empty until a test writes there), so tests never see the
    package's real files."""
    from fl_lightning.data import fashion_mnist

    folder = tmp_path / "usr-share-datasets-fashion-mnist"
    monkeypatch.setattr(fashion_mnist, "DEBIAN_FOLDER", folder)
    return folder


def fmnist_module(root: str | None = None):
    from fl_lightning.data import IID, FederatedDataModule

    kw = {} if root is None else {"root": root}
    dm = FederatedDataModule(dataset="fashion_mnist", num_clients=2, partition=IID(), **kw)
    dm.setup("fit")
    return dm


def torchvision_reference(tmp_path: Path, arrays: tuple[np.ndarray, ...]) -> DatasetSplits:
    """What torchvision's FashionMNIST (uncompressed files in its layout) gives through the old loader."""
    from fl_lightning.data.datasets import load_torchvision

    ref = tmp_path / "reference"
    write_fmnist(ref / "FashionMNIST" / "raw", arrays, compress=False)
    return load_torchvision("fashion_mnist", "FashionMNIST", 10, ref, download=False)


def assert_same_splits(a: DatasetSplits, b: DatasetSplits) -> None:
    for field in ("train_x", "train_y", "test_x", "test_y"):
        x, y = getattr(a, field), getattr(b, field)
        assert x.dtype == y.dtype and torch.equal(x, y), field


@pytest.mark.parametrize("compress", [False, True])
def test_fashion_mnist_from_the_data_root_layout_equals_torchvision(tmp_path, debian, compress):
    arrays = tiny_fmnist()
    write_fmnist(tmp_path / "root" / "FashionMNIST" / "raw", arrays, compress)
    dm = fmnist_module(str(tmp_path / "root"))
    assert dm.splits.train_x.shape == (20, 1, 28, 28) and dm.num_classes == 10
    assert_same_splits(dm.splits, torchvision_reference(tmp_path, arrays))
    assert sum(c.num_samples + c.test_idx.numel() for c in dm.clients) == 20


@pytest.mark.parametrize("root", ["", None])  # empty, and unset (the default "data", absent here)
def test_fashion_mnist_from_the_debian_folder_in_place(tmp_path, debian, monkeypatch, root):
    arrays = tiny_fmnist(1)
    write_fmnist(debian, arrays, compress=True)  # the package ships the .gz files
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    before = sorted(tmp_path.rglob("*"))
    dm = fmnist_module(root)
    assert_same_splits(dm.splits, torchvision_reference(tmp_path, arrays))
    after = sorted(p for p in tmp_path.rglob("*") if "reference" not in p.parts)
    assert after == before  # read in place: nothing copied or extracted anywhere


def test_fashion_mnist_prefers_a_complete_data_root_over_the_debian_folder(tmp_path, debian):
    write_fmnist(debian, tiny_fmnist(1), compress=True)
    mine = tiny_fmnist(2)
    raw = tmp_path / "root" / "FashionMNIST" / "raw"
    write_fmnist(raw, mine, compress=False)
    assert torch.equal(load_dataset("fashion_mnist", tmp_path / "root").train_y, torch.from_numpy(mine[1]))
    (raw / FMNIST_FILES[3]).unlink()  # an incomplete copy in data.root: the Debian files are read
    d = load_dataset("fashion_mnist", tmp_path / "root")
    assert torch.equal(d.train_y, torch.from_numpy(tiny_fmnist(1)[1]))


def test_fashion_mnist_missing_files_is_one_line_naming_both_fixes(tmp_path, debian):
    with pytest.raises(ConfigError) as err:
        fmnist_module(str(tmp_path))
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("data.dataset='fashion_mnist': no Fashion-MNIST files in")
    assert f"data.root='{tmp_path}'" in msg and str(debian) in msg
    assert "apt-get install dataset-fashion-mnist" in msg and "data.download=true" in msg


def test_fashion_mnist_downloads_only_when_no_folder_has_the_files(tmp_path, debian, monkeypatch):
    from fl_lightning.data import fashion_mnist

    calls = []
    monkeypatch.setattr(fashion_mnist, "load_torchvision", lambda *a, **k: calls.append(a) or "fetched")
    assert load_dataset("fashion_mnist", tmp_path, download=True) == "fetched"
    assert calls == [("fashion_mnist", "FashionMNIST", 10, tmp_path)]
    write_fmnist(debian, tiny_fmnist(), compress=True)
    assert load_dataset("fashion_mnist", tmp_path, download=True).train_x.shape == (20, 1, 28, 28)
    assert len(calls) == 1


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("cut", [1, 300])
def test_fashion_mnist_truncated_file_is_one_line_naming_it(tmp_path, debian, compress, cut):
    paths = write_fmnist(debian, tiny_fmnist(), compress)
    data = paths[2].read_bytes()
    paths[2].write_bytes(data[:-cut])
    with pytest.raises(ConfigError) as err:
        load_dataset("fashion_mnist", "")
    msg = str(err.value)
    assert "\n" not in msg and f"cannot read {paths[2]}:" in msg
    assert "apt-get install --reinstall dataset-fashion-mnist" in msg


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x00\x00\x0d\x01" + struct.pack(">I", 4) + bytes(16), "not an IDX file of unsigned bytes"),
        (struct.pack(">II", 2049, 20) + bytes(21), "trailing bytes"),
        (struct.pack(">I", 2051) + bytes(2), "truncated header"),
    ],
    ids=["not-ubyte", "trailing-bytes", "short-header"],
)
def test_fashion_mnist_corrupt_file_names_it_and_what_is_wrong(tmp_path, debian, content, message):
    paths = write_fmnist(tmp_path / "root" / "FashionMNIST" / "raw", tiny_fmnist(), compress=False)
    paths[1].write_bytes(content)
    with pytest.raises(ConfigError, match=rf"cannot read {paths[1]}: {message}.*data\.download=true"):
        load_dataset("fashion_mnist", tmp_path / "root")


def test_fashion_mnist_files_that_do_not_belong_together_are_refused(tmp_path, debian):
    train_x, train_y, test_x, test_y = tiny_fmnist()
    write_fmnist(debian, (train_x, train_y[:-1], test_x, test_y), compress=True)
    with pytest.raises(ConfigError, match=r"has 20 images but .*train-labels-idx1-ubyte.gz has 19 labels"):
        load_dataset("fashion_mnist", "")
    write_fmnist(debian, (train_x, train_y + 1, test_x, test_y), compress=True)
    with pytest.raises(ConfigError, match=r"train-labels-idx1-ubyte.gz has label 10, outside 0\.\.9"):
        load_dataset("fashion_mnist", "")
    write_fmnist(debian, (train_x, train_y, test_y, test_y), compress=True)
    with pytest.raises(ConfigError, match=r"t10k-images-idx3-ubyte.gz: holds a 1-d array where 3-d images"):
        load_dataset("fashion_mnist", "")


@pytest.mark.skipif(
    not Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz").is_file(),
    reason="Debian's dataset-fashion-mnist package is not installed",
)
def test_fashion_mnist_real_files_of_the_debian_package_load():
    d = load_dataset("fashion_mnist", "")
    assert d.train_x.shape == (60000, 1, 28, 28) and d.test_x.shape == (10000, 1, 28, 28)
    assert d.num_classes == 10 and d.train_x.dtype == torch.float32
    assert torch.bincount(d.train_y).tolist() == [6000] * 10
    assert torch.bincount(d.test_y).tolist() == [1000] * 10


# --------------------------------------------------------------------------------- CIFAR (pickles)
@pytest.fixture
def no_md5(monkeypatch):
    """Tiny files cannot match torchvision's md5 sums: only require that they exist."""
    import torchvision.datasets.cifar as tv_cifar

    monkeypatch.setattr(tv_cifar, "check_integrity", lambda fpath, md5=None: os.path.isfile(fpath))


def write_pickle(path: Path, obj: dict) -> None:
    with open(path, "wb") as f:
        pickle.dump(obj, f)


def cifar_rows(images_nhwc: np.ndarray) -> np.ndarray:
    """CIFAR's on-disk layout: each row is the R plane, then G, then B (3072 bytes)."""
    return images_nhwc.transpose(0, 3, 1, 2).reshape(len(images_nhwc), -1)


def test_cifar10_from_pickled_batches(tmp_path, no_md5):
    rng = np.random.default_rng(1)
    base = tmp_path / "cifar-10-batches-py"
    base.mkdir()
    train_parts, train_labels = [], []
    for b in range(1, 6):  # 5 batches of 4 images
        imgs = rng.integers(0, 256, size=(4, 32, 32, 3), dtype=np.uint8)
        imgs[..., 0] //= 2  # give the channels different statistics
        labels = [(b + j) % 10 for j in range(4)]
        write_pickle(base / f"data_batch_{b}", {"data": cifar_rows(imgs), "labels": labels})
        train_parts.append(imgs)
        train_labels += labels
    test_imgs = rng.integers(0, 256, size=(6, 32, 32, 3), dtype=np.uint8)
    test_labels = [9, 8, 7, 6, 5, 4]
    write_pickle(base / "test_batch", {"data": cifar_rows(test_imgs), "labels": test_labels})
    write_pickle(base / "batches.meta", {"label_names": [f"c{k}" for k in range(10)]})

    d = load_dataset("cifar10", tmp_path)
    train_imgs = np.concatenate(train_parts)
    assert d.num_classes == 10 and d.input_shape == (3, 32, 32)
    assert d.train_x.shape == (20, 3, 32, 32) and d.test_x.shape == (6, 3, 32, 32)
    assert d.train_y.tolist() == train_labels and d.test_y.tolist() == test_labels
    exp_train, exp_test = expected_normalised(
        train_imgs.transpose(0, 3, 1, 2), test_imgs.transpose(0, 3, 1, 2)
    )
    np.testing.assert_allclose(d.train_x.numpy(), exp_train, atol=1e-5)
    np.testing.assert_allclose(d.test_x.numpy(), exp_test, atol=1e-5)
    per_channel_mean = d.train_x.mean(dim=(0, 2, 3))
    per_channel_std = d.train_x.std(dim=(0, 2, 3), correction=0)
    assert torch.allclose(per_channel_mean, torch.zeros(3), atol=1e-5)
    assert torch.allclose(per_channel_std, torch.ones(3), atol=1e-4)


def test_cifar100_from_pickled_files(tmp_path, no_md5):
    rng = np.random.default_rng(2)
    base = tmp_path / "cifar-100-python"
    base.mkdir()
    train_imgs = rng.integers(0, 256, size=(12, 32, 32, 3), dtype=np.uint8)
    test_imgs = rng.integers(0, 256, size=(5, 32, 32, 3), dtype=np.uint8)
    train_fine = [0, 99, 5, 17, 42, 63, 71, 88, 3, 50, 50, 1]
    test_fine = [99, 0, 12, 34, 56]
    write_pickle(
        base / "train", {"data": cifar_rows(train_imgs), "fine_labels": train_fine, "coarse_labels": [0] * 12}
    )
    write_pickle(
        base / "test", {"data": cifar_rows(test_imgs), "fine_labels": test_fine, "coarse_labels": [0] * 5}
    )
    write_pickle(base / "meta", {"fine_label_names": [f"f{k}" for k in range(100)], "coarse_label_names": []})

    d = load_dataset("cifar100", str(tmp_path))
    assert d.name == "cifar100" and d.num_classes == 100
    assert d.train_x.shape == (12, 3, 32, 32) and d.test_x.shape == (5, 3, 32, 32)
    assert d.train_y.tolist() == train_fine and d.test_y.tolist() == test_fine
    exp_train, exp_test = expected_normalised(
        train_imgs.transpose(0, 3, 1, 2), test_imgs.transpose(0, 3, 1, 2)
    )
    np.testing.assert_allclose(d.train_x.numpy(), exp_train, atol=1e-5)
    np.testing.assert_allclose(d.test_x.numpy(), exp_test, atol=1e-5)


# ----------------------------------------------------------------------------------------- synthetic
def small(like: str | None = None, **kw) -> Synthetic:
    return Synthetic(like, **{"train_size": 600, "test_size": 200, **kw})


def test_synthetic_is_cifar10_shaped_by_default_and_deterministic():
    a = load_dataset(small())
    assert (a.task, a.num_classes, a.input_shape) == ("multiclass", 10, (3, 32, 32))
    assert a.train_x.shape == (600, 3, 32, 32) and a.test_x.shape == (200, 3, 32, 32)
    assert a.train_x.dtype == torch.float32 and a.train_y.dtype == torch.int64
    assert set(a.train_y.tolist()) == set(range(10))
    mean, std = a.train_x.mean(dim=(0, 2, 3)), a.train_x.std(dim=(0, 2, 3))
    torch.testing.assert_close(mean, torch.zeros(3), atol=1e-5, rtol=0)  # normalised as the others
    torch.testing.assert_close(std, torch.ones(3), atol=1e-4, rtol=0)
    b = load_dataset(small())
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_y, b.test_y)
    c = load_dataset(small(seed=1))
    assert not torch.equal(a.train_x, c.train_x)
    # the test set is its own stream: more training data leaves it as it was (up to normalisation)
    d = load_dataset(small(train_size=700))
    assert torch.equal(a.test_y, d.test_y)
    assert torch.corrcoef(torch.stack([a.test_x.flatten(), d.test_x.flatten()]))[0, 1] > 0.999
    assert load_dataset("synthetic").train_x.shape[0] == 10_000  # registered default: 10k / 2k


@pytest.mark.parametrize(
    ("name", "shape", "classes", "task"),
    [
        ("synthetic:cifar100", (3, 32, 32), 100, "multiclass"),
        ("synthetic:mnist", (1, 28, 28), 10, "multiclass"),
        ("synthetic:digits", (1, 8, 8), 10, "multiclass"),
        ("synthetic:tiny_imagenet", (3, 64, 64), 200, "multiclass"),
        ("synthetic:flair", (3, 32, 32), 17, "multilabel"),
    ],
)
def test_synthetic_presets_mimic_the_named_dataset(name, shape, classes, task):
    s = load_dataset(small(name.split(":")[1], train_size=300, test_size=50))
    assert (s.input_shape, s.num_classes, s.task) == (shape, classes, task)
    if task == "multilabel":
        assert s.train_y.shape == (300, classes) and s.train_y.dtype == torch.int64
        assert s.train_y.sum(dim=1).min() >= 1 and set(s.train_y.unique().tolist()) == {0, 1}
    assert s.name == name


def test_synthetic_options_override_the_preset():
    s = load_dataset(small("cifar100", shape=(2, 5, 7), num_classes=3, multilabel=True, test_size=9))
    assert (s.input_shape, s.num_classes, s.task, s.test_x.shape[0]) == ((2, 5, 7), 3, "multilabel", 9)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"like": "imagenet"}, r"data\.dataset\.like='imagenet' is not a synthetic preset"),
        ({"shape": (3, 32)}, r"data\.dataset\.shape=\[3, 32\] must be \[C, H, W\]"),
        ({"num_classes": 1}, r"data\.dataset\.num_classes=1 must be >= 2"),
        ({"train_size": 0}, r"data\.dataset\.train_size=0 and test_size=200"),
        ({"noise": -1.0}, r"data\.dataset\.noise=-1\.0 must be >= 0"),
    ],
)
def test_synthetic_bad_options_name_the_field(options, message):
    with pytest.raises(ConfigError, match=message):
        small(**options)  # checked when built (config time), not at the first load
    with pytest.raises(ConfigError, match=r"data\.dataset\.like='imagenet'"):
        load_dataset("synthetic:imagenet")  # the former spelling of a preset


def test_synthetic_is_learnable_but_not_separable_at_a_glance():
    """A linear classifier learns it well above chance in a few epochs, without reaching 100%."""
    s = load_dataset(Synthetic(train_size=3000, test_size=1000))
    torch.manual_seed(0)
    linear = torch.nn.Linear(3 * 32 * 32, 10)
    opt = torch.optim.SGD(linear.parameters(), lr=0.01)
    x, y = s.train_x.flatten(1), s.train_y

    def test_acc() -> float:
        with torch.no_grad():
            return float((linear(s.test_x.flatten(1)).argmax(1) == s.test_y).float().mean())

    first = None
    for _ in range(3):
        for idx in torch.randperm(len(y)).split(50):
            torch.nn.functional.cross_entropy(linear(x[idx]), y[idx]).backward()
            opt.step()
            opt.zero_grad()
            first = test_acc() if first is None else first
    assert first < 0.5  # one step does not solve it
    assert 0.6 < test_acc() < 0.99
    noisy = load_dataset(Synthetic(train_size=3000, test_size=1000, noise=20.0))
    with torch.no_grad():  # more noise: the trained classifier's accuracy drops towards chance
        assert float((linear(noisy.test_x.flatten(1)).argmax(1) == noisy.test_y).float().mean()) < 0.4


def test_synthetic_options_are_part_of_the_checkpoint_fingerprint():
    from fl_lightning.data import FederatedDataModule

    plain = FederatedDataModule().fingerprint()
    assert "data.synthetic" not in plain  # checkpoints of the other datasets are unaffected
    a = FederatedDataModule(dataset=small()).fingerprint()
    b = FederatedDataModule(dataset=small(seed=3)).fingerprint()
    assert a["data.synthetic"] != b["data.synthetic"]
    # stated as checkpoints written before datasets were classes state it
    assert a["data.dataset"] == "synthetic" and b["data.synthetic"] == (
        "SyntheticData(shape=None, num_classes=None, multilabel=None, train_size=600, test_size=200, "
        "noise=2.0, seed=3)"
    )
    assert FederatedDataModule(dataset="synthetic:digits").fingerprint()["data.dataset"] == "synthetic:digits"


def test_natural_users_with_synthetic_data_is_a_config_error():
    from fl_lightning.data import FederatedDataModule, NaturalUsers

    dm = FederatedDataModule(dataset="synthetic:flair", partition=NaturalUsers("data/flair.hdf5"))
    with pytest.raises(ConfigError, match="data.partition=NaturalUsers .* set data.partition to IID"):
        dm.setup("fit")


ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("config", "overrides"),
    [
        # a CPU-size paper config: the embedded digits become generated digits-shaped data
        ("configs/fedsmoo/cifar10_dir0.1_cpu.yaml", ["--data.dataset=synthetic:digits"]),
        # a full paper config (ResNet-18-GN, CIFAR-100), made small enough for a CPU test
        (
            "configs/fedsmoo/cifar100_dir0.1.yaml",
            [
                "--data.dataset=synthetic:cifar100",
                "--data.synthetic.train_size=400",
                "--data.synthetic.test_size=40",
                "--data.num_clients=20",
                "--model.clients_per_round=2",
                "--model.local_steps=1",
                "--trainer.accelerator=cpu",
            ],
        ),
    ],
)
def test_a_paper_config_runs_on_synthetic_data(tmp_path, config, overrides):
    from fl_lightning.cli import main

    main(
        [
            "fit",
            f"--config={ROOT / config}",
            *overrides,
            "--trainer.max_steps=1",
            "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={tmp_path}",
        ]
    )
    summary = json.loads(next(tmp_path.rglob("summary.json")).read_text())
    assert summary["rounds"] == 1 and 0.0 <= summary["final_global_acc"] <= 1.0
