"""FedProx's Synthetic(alpha, beta): 30 devices with their own models and inputs, generated in memory.

Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, "Federated Optimization in Heterogeneous Networks"
(MLSys 2020), Sec. 5.1, and its generator ``data/synthetic_1_1/generate_synthetic.py`` (non-IID) and
``data/synthetic_iid/generate_iid.py`` (IID) of litian96/FedProx. For device ``k`` of 30:

* ``u_k ~ N(0, alpha)``, ``B_k ~ N(0, beta)`` (the code's ``np.random.normal(0, alpha)``: alpha and beta
  are standard deviations);
* ``W_k ~ N(u_k, 1)`` (``60 x 10``), ``b_k ~ N(u_k, 1)`` (10): alpha controls how much the local models
  differ;
* ``v_k ~ N(B_k, 1)`` (60), ``x ~ N(v_k, Sigma)`` with ``Sigma`` diagonal, ``Sigma_jj = j^-1.2``: beta
  controls how much the local inputs differ;
* ``y = argmax(softmax(W_k^T x + b_k))``;
* the number of samples follows a power law: ``floor(lognormal(4, 2)) + 50``.

The IID variant (``iid: true``) shares one ``W, b ~ N(0, 1)`` and ``v_k = 0`` over the devices (alpha and
beta are not used). Each device's samples are shuffled and its first ``int(0.9 n)`` train, the rest are its
test data (the generator's split; the paper's text does not state it). The draws follow the code's order
(sizes, ``u``, ``B``, ``v_k`` for every device, then ``W_k``, ``b_k``, ``x`` device by device), from a
``numpy`` generator seeded with ``seed`` (the code is unseeded, so its exact numbers cannot be matched).

``data.dataset: FedProxSynthetic`` with ``data.partition: NaturalUsers`` makes each device a client (its
local test split: its own test data); ``--data.dataset=FedProxSynthetic --data.dataset.alpha=1
--data.dataset.beta=1`` is Synthetic(1,1) (former spelling: ``--data.dataset=fedprox_synthetic
--data.fedprox_synthetic.alpha=1``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fl_lightning.data.datasets import DatasetSource, DatasetSplits
from fl_lightning.errors import ConfigError, check_number

__all__ = ["FedProxSynthetic", "fedprox_synthetic", "generate_devices"]

NAME = "fedprox_synthetic"


class FedProxSynthetic(DatasetSource):
    """FedProx's Synthetic(alpha, beta) (see the module); defaults: Synthetic(1,1). Generated: ``data.root``
    and ``data.download`` are not used.

    Args:
        alpha: Std of the devices' model means ``u_k`` (how much local models differ), >= 0.
        beta: Std of the devices' input means ``B_k`` (how much local inputs differ), >= 0.
        iid: FedProx's IID variant (one shared model, zero-mean inputs; alpha and beta unused).
        num_devices: Devices (FedProx: 30).
        dimension: Input dimension (FedProx: 60).
        num_classes: Classes (FedProx: 10).
        train_fraction: Share of each device's samples that trains (FedProx's generator: 0.9).
        seed: Seed of the generator (the partition has its own, ``data.seed``).

    Raises:
        ConfigError: For an argument out of range (the line names it).
    """

    registry_name = NAME
    brings_users = True
    reads_files = False
    former_options = ("fedprox_synthetic", "FedProxSyntheticData")

    def __init__(
        self,
        alpha: float = 1.0,
        beta: float = 1.0,
        iid: bool = False,
        num_devices: int = 30,
        dimension: int = 60,
        num_classes: int = 10,
        train_fraction: float = 0.9,
        seed: int = 0,
    ) -> None:
        check_number(alpha, "data.dataset.alpha", low=0, hint="FedProx: 0, 0.5 or 1")
        check_number(beta, "data.dataset.beta", low=0, hint="FedProx: 0, 0.5 or 1")
        check_number(
            train_fraction, "data.dataset.train_fraction", low=0, high=1, low_open=True, high_open=True,
            hint="FedProx's generator: 0.9",
        )  # fmt: skip
        for field, value, low in (
            ("num_devices", num_devices, 1),
            ("dimension", dimension, 1),
            ("num_classes", num_classes, 2),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"data.dataset.{field}={value!r} must be an integer >= {low}")
        self.alpha = alpha
        self.beta = beta
        self.iid = iid
        self.num_devices = num_devices
        self.dimension = dimension
        self.num_classes = num_classes
        self.train_fraction = train_fraction
        self.seed = seed

    def load(self, root: Path, download: bool) -> DatasetSplits:
        return fedprox_synthetic(self)


def generate_devices(
    alpha: float,
    beta: float,
    iid: bool,
    rng: np.random.Generator,
    num_devices: int = 30,
    dimension: int = 60,
    num_classes: int = 10,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Every device's ``(x [n_k, dimension] float64, y [n_k] int64)`` as FedProx's generator draws them."""
    sizes = rng.lognormal(4, 2, num_devices).astype(int) + 50
    cov = np.diag(np.power(np.arange(1, dimension + 1, dtype=np.float64), -1.2))
    if iid:
        means_x = np.zeros((num_devices, dimension))
        w_shared = rng.normal(0, 1, (dimension, num_classes))
        b_shared = rng.normal(0, 1, num_classes)
    else:
        mean_w = rng.normal(0, alpha, num_devices)
        mean_b = mean_w
        big_b = rng.normal(0, beta, num_devices)
        means_x = np.stack([rng.normal(big_b[k], 1, dimension) for k in range(num_devices)])
    xs, ys = [], []
    for k in range(num_devices):
        if iid:
            w, b = w_shared, b_shared
        else:
            w = rng.normal(mean_w[k], 1, (dimension, num_classes))
            b = rng.normal(mean_b[k], 1, num_classes)
        x = rng.multivariate_normal(means_x[k], cov, int(sizes[k]))
        xs.append(x)
        ys.append(np.argmax(x @ w + b, axis=1).astype(np.int64))  # argmax of the softmax
    return xs, ys


def fedprox_synthetic(options: FedProxSynthetic | None = None) -> DatasetSplits:
    """Synthetic(alpha, beta) (or the IID variant) with each device's own train/test split."""
    o = options or FedProxSynthetic()
    rng = np.random.default_rng(o.seed)
    xs, ys = generate_devices(o.alpha, o.beta, o.iid, rng, o.num_devices, o.dimension, o.num_classes)
    parts: dict[str, list[np.ndarray]] = {
        k: [] for k in ("train_x", "train_y", "test_x", "test_y", "tr_u", "te_u")
    }
    for k, (x, y) in enumerate(zip(xs, ys)):
        order = rng.permutation(len(y))
        n_train = int(o.train_fraction * len(y))
        tr, te = order[:n_train], order[n_train:]
        parts["train_x"].append(x[tr])
        parts["train_y"].append(y[tr])
        parts["test_x"].append(x[te])
        parts["test_y"].append(y[te])
        parts["tr_u"].append(np.full(len(tr), k, dtype=np.int64))
        parts["te_u"].append(np.full(len(te), k, dtype=np.int64))
    cat = {k: np.concatenate(v) for k, v in parts.items()}
    return DatasetSplits(
        name=NAME,
        task="multiclass",
        num_classes=o.num_classes,
        train_x=torch.from_numpy(cat["train_x"].astype(np.float32)),
        train_y=torch.from_numpy(cat["train_y"]),
        test_x=torch.from_numpy(cat["test_x"].astype(np.float32)),
        test_y=torch.from_numpy(cat["test_y"]),
        users=[f"f_{k:05d}" for k in range(o.num_devices)],
        train_users=cat["tr_u"],
        test_users=cat["te_u"],
    )
