"""In-memory classification datasets as tensors.

Every loader returns a :class:`DatasetSplits` whose labels are ``int64`` tensors and whose inputs are
images as ``float32 [N, C, H, W]`` tensors normalised per channel with the mean and standard deviation of
the training split, vectors ``float32 [N, D]`` (``fedprox_synthetic``, LEAF's Synthetic), or token ids
``[N, T]`` (``shakespeare``, LEAF's Shakespeare and Sent140; ``vocab_size`` says how many). Datasets with
their own users say each sample's user (``users``, ``train_users``, ``test_users``). Loaders are
registered by name with :func:`register_dataset` and called via :func:`load_dataset`. ``digits`` ships
with scikit-learn (no download); the torchvision datasets read the files torchvision itself downloads
(torchvision is imported lazily, inside the loaders); ``fashion_mnist``
(:mod:`fl_lightning.data.fashion_mnist`) also reads the files of Debian's ``dataset-fashion-mnist``
package in place.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fl_lightning.errors import ConfigError

__all__ = [
    "SYNTHETIC_LIKE",
    "DatasetSplits",
    "SyntheticData",
    "is_synthetic",
    "list_datasets",
    "load_dataset",
    "register_dataset",
    "synthetic_dataset",
]


@dataclass
class DatasetSplits:
    """A dataset's train and test splits, in memory.

    Attributes:
        name: Registry name of the dataset.
        task: ``"multiclass"`` or ``"multilabel"``.
        num_classes: Number of classes (labels for multilabel data).
        train_x: ``float32 [N, C, H, W]`` training images, normalised per channel with the training
            split's mean/std.
        train_y: ``int64 [N]`` training labels (``[N, L]`` 0/1 targets for multilabel data).
        test_x: Test images, normalised with the training split's statistics.
        test_y: Test labels.
        vocab_size: For token inputs (integer ``[N, T]``, e.g. characters or words): the number of token
            ids; None for float inputs. Networks that embed tokens take their size from it.
        users: Names of the dataset's own users (natural per-user data: FLAIR, Shakespeare, LEAF,
            FedProx's Synthetic), None for a centralised dataset.
        train_users: ``int64 [N]``: index into ``users`` of each training sample's user.
        test_users: ``int64 [N_test]``: index into ``users`` of each test sample's user when the test set
            is the users' own held-out data (LEAF's per-user split); None when the test users are others
            (FLAIR) or there are no users.
    """

    name: str
    task: str
    num_classes: int
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    vocab_size: int | None = None
    users: list[str] | None = None
    train_users: np.ndarray | None = None
    test_users: np.ndarray | None = None

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one input: ``(C, H, W)`` for images, ``(D,)`` for vectors, ``(T,)`` for tokens."""
        return tuple(self.train_x.shape[1:])

    @property
    def has_users(self) -> bool:
        """Whether the dataset brings its own users (``data.partition=NaturalUsers`` applies)."""
        return self.users is not None and self.train_users is not None

    @property
    def per_user_test(self) -> bool:
        """Whether the test set is the users' own test data (each user's local test split)."""
        return self.has_users and self.test_users is not None


Loader = Callable[[Path, bool], DatasetSplits]
_DATASETS: dict[str, Loader] = {}


def register_dataset(name: str) -> Callable[[Loader], Loader]:
    """Decorator registering a loader ``(root: Path, download: bool) -> DatasetSplits`` under ``name``.

    Args:
        name: Registry name (the value of ``data.dataset``).

    Returns:
        A decorator that registers the loader and returns it unchanged.
    """

    def decorate(fn: Loader) -> Loader:
        _DATASETS[name] = fn
        return fn

    return decorate


def list_datasets() -> list[str]:
    """Registered dataset names, sorted."""
    return sorted(_DATASETS)


def load_dataset(
    name: str,
    root: str | Path = "data",
    download: bool = False,
    synthetic: SyntheticData | None = None,
    options: Any = None,
) -> DatasetSplits:
    """Load a registered dataset into memory.

    Args:
        name: Registry name (``data.dataset``), e.g. ``"digits"`` or ``"cifar10"``, or ``synthetic`` /
            ``synthetic:<name>`` for generated data (:func:`synthetic_dataset`).
        root: Folder holding (or receiving) the dataset files (``data.root``).
        download: Let the loader download missing files (``data.download``; needs network).
        synthetic: Options of the generated data (``data.synthetic``); ignored for other datasets.
        options: The dataset's own options (``data.shakespeare``, ``data.leaf``, ``data.fedprox_synthetic``),
            passed to loaders that take an ``options`` argument; None: their defaults.

    Raises:
        ConfigError: For an unknown name (the message lists the known names) or missing files.
    """
    if is_synthetic(name):
        return synthetic_dataset(name, synthetic)
    if name not in _DATASETS:
        raise ConfigError(f"data.dataset={name!r} is unknown; choose one of {', '.join(list_datasets())}")
    loader = _DATASETS[name]
    if "options" in inspect.signature(loader).parameters:
        return loader(Path(root).expanduser(), bool(download), options=options)  # type: ignore[call-arg]
    return loader(Path(root).expanduser(), bool(download))


# ------------------------------------------------------------------------------------- normalisation
def _channel_stats_uint8(images: np.ndarray, channel_axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact per-channel mean/std (population) of uint8 images scaled to [0, 1], via histograms."""
    values = np.arange(256, dtype=np.float64) / 255.0
    means, stds = [], []
    for c in range(images.shape[channel_axis]):
        hist = np.bincount(np.take(images, c, axis=channel_axis).ravel(), minlength=256).astype(np.float64)
        total = hist.sum()
        mean = (hist * values).sum() / total
        var = (hist * (values - mean) ** 2).sum() / total
        means.append(mean)
        stds.append(np.sqrt(var))
    return np.asarray(means), np.asarray(stds)


def _normalise(x: torch.Tensor, mean: np.ndarray, std: np.ndarray) -> torch.Tensor:
    """``(x - mean) / std`` per channel of a ``[N, C, H, W]`` tensor, in place; a zero std counts as 1."""
    std = np.where(std > 0, std, 1.0)
    m = torch.as_tensor(mean, dtype=x.dtype).view(1, -1, 1, 1)
    s = torch.as_tensor(std, dtype=x.dtype).view(1, -1, 1, 1)
    return x.sub_(m).div_(s)


def _uint8_to_normalised(
    train: np.ndarray, test: np.ndarray, channels_last: bool
) -> tuple[torch.Tensor, ...]:
    """uint8 images (``[N, H, W]`` or ``[N, H, W, C]``) -> normalised ``float32 [N, C, H, W]`` tensors."""
    if train.ndim == 3:
        train, test = train[:, None], test[:, None]
        channels_last = False
    mean, std = _channel_stats_uint8(train, channel_axis=3 if channels_last else 1)
    out = []
    for arr in (train, test):
        x = torch.from_numpy(np.ascontiguousarray(arr))
        if channels_last:
            x = x.permute(0, 3, 1, 2).contiguous()  # reorder as uint8, before the 4x larger float copy
        x = x.to(torch.float32).div_(255.0)
        out.append(_normalise(x, mean, std))
    return tuple(out)


# ------------------------------------------------------------------------------------------- loaders
@register_dataset("digits")
def _load_digits(root: Path, download: bool) -> DatasetSplits:
    """scikit-learn's embedded 8x8 digits (1797 images, 10 classes), fixed stratified 80/20 split.

    The split is ``train_test_split(test_size=0.2, stratify=y, random_state=0)`` (1437 train, 360
    test); ``root`` and ``download`` are ignored.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = digits.images.astype(np.float64) / 16.0  # values 0..16 -> [0, 1]
    y = digits.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, stratify=y, random_state=0)
    mean, std = np.array([x_tr.mean()]), np.array([x_tr.std()])
    train_x = _normalise(torch.from_numpy(x_tr[:, None]).to(torch.float32), mean, std)
    test_x = _normalise(torch.from_numpy(x_te[:, None]).to(torch.float32), mean, std)
    return DatasetSplits(
        name="digits",
        task="multiclass",
        num_classes=10,
        train_x=train_x,
        train_y=torch.from_numpy(y_tr),
        test_x=test_x,
        test_y=torch.from_numpy(y_te),
    )


def _torchvision_splits(name: str, cls_name: str, root: Path, download: bool) -> tuple[Any, Any]:
    """Instantiate ``torchvision.datasets.<cls_name>`` for both splits, mapping failures to ConfigError."""
    try:
        tv_datasets = importlib.import_module("torchvision.datasets")
    except ImportError as e:
        raise ConfigError(
            f"data.dataset={name!r} needs torchvision ({e}); install it with `pip install torchvision`"
        ) from None
    cls = getattr(tv_datasets, cls_name)
    try:
        return cls(str(root), train=True, download=download), cls(str(root), train=False, download=download)
    except RuntimeError as e:
        if download:
            raise ConfigError(
                f"data.dataset={name!r}: download into data.root='{root}' failed or left missing/corrupt "
                f"files ({_first_line(e)}); check the network, delete partial files and retry"
            ) from None
        raise ConfigError(
            f"data.dataset={name!r}: no files under data.root='{root}'; set data.download=true to fetch them "
            "(needs network) or point data.root at an existing copy"
        ) from None
    except OSError as e:  # network errors (URLError is an OSError) or unreadable files
        raise ConfigError(
            f"data.dataset={name!r}: could not read or download files under data.root='{root}' "
            f"({_first_line(e)}); check the network or point data.root at an existing copy"
        ) from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _as_numpy_uint8(data: Any) -> np.ndarray:
    arr = data.numpy() if isinstance(data, torch.Tensor) else np.asarray(data)
    return np.asarray(arr, dtype=np.uint8)


def _load_torchvision(
    name: str, cls_name: str, num_classes: int, root: Path, download: bool
) -> DatasetSplits:
    train, test = _torchvision_splits(name, cls_name, root, download)
    tr, te = _as_numpy_uint8(train.data), _as_numpy_uint8(test.data)
    channels_last = tr.ndim == 4  # CIFAR: [N, 32, 32, 3]; MNIST family: [N, 28, 28]
    train_x, test_x = _uint8_to_normalised(tr, te, channels_last)
    return DatasetSplits(
        name=name,
        task="multiclass",
        num_classes=num_classes,
        train_x=train_x,
        train_y=torch.as_tensor(np.asarray(train.targets), dtype=torch.int64),
        test_x=test_x,
        test_y=torch.as_tensor(np.asarray(test.targets), dtype=torch.int64),
    )


@register_dataset("mnist")
def _load_mnist(root: Path, download: bool) -> DatasetSplits:
    """MNIST (LeCun et al., 1998): 60k/10k 28x28 grey digits, 10 classes, via torchvision."""
    return _load_torchvision("mnist", "MNIST", 10, root, download)


@register_dataset("cifar10")
def _load_cifar10(root: Path, download: bool) -> DatasetSplits:
    """CIFAR-10 (Krizhevsky, 2009): 50k/10k 32x32 RGB images, 10 classes, via torchvision."""
    return _load_torchvision("cifar10", "CIFAR10", 10, root, download)


@register_dataset("cifar100")
def _load_cifar100(root: Path, download: bool) -> DatasetSplits:
    """CIFAR-100 (Krizhevsky, 2009): 50k/10k 32x32 RGB images, 100 fine classes, via torchvision."""
    return _load_torchvision("cifar100", "CIFAR100", 100, root, download)


# ------------------------------------------------------------------------------------------ synthetic
SYNTHETIC = "synthetic"
#: ``data.dataset=synthetic:<name>``: the input shape, classes, task and default sizes standing in for
#: ``<name>`` (sizes are smaller than the real data's, so generation takes about a second).
SYNTHETIC_LIKE: dict[str, tuple[tuple[int, int, int], int, bool, int, int]] = {
    "cifar10": ((3, 32, 32), 10, False, 10_000, 2_000),
    "cifar100": ((3, 32, 32), 100, False, 10_000, 2_000),
    "mnist": ((1, 28, 28), 10, False, 10_000, 2_000),
    "fashion_mnist": ((1, 28, 28), 10, False, 10_000, 2_000),
    "digits": ((1, 8, 8), 10, False, 1_437, 360),
    "tiny_imagenet": ((3, 64, 64), 200, False, 10_000, 2_000),
    "flair": ((3, 32, 32), 17, True, 4_000, 1_000),
}
_GRID = 4  # class patterns and clutter are bilinear images of a 4x4 grid of Gaussian values
_CHUNK = 4096  # samples generated per block (bounds the temporaries)


@dataclass(frozen=True)
class SyntheticData:
    """Options of the generated dataset (``data.synthetic``, read when ``data.dataset`` is synthetic).

    Unset fields (None) take the values of the preset named by ``data.dataset``: ``synthetic`` is
    CIFAR-10-shaped; ``synthetic:<name>`` mimics ``<name>`` (one of :data:`SYNTHETIC_LIKE`: cifar10,
    cifar100, mnist, fashion_mnist, digits, tiny_imagenet, flair).

    Args:
        shape: Input shape ``[C, H, W]``.
        num_classes: Classes (labels of a multilabel task).
        multilabel: Multi-hot targets (each label on with probability ``1/L``, plus one drawn uniformly).
        train_size: Training samples.
        test_size: Test samples.
        noise: Std of the class-independent part relative to the class patterns; larger is harder.
            At the default 2, a linear classifier trained for 3 epochs reaches about 95% test accuracy
            on 10 classes (3k training samples) and about 70% on 100 (10k).
        seed: Seed of the generated data (the partition has its own, ``data.seed``).
    """

    shape: tuple[int, ...] | None = None
    num_classes: int | None = None
    multilabel: bool | None = None
    train_size: int | None = None
    test_size: int | None = None
    noise: float = 2.0
    seed: int = 0


def is_synthetic(name: str) -> bool:
    """Whether ``data.dataset=name`` selects the generated dataset (``synthetic`` or ``synthetic:<name>``)."""
    return name == SYNTHETIC or name.startswith(SYNTHETIC + ":")


def synthetic_dataset(name: str = SYNTHETIC, options: SyntheticData | None = None) -> DatasetSplits:
    """A seeded, learnable image classification dataset generated in memory (no files, no download).

    Each class ``c`` has a smooth pattern ``P_c`` (a bilinear upsampling of a 4x4 grid of standard
    normal values per channel, scaled to unit std); a sample of class ``y`` is

        ``x = P_y + noise * (Q + E)``

    with ``Q`` a class-independent smooth clutter image drawn like a pattern and ``E`` white Gaussian
    noise (multilabel: ``P_y`` is the sum of the patterns of the sample's labels). The clutter lives in
    the same low-frequency subspace as the patterns, so classes overlap and accuracy grows with training
    instead of being perfect after one step. Images are normalised per channel with the training split's
    statistics, as the other datasets. The training and test splits come from separate streams of
    ``seed``: the test set does not depend on ``train_size``. 10k CIFAR-shaped images take about a
    second and 120 MB.

    Args:
        name: ``synthetic`` (CIFAR-10-shaped) or ``synthetic:<preset>`` (see :data:`SYNTHETIC_LIKE`).
        options: Fields that override the preset (``data.synthetic``).

    Raises:
        ConfigError: For an unknown preset or an invalid option (the message names the field).
    """
    from fl_lightning.functional.tensor import derive_seed

    opts = options or SyntheticData()
    like = name.split(":", 1)[1] if ":" in name else "cifar10"
    if like not in SYNTHETIC_LIKE:
        raise ConfigError(
            f"data.dataset={name!r}: unknown synthetic preset {like!r}; use synthetic or synthetic:<name> "
            f"with <name> one of {', '.join(SYNTHETIC_LIKE)}"
        )
    shape, classes, multilabel, train_size, test_size = SYNTHETIC_LIKE[like]
    shape = tuple(opts.shape) if opts.shape is not None else shape
    classes = opts.num_classes if opts.num_classes is not None else classes
    multilabel = opts.multilabel if opts.multilabel is not None else multilabel
    train_size = opts.train_size if opts.train_size is not None else train_size
    test_size = opts.test_size if opts.test_size is not None else test_size
    if len(shape) != 3 or min(shape) < 1:
        raise ConfigError(f"data.synthetic.shape={list(shape)} must be [C, H, W] with positive sizes")
    if classes < 2:
        raise ConfigError(f"data.synthetic.num_classes={classes} must be >= 2")
    if train_size < 1 or test_size < 1:
        raise ConfigError(
            f"data.synthetic.train_size={train_size} and test_size={test_size} must both be >= 1"
        )
    if opts.noise < 0:
        raise ConfigError(f"data.synthetic.noise={opts.noise} must be >= 0")
    c, h, w = (int(s) for s in shape)
    basis = _smooth_basis(h, w)
    g = torch.Generator().manual_seed(derive_seed(opts.seed, 0))
    patterns = torch.randn(classes, c, basis.shape[0], generator=g) @ basis
    patterns /= patterns.flatten(1).std(dim=1).clamp_min(1e-12).view(-1, 1, 1)
    splits = []
    for stream, n in ((1, train_size), (2, test_size)):
        g.manual_seed(derive_seed(opts.seed, stream))
        splits.append(_synthetic_split(n, patterns, basis, multilabel, opts.noise, g))
    (train_x, train_y), (test_x, test_y) = splits
    train_x, test_x = train_x.view(-1, c, h, w), test_x.view(-1, c, h, w)
    mean = train_x.mean(dim=(0, 2, 3)).double().numpy()
    std = train_x.std(dim=(0, 2, 3)).double().numpy()
    return DatasetSplits(
        name=name,
        task="multilabel" if multilabel else "multiclass",
        num_classes=classes,
        train_x=_normalise(train_x, mean, std),
        train_y=train_y,
        test_x=_normalise(test_x, mean, std),
        test_y=test_y,
    )


def _smooth_basis(h: int, w: int) -> torch.Tensor:
    """``[gh*gw, h*w]`` images of the unit impulses of a ``gh x gw`` grid, upsampled bilinearly (unit std)."""
    import torch.nn.functional as F

    def axis(n: int) -> torch.Tensor:
        k = min(_GRID, n)
        return F.interpolate(torch.eye(k).unsqueeze(1), size=n, mode="linear", align_corners=False)[:, 0]

    rows, cols = axis(h), axis(w)
    basis = torch.einsum("ah,bw->abhw", rows, cols).reshape(rows.shape[0] * cols.shape[0], h * w)
    # scale each basis image so a standard normal combination has about unit variance per pixel
    return basis * (h * w / basis.shape[0] / basis.square().sum(dim=1, keepdim=True)).sqrt()


def _synthetic_split(
    n: int, patterns: torch.Tensor, basis: torch.Tensor, multilabel: bool, noise: float, g: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` samples ``(x [n, C, H*W], y)`` of :func:`synthetic_dataset`, generated in blocks."""
    classes, c, _ = patterns.shape
    if multilabel:
        p = 1.0 / classes
        y = (torch.rand(n, classes, generator=g) < p).to(torch.int64)
        y[torch.arange(n), torch.randint(classes, (n,), generator=g)] = 1
    else:
        y = torch.randint(classes, (n,), generator=g)
    x = torch.empty(n, c, patterns.shape[2])
    for start in range(0, n, _CHUNK):
        stop = min(start + _CHUNK, n)
        block = x[start:stop]
        torch.randn(block.shape, generator=g, out=block)
        block += torch.randn(stop - start, c, basis.shape[0], generator=g) @ basis
        block *= noise
        if multilabel:
            block += (y[start:stop].float() @ patterns.flatten(1)).view_as(block)
        else:
            block += patterns[y[start:stop]]
    return x, y


@register_dataset(SYNTHETIC)
def _load_synthetic(root: Path, download: bool) -> DatasetSplits:
    """Generated CIFAR-10-shaped data (:func:`synthetic_dataset`); ``root`` and ``download`` are ignored."""
    return synthetic_dataset(SYNTHETIC)
