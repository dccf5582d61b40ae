"""Per-client transforms: what a client's samples look like (feature skew, concept shift, label noise).

A partition says *who holds which samples*; a client transform says *how a client sees them*. It is the
second axis of heterogeneity (``data.client_transform``), composable with any partition and dataset:
partition x transform gives NIID-Bench's mixed settings. Each transform is one small class with
LightningCLI-typed arguments; the math lives in plain functions below it.

* :class:`GaussianNoise` -- NIID-Bench's noise-based feature skew: client ``i`` of ``m`` adds Gaussian noise
  of std ``sigma * i / (m - 1)`` to its inputs, drawn afresh at every access.
* :class:`Rotation` -- feature shift by groups: client ``i`` is in group ``g = i mod k``, whose inputs are
  rotated by ``g * 360 / k`` degrees.
* :class:`LabelPermutation` -- concept shift by groups (clustered FL, IFCA): group ``g = i mod k`` sees the
  labels through its own fixed permutation (group 0 keeps the dataset's labelling).
* :class:`LabelNoise` -- symmetric label noise with a client-specific flip rate.

**Where it applies.** A :class:`~fl_lightning.data.federated.ClientData` holds its federation's transform
and applies it wherever its samples are read: its training batches (one client at a time, vectorised,
in every process and on a Flower SuperNode: they all read through ``ClientData``), its local test data
(per-client and personalised evaluation), and the labels strategies read (``ClientData.train_labels``).

**Randomness.** The fixed choices (groups, permutations, flip rates and flipped samples) are seeded by
``(data.seed, client)`` with :func:`~fl_lightning.functional.tensor.derive_seed`-style keys, never by a
global RNG. Training noise is drawn from the client's own batch generator (seeded by ``(seed, round,
client)``), right after the batch's indices, so it is fresh at every access, reproducible, and the same
whichever execution path trains the client. Local test noise is drawn from a generator seeded by
``(data.seed, client)`` at every evaluation pass (the same noise each time, so rounds compare).

**The global test set** (``global/*``) under each transform is set by ``global_test``: ``"clean"``
evaluates the untransformed test set; ``"per_group"`` evaluates the test set once through each group's
transform, logging ``global/group<g>/*`` per group and, as ``global/*``, the union of the groups.
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import numpy as np
import torch
from torch import Tensor

from fl_lightning.errors import ConfigError, check_number
from fl_lightning.functional.tensor import derive_seed

__all__ = [
    "TRANSFORMS",
    "ClientTransform",
    "GaussianNoise",
    "LabelNoise",
    "LabelPermutation",
    "Rotation",
    "distinct_permutations",
    "flip_labels",
    "list_transforms",
    "noise_std",
    "rotate",
]

Split = Literal["train", "test"]
GlobalTest = Literal["clean", "per_group"]

# Stream keys of the seeds derived from data.seed (arbitrary constants, one per use).
_GROUPS = 0x7A1
_EVAL = 0x7A2
_TAKE = 0x7A3
_GLOBAL = 0x7A4
_FLIPS = 0x7A5
_SPLIT_KEY = {"train": 0, "test": 1}


# --------------------------------------------------------------------------------------------- the math
def noise_std(sigma: float, client: int, num_clients: int) -> float:
    """NIID-Bench's noise std of party ``client`` of ``num_clients``: ``sigma * client / (num_clients - 1)``.

    Reference: Q. Li, Y. Diao, Q. Chen, B. He, "Federated Learning on Non-IID Data Silos: An Experimental
    Study", ICDE 2022, Sec. III-B (noise-based feature imbalance); ``experiments.py`` of
    Xtra-Computing/NIID-Bench (``noise_level = args.noise / (args.n_parties - 1) * party_id``). A
    federation of one client has no noise.
    """
    return 0.0 if num_clients < 2 else sigma * client / (num_clients - 1)


def rotate(x: Tensor, degrees: float) -> Tensor:
    """``[B, C, H, W]`` images rotated counter-clockwise by ``degrees`` about their centre (torchvision's
    ``rotate``, bilinear, corners filled with 0: the mean of normalised inputs); exact for multiples of 90."""
    if degrees % 360 == 0:
        return x
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.v2 import functional as TF

    return TF.rotate(x, float(degrees), interpolation=InterpolationMode.BILINEAR)


def distinct_permutations(num_classes: int, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``k`` distinct permutations of ``0..num_classes-1``: the identity first, then seeded random ones.

    Raises:
        ValueError: If ``k`` exceeds ``num_classes!`` (there are not that many distinct permutations).
    """
    if k > math.factorial(min(num_classes, 20)):
        raise ValueError(f"{k} distinct permutations of {num_classes} labels do not exist")
    perms = [np.arange(num_classes)]
    seen = {tuple(perms[0])}
    while len(perms) < k:
        p = rng.permutation(num_classes)
        if tuple(p) not in seen:
            seen.add(tuple(p))
            perms.append(p)
    return perms


def flip_labels(labels: np.ndarray, rate: float, num_classes: int, rng: np.random.Generator) -> np.ndarray:
    """Symmetric label noise: each label is, with probability ``rate``, replaced by one of the other
    ``num_classes - 1`` classes drawn uniformly (so a flipped label is always wrong)."""
    labels = np.asarray(labels, dtype=np.int64)
    flip = rng.random(len(labels)) < rate
    shift = rng.integers(1, max(num_classes, 2), size=len(labels))
    return np.where(flip, (labels + shift) % num_classes, labels)


# ------------------------------------------------------------------------------------------- the classes
class ClientTransform:
    """Base: a per-client change of what a client's samples look like (``data.client_transform``).

    Subclasses set :attr:`name` and override :meth:`inputs` and/or :meth:`labels` (per client) and
    :meth:`group_inputs`/:meth:`group_labels` (per group, for the per-group global evaluation). The data
    module calls :meth:`bind` once its clients exist; from then on every
    :class:`~fl_lightning.data.federated.ClientData` of the federation applies the transform.

    Args:
        global_test: What ``global/*`` evaluates: ``"clean"`` the untransformed test set; ``"per_group"``
            the test set through each group's transform (``global/group<g>/*`` per group, ``global/*`` their
            union). None: the transform's default.
    """

    name: ClassVar[str] = ""
    #: ``global_test`` when None is given.
    default_global_test: ClassVar[GlobalTest] = "clean"
    #: Whether the transform draws random numbers at every access (it then needs a generator).
    random: ClassVar[bool] = False

    def __init__(self, global_test: GlobalTest | None = None) -> None:
        if global_test not in (None, "clean", "per_group"):
            raise ConfigError(
                f"data.client_transform.global_test={global_test!r} must be clean or per_group (or null)"
            )
        self.global_test = global_test
        self._seed = 0
        self._num_clients = 0
        self._num_classes = 0
        self._copies: dict[tuple[object, torch.device], Tensor] = {}

    # ----------------------------------------------------------------------------- binding
    @property
    def evaluation(self) -> GlobalTest:
        """What ``global/*`` evaluates (``global_test``, or the transform's default)."""
        return self.global_test or self.default_global_test

    def bind(
        self, clients: list, num_classes: int, task: str, input_shape: tuple[int, ...], seed: int
    ) -> None:
        """Fix the per-client choices for this federation and attach the transform to every client.

        Args:
            clients: The federation's :class:`~fl_lightning.data.federated.ClientData`.
            num_classes: Classes of the dataset.
            task: ``"multiclass"`` or ``"multilabel"``.
            input_shape: Shape of one input (``[C, H, W]`` for images).
            seed: ``data.seed``.

        Raises:
            ConfigError: If the transform does not fit the data (one line naming the field).
        """
        self._seed, self._num_clients, self._num_classes = int(seed), len(clients), int(num_classes)
        self._copies = {}
        self.check(len(clients), num_classes, task, input_shape)
        self._bind(clients)
        for c in clients:
            c.transform = self

    def check(self, num_clients: int, num_classes: int, task: str, input_shape: tuple[int, ...]) -> None:
        """Raise a one-line ConfigError if the transform cannot apply to this data (override)."""

    def _bind(self, clients: list) -> None:
        """Precompute per-client tables (override)."""

    @property
    def num_groups(self) -> int:
        """Groups of clients that share a transform (one per client for per-client ones)."""
        return self._num_clients

    def group_of(self, client: int) -> int:
        """The group of ``client``."""
        return client

    def describe(self, client: int) -> str:
        """What ``client``'s samples go through, in a few words (the TensorBoard card)."""
        return ""

    # ----------------------------------------------------------------------------- applying
    def inputs(self, client: int, x: Tensor, split: Split, generator: torch.Generator | None) -> Tensor:
        """``client``'s inputs ``x`` (a batch) as the client sees them."""
        return x

    def labels(self, client: int, y: Tensor, idx: Tensor, split: Split) -> Tensor:
        """``client``'s labels ``y`` of the samples ``idx`` (rows of the split's tensors) as it sees them."""
        return y

    def apply(
        self, client: int, x: Tensor, y: Tensor, idx: Tensor, split: Split, generator: torch.Generator | None
    ) -> tuple[Tensor, Tensor]:
        """:meth:`inputs` and :meth:`labels` of one batch."""
        return self.inputs(client, x, split, generator), self.labels(client, y, idx, split)

    def group_inputs(self, group: int, x: Tensor, generator: torch.Generator | None) -> Tensor:
        """Test inputs as group ``group`` sees them (per-group global evaluation)."""
        return x

    def group_labels(self, group: int, y: Tensor) -> Tensor:
        """Test labels as group ``group`` sees them (per-group global evaluation)."""
        return y

    def _on(self, key: object, t: Tensor, device: torch.device) -> Tensor:
        """``t`` (a host table, named ``key``) on ``device``, copied there once rather than every batch."""
        if t.device == device:
            return t
        if (key, device) not in self._copies:
            self._copies[key, device] = t.to(device)
        return self._copies[key, device]

    # ----------------------------------------------------------------------------- generators
    def eval_generator(self, client: int) -> torch.Generator | None:
        """A fresh generator for one pass over ``client``'s local evaluation data (None if not random)."""
        return self._generator(_EVAL, client) if self.random else None

    def take_generator(self, client: int) -> torch.Generator | None:
        """A fresh generator for a read of ``client``'s samples outside its batches (None if not random)."""
        return self._generator(_TAKE, client) if self.random else None

    def global_generator(self, group: int, batch: int) -> torch.Generator | None:
        """The generator of batch ``batch`` of group ``group``'s pass over the global test set."""
        return self._generator(_GLOBAL, group, batch) if self.random else None

    def _generator(self, *keys: int) -> torch.Generator:
        return torch.Generator().manual_seed(derive_seed(self._seed, *keys))

    # ----------------------------------------------------------------------------- description
    def _args(self) -> dict[str, object]:
        args = {k: v for k, v in vars(self).items() if not k.startswith("_") and k != "global_test"}
        return args if self.global_test is None else {**args, "global_test": self.global_test}

    def __repr__(self) -> str:
        cls = next(c for c in type(self).__mro__ if not c.__module__.startswith("jsonargparse"))
        return f"{cls.__name__}({', '.join(f'{k}={v!r}' for k, v in self._args().items())})"

    def card(self, max_rows: int = 50) -> str:
        """Markdown for TensorBoard: the transform, what ``global/*`` is, each client's group and setting."""
        what = (
            "the untransformed test set"
            if self.evaluation == "clean"
            else f"the test set through each of the {self.num_groups} groups' transforms "
            "(global/group<g>/* per group, global/* their union)"
        )
        head = [f"**{self!r}**", "", f"global/* evaluates {what}.", ""]
        rows = ["| client | group | transform |", "|---|---|---|"]
        m = self._num_clients
        rows += [f"| {i} | {self.group_of(i)} | {self.describe(i)} |" for i in range(min(m, max_rows))]
        if m > max_rows:
            rows.append(f"| … {m - max_rows} more | | |")
        return "\n".join(head + rows)


def _check_k(k: int, field: str) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ConfigError(f"{field}={k!r} must be an integer >= 1 (the number of groups); e.g. 4")
    return int(k)


def _check_groups_fit(k: int, num_clients: int, field: str) -> None:
    if k > num_clients:
        raise ConfigError(
            f"{field}={k} exceeds data.num_clients={num_clients}: a group would have no client; "
            f"use at most {num_clients} groups"
        )


def _check_images(input_shape: tuple[int, ...], what: str) -> None:
    if len(input_shape) != 3:
        raise ConfigError(
            f"data.client_transform={what} needs image inputs [C, H, W], but the dataset's inputs have shape "
            f"{list(input_shape)}; use it with an image dataset (digits, mnist, fashion_mnist, cifar10, ...)"
        )


class GaussianNoise(ClientTransform):
    """NIID-Bench's noise-based feature skew: client ``i`` of ``m`` adds ``N(0, s_i^2)`` noise to its inputs,
    ``s_i = sigma * i / (m - 1)`` (client 0 clean, client ``m-1`` the noisiest), drawn afresh at every access.

    The noise is added to the dataset's inputs as this package stores them: normalised per channel with the
    training split's mean and std, so ``sigma`` is in units of the data's std. (NIID-Bench adds it after
    ``ToTensor``: for MNIST-like data, pixels in [0, 1] with std about 0.3, so its ``sigma`` is about a third
    of the same number here.) Its local test data get the client's own noise level too; NIID-Bench's global
    test set is the union of every party's noisy copy of the test set, which is ``global_test: per_group``
    here (one group per client: ``m`` passes over the test set per evaluation); the default, ``clean``,
    evaluates the untransformed test set.

    Reference: Li et al., ICDE 2022, Sec. III-B; Xtra-Computing/NIID-Bench, ``experiments.py`` and
    ``utils.AddGaussianNoise``.

    Args:
        sigma: The noise std of the last client (in units of the normalised inputs), >= 0.
        global_test: ``clean`` (default) or ``per_group`` (NIID-Bench's noisy global test set).
    """

    name = "gaussian_noise"
    random = True

    def __init__(self, sigma: float = 0.1, global_test: GlobalTest | None = None) -> None:
        super().__init__(global_test)
        check_number(sigma, "data.client_transform.sigma", low=0, hint="e.g. 0.1 (NIID-Bench)")
        self.sigma = float(sigma)

    def _bind(self, clients: list) -> None:
        if clients and not clients[0].x.is_floating_point():
            _add_noise(clients[0].x[:1], 1.0, None)  # the one-line error for token inputs

    def std(self, client: int) -> float:
        """The noise std of ``client``."""
        return noise_std(self.sigma, client, self._num_clients)

    def describe(self, client: int) -> str:
        return f"noise std {self.std(client):.4g}"

    def inputs(self, client: int, x: Tensor, split: Split, generator: torch.Generator | None) -> Tensor:
        return _add_noise(x, self.std(client), generator)

    def group_inputs(self, group: int, x: Tensor, generator: torch.Generator | None) -> Tensor:
        return _add_noise(x, self.std(group), generator)


def _add_noise(x: Tensor, std: float, generator: torch.Generator | None) -> Tensor:
    if std == 0:
        return x
    if not x.is_floating_point():
        raise ConfigError(
            f"data.client_transform=GaussianNoise needs float inputs, but the dataset's are {x.dtype} "
            "(token ids); use LabelPermutation or LabelNoise with text data"
        )
    if generator is None:
        raise ValueError("GaussianNoise draws from a generator: pass one")
    # Drawn on the host from the (CPU) generator, so the values do not depend on the device.
    noise = torch.randn(x.shape, generator=generator, dtype=torch.float32)
    return x + noise.to(device=x.device, dtype=x.dtype).mul_(std)


class Rotation(ClientTransform):
    """Feature shift by groups: client ``i`` is in group ``g = i mod k``, whose images are rotated by
    ``g * 360 / k`` degrees counter-clockwise (``k = 4``: 0, 90, 180, 270; group 0 unrotated).

    The rotated-data setting of personalised and clustered FL (e.g. rotated MNIST/CIFAR in IFCA, Ghosh et
    al., NeurIPS 2020, Sec. 5). Deterministic (no random draws). The default ``global_test: per_group``
    evaluates the test set at every group's angle (``global/group<g>/*``; ``global/*`` their union);
    ``clean`` evaluates it unrotated (group 0's view).

    Args:
        k: The number of groups (>= 1; at most ``data.num_clients``).
        global_test: ``per_group`` (default) or ``clean``.
    """

    name = "rotation"
    default_global_test = "per_group"

    def __init__(self, k: int = 4, global_test: GlobalTest | None = None) -> None:
        super().__init__(global_test)
        self.k = _check_k(k, "data.client_transform.k")

    def check(self, num_clients: int, num_classes: int, task: str, input_shape: tuple[int, ...]) -> None:
        _check_groups_fit(self.k, num_clients, "data.client_transform.k")
        _check_images(input_shape, "Rotation")

    @property
    def num_groups(self) -> int:
        return self.k

    def group_of(self, client: int) -> int:
        return client % self.k

    def angle(self, group: int) -> float:
        """The rotation of group ``group`` in degrees: ``group * 360 / k``."""
        return group * 360.0 / self.k

    def describe(self, client: int) -> str:
        return f"rotated {self.angle(self.group_of(client)):g} degrees"

    def inputs(self, client: int, x: Tensor, split: Split, generator: torch.Generator | None) -> Tensor:
        return rotate(x, self.angle(self.group_of(client)))

    def group_inputs(self, group: int, x: Tensor, generator: torch.Generator | None) -> Tensor:
        return rotate(x, self.angle(group))


class LabelPermutation(ClientTransform):
    """Concept shift by groups: client ``i`` is in group ``g = i mod k``, which sees label ``c`` as
    ``perm_g[c]``; group 0 keeps the dataset's labels, the others have distinct seeded permutations.

    The same inputs mean different things in different groups (the label-swapped setting of clustered FL,
    e.g. Sattler et al., IEEE TNNLS 2020; Ghosh et al., NeurIPS 2020). Permutations are drawn from
    ``data.seed`` and fixed for the run. One global model cannot fit every group, so the default
    ``global_test: per_group`` evaluates the test set under each group's labelling (``global/group<g>/*``;
    ``global/*`` is their union, a measure of how well one model serves all groups at once); the metrics to
    read are ``personal/*`` and ``z_client/*`` (each client on its own labelling) and the per-group ones.
    ``clean`` evaluates the dataset's own labels (group 0's task). Multilabel targets have their label
    columns permuted.

    Args:
        k: The number of groups (>= 1; at most ``data.num_clients`` and the number of distinct permutations).
        global_test: ``per_group`` (default) or ``clean``.
    """

    name = "label_permutation"
    default_global_test = "per_group"

    def __init__(self, k: int = 4, global_test: GlobalTest | None = None) -> None:
        super().__init__(global_test)
        self.k = _check_k(k, "data.client_transform.k")
        self._perms: list[Tensor] = []
        self._multilabel = False

    def check(self, num_clients: int, num_classes: int, task: str, input_shape: tuple[int, ...]) -> None:
        _check_groups_fit(self.k, num_clients, "data.client_transform.k")
        if num_classes < 2 or self.k > math.factorial(min(num_classes, 20)):
            raise ConfigError(
                f"data.client_transform.k={self.k} exceeds the {math.factorial(min(num_classes, 20))} "
                f"distinct permutations of the dataset's {num_classes} labels; use a smaller k"
            )

    def _bind(self, clients: list) -> None:
        self._multilabel = bool(clients) and clients[0].y.ndim == 2
        rng = np.random.default_rng([self._seed, _GROUPS])
        self._perms = [torch.from_numpy(p) for p in distinct_permutations(self._num_classes, self.k, rng)]

    @property
    def num_groups(self) -> int:
        return self.k

    def group_of(self, client: int) -> int:
        return client % self.k

    def permutation(self, group: int) -> Tensor:
        """Group ``group``'s permutation: label ``c`` reads ``permutation(group)[c]``."""
        return self._perms[group]

    def describe(self, client: int) -> str:
        g = self.group_of(client)
        return "labels unchanged" if g == 0 else f"labels permuted: {self._perms[g].tolist()}"

    def labels(self, client: int, y: Tensor, idx: Tensor, split: Split) -> Tensor:
        return self.group_labels(self.group_of(client), y)

    def group_labels(self, group: int, y: Tensor) -> Tensor:
        if group == 0:
            return y
        perm = self._on(("perm", group), self._perms[group], y.device)
        if self._multilabel:  # column c of the result is the original column inv[c]
            return y[..., torch.argsort(perm)]
        return perm[y]


class LabelNoise(ClientTransform):
    """Symmetric label noise with a client-specific flip rate.

    ``round(noisy_fraction * m)`` clients, drawn from ``data.seed``, are noisy; noisy client ``i`` has the
    flip rate ``r_i ~ U(min_rate, max_rate)`` (seeded by ``(data.seed, i)``), the others 0. Each of the
    client's samples, in its training and in its local test data, keeps its label with probability
    ``1 - r_i`` or gets one of the other classes uniformly (drawn once, seeded by ``(data.seed, i)``, and
    fixed for the run, as in a dataset with noisy labels). This is the heterogeneous label noise of
    FedCorr (Xu et al., CVPR 2022, Sec. 5.1: a fraction ``rho`` of noisy clients, each with a noise level
    drawn from a uniform distribution). ``global/*`` evaluates the clean test set (labels as published).

    Args:
        max_rate: Upper bound of the flip rates, in [0, 1].
        min_rate: Lower bound of the flip rates, in [0, max_rate].
        noisy_fraction: Fraction of clients that are noisy, in [0, 1].
    """

    name = "label_noise"

    def __init__(self, max_rate: float = 0.5, min_rate: float = 0.0, noisy_fraction: float = 1.0) -> None:
        super().__init__("clean")
        check_number(max_rate, "data.client_transform.max_rate", low=0, high=1, hint="e.g. 0.5")
        check_number(
            min_rate, "data.client_transform.min_rate", low=0, high=max_rate, hint="(at most max_rate)"
        )
        check_number(noisy_fraction, "data.client_transform.noisy_fraction", low=0, high=1, hint="e.g. 0.4")
        self.max_rate, self.min_rate, self.noisy_fraction = (
            float(max_rate),
            float(min_rate),
            float(noisy_fraction),
        )
        self._rates: list[float] = []
        self._tables: dict[tuple[int, str], tuple[Tensor, Tensor]] = {}

    def _args(self) -> dict[str, object]:
        return {k: v for k, v in vars(self).items() if not k.startswith("_") and k != "global_test"}

    def check(self, num_clients: int, num_classes: int, task: str, input_shape: tuple[int, ...]) -> None:
        if task != "multiclass":
            raise ConfigError(
                f"data.client_transform=LabelNoise needs a multiclass dataset, not a {task} one; "
                "use LabelPermutation for multilabel data"
            )

    @property
    def num_groups(self) -> int:
        return 1

    def group_of(self, client: int) -> int:
        return 0

    def rate(self, client: int) -> float:
        """The flip rate of ``client``."""
        return self._rates[client]

    def describe(self, client: int) -> str:
        return f"flip rate {self.rate(client):.3f}"

    def _bind(self, clients: list) -> None:
        m = len(clients)
        noisy = np.random.default_rng([self._seed, _GROUPS]).permutation(m)[: round(self.noisy_fraction * m)]
        self._rates = [0.0] * m
        for i in noisy.tolist():
            u = np.random.default_rng([self._seed, _FLIPS, i]).random()
            self._rates[i] = self.min_rate + (self.max_rate - self.min_rate) * float(u)
        self._tables = {}
        for c in clients:
            for split, idx, y in (("train", c.train_idx, c.y), ("test", c.test_idx, c.test_labels_source)):
                keys = np.unique(idx.numpy())
                rng = np.random.default_rng([self._seed, _FLIPS, c.client_id, _SPLIT_KEY[split]])
                values = flip_labels(y.cpu().numpy()[keys], self._rates[c.client_id], self._num_classes, rng)
                self._tables[c.client_id, split] = (torch.from_numpy(keys), torch.from_numpy(values))

    def labels(self, client: int, y: Tensor, idx: Tensor, split: Split) -> Tensor:
        if self._rates[client] == 0:
            return y
        keys, values = self._tables[client, split]
        keys = self._on(("keys", client, split), keys, idx.device)
        values = self._on(("values", client, split), values, y.device)
        return values[torch.searchsorted(keys, idx)].to(y.dtype)


# ----------------------------------------------------------------------------------------- registry
TRANSFORMS: dict[str, type[ClientTransform]] = {
    cls.name: cls for cls in (GaussianNoise, Rotation, LabelPermutation, LabelNoise)
}


def list_transforms() -> list[str]:
    """Registered client transform names, sorted."""
    return sorted(TRANSFORMS)
