"""Where a federation's data comes from: dataset classes, their in-memory splits, the shared loaders.

A dataset is a :class:`DatasetSource` subclass chosen like a partition or a client transform
(``--data.dataset=Shakespeare --data.dataset.max_windows=500``, or ``class_path``/``init_args`` in YAML),
each with its own typed, documented constructor arguments and the declaration whether it brings its own
users (:attr:`DatasetSource.brings_users`: natural per-user data, ``data.partition=NaturalUsers``). Its
:meth:`~DatasetSource.load` returns a :class:`DatasetSplits` whose labels are ``int64`` tensors and whose
inputs are images as ``float32 [N, C, H, W]`` tensors normalised per channel with the mean and standard
deviation of the training split, vectors ``float32 [N, D]`` (``FedProxSynthetic``, ``FCUBE``, LEAF's
Synthetic), or token ids ``[N, T]`` (``Shakespeare``, LEAF's Shakespeare and Sent140; ``vocab_size`` says
how many). Datasets with their own users say each sample's user (``users``, ``train_users``,
``test_users``).

Every class also has a registry name (:attr:`DatasetSource.registry_name`: ``digits``, ``shakespeare``,
...), the spelling of ``data.dataset`` before datasets were classes; :func:`get_dataset` resolves a name, a
class name or a ``class_path`` mapping, and ``fl_lightning.config`` reads the former spellings
(``--data.dataset=shakespeare --data.shakespeare.max_windows=500``, ``synthetic:cifar100``) as the
classes. ``Digits`` ships with scikit-learn (no download); the torchvision datasets read the files
torchvision itself downloads (torchvision is imported lazily, inside the loaders); ``FashionMNIST``
(:mod:`fl_lightning.data.fashion_mnist`) also reads the files of Debian's ``dataset-fashion-mnist``
package in place. The loaders' building blocks (:func:`normalise`, :func:`uint8_to_normalised`,
:func:`channel_stats_uint8`, :func:`load_torchvision`, :func:`first_line`) are public here for the
dataset modules.
"""

from __future__ import annotations

import difflib
import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from fl_lightning.errors import ConfigError

__all__ = [
    "CIFAR10",
    "CIFAR100",
    "DATASETS",
    "MNIST",
    "SYNTHETIC_LIKE",
    "DatasetSource",
    "DatasetSplits",
    "Digits",
    "Synthetic",
    "channel_stats_uint8",
    "first_line",
    "get_dataset",
    "is_synthetic",
    "list_datasets",
    "load_dataset",
    "load_torchvision",
    "normalise",
    "register_dataset",
    "synthetic_dataset",
    "uint8_to_normalised",
    "user_datasets",
]


@dataclass
class DatasetSplits:
    """A dataset's train and test splits, in memory.

    Attributes:
        name: The dataset's registry name (:attr:`DatasetSource.key`).
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


#: Every dataset class by its registry name (filled as the classes are defined: a subclass that sets
#: :attr:`DatasetSource.name` registers itself).
DATASETS: dict[str, type[DatasetSource]] = {}


class DatasetSource(ABC):
    """Base: a dataset a federation is built from (``data.dataset``).

    A subclass sets :attr:`registry_name` (its registry name, registering the class), :attr:`brings_users`
    (whether its samples come with their own users: the natural partition ``NaturalUsers`` applies), keeps
    each constructor argument as a public attribute of the same name (checked in ``__init__``, raising
    :class:`~fl_lightning.errors.ConfigError` with the field ``data.dataset.<argument>``), and implements
    :meth:`load`.
    """

    #: The registry name: the ``data.dataset`` spelling of configs written before datasets were classes.
    registry_name: ClassVar[str] = ""
    #: Whether the samples come with their users (``DatasetSplits.users``): ``NaturalUsers`` applies.
    brings_users: ClassVar[bool] = False
    #: Whether :meth:`load` reads files (``data.download`` may fetch them); generated data: False.
    reads_files: ClassVar[bool] = True
    #: ``(field, class name)`` of the options of configs written before datasets were classes
    #: (``data.shakespeare``: ``ShakespeareData``): the config layer reads the field as this class's
    #: arguments, and :meth:`fingerprint` states them as those checkpoints did.
    former_options: ClassVar[tuple[str, str] | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("registry_name"):
            DATASETS[cls.registry_name] = cls

    @abstractmethod
    def load(self, root: Path, download: bool) -> DatasetSplits:
        """The dataset's train and test splits, in memory.

        Args:
            root: ``data.root`` (user folder expanded): where the files are (or go).
            download: ``data.download``: the loader may fetch missing files (needs network).

        Raises:
            ConfigError: For missing or unreadable files, or an argument out of range (one line).
        """

    def prepare(self, root: Path, download: bool) -> None:
        """Fetch the files once (``LightningDataModule.prepare_data``): loads with ``download`` when set."""
        if download and self.reads_files:
            self.load(root, True)

    @property
    def key(self) -> str:
        """The registry spelling of this dataset (``data.dataset`` in messages and fingerprints)."""
        return self.registry_name

    def args(self) -> dict[str, Any]:
        """The constructor arguments, which subclasses keep as public attributes of the same names."""
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}

    def fingerprint(self) -> dict[str, str]:
        """The facts a checkpoint must agree with (as checkpoints written before the classes state them)."""
        facts = {"data.dataset": self.key}
        if self.former_options is not None:
            field, cls_name = self.former_options
            args = ", ".join(f"{k}={v!r}" for k, v in self.args().items())
            facts[f"data.{field}"] = f"{cls_name}({args})"
        return facts

    def __repr__(self) -> str:
        # skip jsonargparse's lazy-instance wrapper classes so the repr is stable
        cls = next(
            c
            for c in type(self).__mro__
            if not c.__module__.startswith("jsonargparse") and not c.__name__.startswith("LazyInstance_")
        )
        return f"{cls.__name__}({', '.join(f'{k}={v!r}' for k, v in self.args().items())})"


def list_datasets() -> list[str]:
    """The dataset classes' names, sorted case-insensitively (the values of ``--data.dataset``)."""
    return sorted((c.__name__ for c in DATASETS.values()), key=str.lower)


def user_datasets() -> list[str]:
    """The registry names of the datasets that bring their own users (``NaturalUsers`` applies), sorted."""
    return sorted(n for n, c in DATASETS.items() if c.brings_users)


def _by_name(name: str) -> type[DatasetSource] | None:
    """The class a registry name (``shakespeare``) or class name (``Shakespeare``) names, or None."""
    key = name.strip()
    by_class = {c.__name__: c for c in DATASETS.values()}
    if key in by_class:
        return by_class[key]
    return DATASETS.get(key.lower().replace("-", "_"))


def get_dataset(spec: DatasetSource | str | Mapping[str, Any]) -> DatasetSource:
    """The dataset ``spec`` names: an instance (returned as is), a class or registry name (``Shakespeare``,
    ``shakespeare``, ``synthetic:cifar100``), or a ``{class_path, init_args}`` mapping.

    Raises:
        ConfigError: For an unknown name (the line lists the classes and suggests a close one).
    """
    if isinstance(spec, DatasetSource):
        return spec
    if isinstance(spec, Mapping):
        name = str(spec.get("class_path", "")).rsplit(".", 1)[-1]
        cls = _by_name(name)
        if cls is None:
            raise _unknown(str(spec.get("class_path")))
        return cls(**dict(spec.get("init_args") or {}))
    text = str(spec)
    if is_synthetic(text):
        return Synthetic(like=text.split(":", 1)[1] if ":" in text else None)
    cls = _by_name(text)
    if cls is None:
        raise _unknown(text)
    return cls()


def _unknown(name: str) -> ConfigError:
    names = {**{c.__name__: c for c in DATASETS.values()}, **DATASETS}
    close = difflib.get_close_matches(name, list(names), n=1, cutoff=0.6)
    hint = f"; did you mean {names[close[0]].__name__}?" if close else ""
    return ConfigError(
        f"data.dataset={name!r} is unknown; choose one of {', '.join(list_datasets())} "
        f"(`python -m fl_lightning list datasets`){hint}"
    )


def register_dataset(name: str) -> Callable[[Callable[[Path, bool], DatasetSplits]], type[DatasetSource]]:
    """Decorator making a loader function ``(root, download) -> DatasetSplits`` a dataset class named ``name``
    (no arguments, no users of its own); a class with arguments subclasses :class:`DatasetSource`.

    Returns:
        A decorator that returns the new class (registered under ``name``).
    """

    def decorate(fn: Callable[[Path, bool], DatasetSplits]) -> type[DatasetSource]:
        def load(self: DatasetSource, root: Path, download: bool) -> DatasetSplits:
            return fn(root, download)

        cls_name = "".join(part.capitalize() for part in name.split("_")) or "Loaded"
        return type(cls_name, (DatasetSource,), {"registry_name": name, "load": load, "__doc__": fn.__doc__})

    return decorate


def load_dataset(
    spec: DatasetSource | str | Mapping[str, Any], root: str | Path = "data", download: bool = False
) -> DatasetSplits:
    """Load a dataset into memory (see :func:`get_dataset` for ``spec``).

    Args:
        spec: A dataset, its name (``"digits"``, ``"Digits"``, ``"synthetic:cifar100"``) or a
            ``class_path`` mapping (``config.yaml``'s ``data.dataset``).
        root: Folder holding (or receiving) the dataset files (``data.root``).
        download: Let the loader download missing files (``data.download``; needs network).

    Raises:
        ConfigError: For an unknown name (the message lists the known names) or missing files.
    """
    return get_dataset(spec).load(Path(root).expanduser(), bool(download))


# ------------------------------------------------------------------------------------- normalisation
def channel_stats_uint8(images: np.ndarray, channel_axis: int) -> tuple[np.ndarray, np.ndarray]:
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


def normalise(x: torch.Tensor, mean: np.ndarray, std: np.ndarray) -> torch.Tensor:
    """``(x - mean) / std`` per channel of a ``[N, C, H, W]`` tensor, in place; a zero std counts as 1."""
    std = np.where(std > 0, std, 1.0)
    m = torch.as_tensor(mean, dtype=x.dtype).view(1, -1, 1, 1)
    s = torch.as_tensor(std, dtype=x.dtype).view(1, -1, 1, 1)
    return x.sub_(m).div_(s)


def uint8_to_normalised(train: np.ndarray, test: np.ndarray, channels_last: bool) -> tuple[torch.Tensor, ...]:
    """uint8 images (``[N, H, W]`` or ``[N, H, W, C]``) -> normalised ``float32 [N, C, H, W]`` tensors."""
    if train.ndim == 3:
        train, test = train[:, None], test[:, None]
        channels_last = False
    mean, std = channel_stats_uint8(train, channel_axis=3 if channels_last else 1)
    out = []
    for arr in (train, test):
        x = torch.from_numpy(np.ascontiguousarray(arr))
        if channels_last:
            x = x.permute(0, 3, 1, 2).contiguous()  # reorder as uint8, before the 4x larger float copy
        x = x.to(torch.float32).div_(255.0)
        out.append(normalise(x, mean, std))
    return tuple(out)


# ------------------------------------------------------------------------------------------- datasets
class Digits(DatasetSource):
    """scikit-learn's embedded 8x8 digits (1797 images, 10 classes), fixed stratified 80/20 split.

    The split is ``train_test_split(test_size=0.2, stratify=y, random_state=0)`` (1437 train, 360
    test); ``data.root`` and ``data.download`` are ignored (the data ships with scikit-learn).
    """

    registry_name = "digits"
    reads_files = False

    def load(self, root: Path, download: bool) -> DatasetSplits:
        return _digits()


def _digits() -> DatasetSplits:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = digits.images.astype(np.float64) / 16.0  # values 0..16 -> [0, 1]
    y = digits.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, stratify=y, random_state=0)
    mean, std = np.array([x_tr.mean()]), np.array([x_tr.std()])
    train_x = normalise(torch.from_numpy(x_tr[:, None]).to(torch.float32), mean, std)
    test_x = normalise(torch.from_numpy(x_te[:, None]).to(torch.float32), mean, std)
    return DatasetSplits(
        name="digits",
        task="multiclass",
        num_classes=10,
        train_x=train_x,
        train_y=torch.from_numpy(y_tr),
        test_x=test_x,
        test_y=torch.from_numpy(y_te),
    )


def torchvision_splits(name: str, cls_name: str, root: Path, download: bool) -> tuple[Any, Any]:
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
                f"files ({first_line(e)}); check the network, delete partial files and retry"
            ) from None
        raise ConfigError(
            f"data.dataset={name!r}: no files under data.root='{root}'; set data.download=true to fetch them "
            "(needs network) or point data.root at an existing copy"
        ) from None
    except OSError as e:  # network errors (URLError is an OSError) or unreadable files
        raise ConfigError(
            f"data.dataset={name!r}: could not read or download files under data.root='{root}' "
            f"({first_line(e)}); check the network or point data.root at an existing copy"
        ) from None


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def as_numpy_uint8(data: Any) -> np.ndarray:
    arr = data.numpy() if isinstance(data, torch.Tensor) else np.asarray(data)
    return np.asarray(arr, dtype=np.uint8)


def load_torchvision(name: str, cls_name: str, num_classes: int, root: Path, download: bool) -> DatasetSplits:
    train, test = torchvision_splits(name, cls_name, root, download)
    tr, te = as_numpy_uint8(train.data), as_numpy_uint8(test.data)
    channels_last = tr.ndim == 4  # CIFAR: [N, 32, 32, 3]; MNIST family: [N, 28, 28]
    train_x, test_x = uint8_to_normalised(tr, te, channels_last)
    return DatasetSplits(
        name=name,
        task="multiclass",
        num_classes=num_classes,
        train_x=train_x,
        train_y=torch.as_tensor(np.asarray(train.targets), dtype=torch.int64),
        test_x=test_x,
        test_y=torch.as_tensor(np.asarray(test.targets), dtype=torch.int64),
    )


class MNIST(DatasetSource):
    """MNIST (LeCun et al., 1998): 60k/10k 28x28 grey digits, 10 classes, via torchvision."""

    registry_name = "mnist"

    def load(self, root: Path, download: bool) -> DatasetSplits:
        return load_torchvision("mnist", "MNIST", 10, root, download)


class CIFAR10(DatasetSource):
    """CIFAR-10 (Krizhevsky, 2009): 50k/10k 32x32 RGB images, 10 classes, via torchvision."""

    registry_name = "cifar10"

    def load(self, root: Path, download: bool) -> DatasetSplits:
        return load_torchvision("cifar10", "CIFAR10", 10, root, download)


class CIFAR100(DatasetSource):
    """CIFAR-100 (Krizhevsky, 2009): 50k/10k 32x32 RGB images, 100 fine classes, via torchvision."""

    registry_name = "cifar100"

    def load(self, root: Path, download: bool) -> DatasetSplits:
        return load_torchvision("cifar100", "CIFAR100", 100, root, download)


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


class Synthetic(DatasetSource):
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
    second and 120 MB. Former spellings: ``data.dataset=synthetic`` / ``synthetic:<like>`` with the
    arguments below under ``data.synthetic``.

    Unset arguments (None) take the values of the preset ``like`` names.

    Args:
        like: The dataset whose shape, classes, task and (smaller) sizes it mimics, one of
            :data:`SYNTHETIC_LIKE` (cifar10, cifar100, mnist, fashion_mnist, digits, tiny_imagenet, flair),
            e.g. ``cifar100`` runs a CIFAR-100 config anywhere; None: CIFAR-10-shaped.
        shape: Input shape ``[C, H, W]``.
        num_classes: Classes (labels of a multilabel task).
        multilabel: Multi-hot targets (each label on with probability ``1/L``, plus one drawn uniformly).
        train_size: Training samples.
        test_size: Test samples.
        noise: Std of the class-independent part relative to the class patterns; larger is harder.
            At the default 2, a linear classifier trained for 3 epochs reaches about 95% test accuracy
            on 10 classes (3k training samples) and about 70% on 100 (10k).
        seed: Seed of the generated data (the partition has its own, ``data.seed``).

    Raises:
        ConfigError: For an unknown preset or an argument out of range (the line names the field).
    """

    registry_name = "synthetic"
    reads_files = False
    former_options = ("synthetic", "SyntheticData")

    def __init__(
        self,
        like: str | None = None,
        shape: tuple[int, ...] | None = None,
        num_classes: int | None = None,
        multilabel: bool | None = None,
        train_size: int | None = None,
        test_size: int | None = None,
        noise: float = 2.0,
        seed: int = 0,
    ) -> None:
        if like is not None and like not in SYNTHETIC_LIKE:
            raise ConfigError(
                f"data.dataset.like={like!r} is not a synthetic preset; use one of "
                f"{', '.join(SYNTHETIC_LIKE)} "
                "(or null: CIFAR-10-shaped)"
            )
        self.like = like
        self.shape = None if shape is None else tuple(shape)
        self.num_classes = num_classes
        self.multilabel = multilabel
        self.train_size = train_size
        self.test_size = test_size
        self.noise = noise
        self.seed = seed
        self.resolved()  # check the arguments now (config time), not at the first load

    @property
    def key(self) -> str:
        return SYNTHETIC if self.like is None else f"{SYNTHETIC}:{self.like}"

    def fingerprint(self) -> dict[str, str]:
        """As before datasets were classes: ``data.dataset`` is ``synthetic[:<like>]`` and
        ``data.synthetic`` the other arguments."""
        args = ", ".join(f"{k}={v!r}" for k, v in self.args().items() if k != "like")
        return {"data.dataset": self.key, "data.synthetic": f"SyntheticData({args})"}

    def resolved(self) -> tuple[tuple[int, int, int], int, bool, int, int]:
        """``(shape, num_classes, multilabel, train_size, test_size)``: the arguments over the preset."""
        shape, classes, multilabel, train_size, test_size = SYNTHETIC_LIKE[self.like or "cifar10"]
        shape = self.shape if self.shape is not None else shape
        classes = self.num_classes if self.num_classes is not None else classes
        multilabel = self.multilabel if self.multilabel is not None else multilabel
        train_size = self.train_size if self.train_size is not None else train_size
        test_size = self.test_size if self.test_size is not None else test_size
        if len(shape) != 3 or min(shape) < 1:
            raise ConfigError(f"data.dataset.shape={list(shape)} must be [C, H, W] with positive sizes")
        if classes < 2:
            raise ConfigError(f"data.dataset.num_classes={classes} must be >= 2")
        if train_size < 1 or test_size < 1:
            raise ConfigError(
                f"data.dataset.train_size={train_size} and test_size={test_size} must both be >= 1"
            )
        if self.noise < 0:
            raise ConfigError(f"data.dataset.noise={self.noise} must be >= 0")
        c, h, w = (int(v) for v in shape)
        return (c, h, w), int(classes), bool(multilabel), int(train_size), int(test_size)

    def load(self, root: Path, download: bool) -> DatasetSplits:
        return synthetic_dataset(self)


def is_synthetic(dataset: DatasetSource | str) -> bool:
    """Whether ``dataset`` is the generated :class:`Synthetic` data (or its former name ``synthetic`` or
    ``synthetic:<like>``)."""
    if isinstance(dataset, DatasetSource):
        return isinstance(dataset, Synthetic)
    return dataset == SYNTHETIC or str(dataset).startswith(SYNTHETIC + ":")


def synthetic_dataset(dataset: Synthetic | str | None = None) -> DatasetSplits:
    """The splits of a :class:`Synthetic` dataset (or of its former name, ``synthetic:<like>``)."""
    from fl_lightning.functional.tensor import derive_seed

    opts = get_dataset(dataset or SYNTHETIC)
    assert isinstance(opts, Synthetic)
    (c, h, w), classes, multilabel, train_size, test_size = opts.resolved()
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
        name=opts.key,
        task="multilabel" if multilabel else "multiclass",
        num_classes=classes,
        train_x=normalise(train_x, mean, std),
        train_y=train_y,
        test_x=normalise(test_x, mean, std),
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
