"""What every split shares: the checks of its arguments, the redraw-until-valid loop, the Dirichlet rows,
the per-client class counts and the :class:`Partitioner` base class."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import ClassVar

import numpy as np

from fl_lightning.errors import ConfigError


# ----------------------------------------------------------------------------------------- validation
def check_num_clients(num_samples: int, num_clients: int, dataset: str | None = None) -> None:
    """Check that ``num_clients`` is between 1 and the number of training samples.

    Args:
        num_samples: Size of the training set.
        num_clients: Requested number of clients (``data.num_clients``).
        dataset: Dataset name, only used in the error message.

    Raises:
        ConfigError: If ``num_clients < 1`` or ``num_clients > num_samples``.
    """
    if isinstance(num_clients, bool) or not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
        raise ConfigError(f"data.num_clients={num_clients!r} must be an integer >= 1")
    if num_clients > num_samples:
        of = f" of {dataset!r}" if dataset else ""
        raise ConfigError(
            f"data.num_clients={num_clients} exceeds the {num_samples} training samples{of}; "
            f"use at most {num_samples} clients"
        )


def _check_alpha(alpha: float) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.number)):
        raise ConfigError(f"data.partition.alpha={alpha!r} must be a number > 0 (Dirichlet concentration)")
    alpha = float(alpha)
    if not math.isfinite(alpha) or alpha <= 0:
        raise ConfigError(
            f"data.partition.alpha={alpha} must be > 0 (Dirichlet concentration); "
            "use e.g. 0.1 for strong or 100 for mild label skew"
        )
    return alpha


def _check_classes_per_client(classes_per_client: int, num_classes: int | None = None) -> int:
    c = classes_per_client
    if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < 1:
        raise ConfigError(
            f"data.partition.classes_per_client={c!r} must be an integer >= 1; "
            "use e.g. 2 for strong label skew"
        )
    if num_classes is not None and c > num_classes:
        raise ConfigError(
            f"data.partition.classes_per_client={c} exceeds the {num_classes} classes of the dataset; "
            f"use a value between 1 and {num_classes}"
        )
    return int(c)


def _check_min_size(min_size: int) -> int:
    if isinstance(min_size, bool) or not isinstance(min_size, (int, np.integer)) or min_size < 0:
        raise ConfigError(f"data.partition.min_size={min_size!r} must be an integer >= 0; use e.g. 10")
    return int(min_size)


def _as_labels(labels: np.ndarray) -> np.ndarray:
    """Return ``labels`` as a 1-D non-negative int64 array."""
    y = np.asarray(labels)
    if y.ndim != 1:
        raise ValueError(f"partitioners need 1-D class labels, got an array of shape {y.shape}")
    if y.size and (not np.issubdtype(y.dtype, np.integer) and not np.all(np.mod(y, 1) == 0)):
        raise ValueError("partitioners need integer class labels")
    y = y.astype(np.int64, copy=False)
    if y.size and y.min() < 0:
        raise ValueError("class labels must be >= 0")
    return y


def _class_indices(labels: np.ndarray) -> list[np.ndarray]:
    """Indices of each class ``0..max(labels)`` (empty arrays for absent classes), ascending."""
    num_classes = int(labels.max()) + 1 if labels.size else 0
    order = np.argsort(labels, kind="stable")
    bounds = np.searchsorted(labels[order], np.arange(num_classes + 1))
    return [order[bounds[k] : bounds[k + 1]] for k in range(num_classes)]


def _sorted_parts(parts: list[np.ndarray]) -> list[np.ndarray]:
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


#: The run-away guard of the redraw loops: no valid setting comes near it (NIID-Bench's quantity skew at
#: beta = 0.1 with 10 parties needs a median of ~200 draws, ~1,400 at worst).
RUNAWAY_DRAWS = 1_000_000

#: Array cells (floats) one batch of redraws may take; bounds the batch size of large federations.
_BATCH_CELLS = 1 << 22


def _first_valid_draw(
    draw: Callable[[int], tuple[np.ndarray, object]], cells_per_draw: int, min_size: int, max_draws: int
) -> tuple[object, int, int]:
    """Redraw until valid, in vectorised batches: the first draw whose every client has ``min_size``.

    ``draw(b)`` makes ``b`` independent draws and returns their ``[b, m]`` client sizes and whatever the
    caller needs to build the partition from a draw (indexed by the draw's row). The batches grow 1, 2,
    4, ... up to 256 draws (fewer when a draw is large), and the first valid draw of the whole sequence is
    accepted, so the accepted draw has exactly the distribution of NIID-Bench's one-at-a-time
    redraw-until-valid loop (the draws are i.i.d.; where the first draw is valid, the random stream used is
    the same as drawing once). Only the draws after the accepted one within its batch are wasted.

    Returns:
        ``(payload, row, draws)``: the accepted batch's payload, the accepted draw's row in it, and the
        number of draws made up to and including it; ``row`` is -1 if none of ``max_draws`` was valid.
    """
    cap = max(1, min(256, _BATCH_CELLS // max(1, cells_per_draw)))
    batch, drawn, payload = 1, 0, None
    while drawn < max_draws:
        b = min(batch, max_draws - drawn)
        sizes, payload = draw(b)
        ok = np.flatnonzero(sizes.min(axis=1) >= min_size)
        if len(ok):
            return payload, int(ok[0]), drawn + int(ok[0]) + 1
        drawn += b
        batch = min(2 * batch, cap)
    return payload, -1, drawn


def _runaway_error(min_size: int, draws: int, setting: str) -> ConfigError:
    return ConfigError(
        f"data.partition.min_size={min_size} was met by none of {draws} draws ({setting}); that is the "
        "run-away guard, far beyond what a valid setting needs, so this setting (all but) never gives every "
        "client that many; lower data.partition.min_size, raise data.partition.alpha or use fewer "
        "data.num_clients"
    )


def _check_max_draws(max_draws: int) -> int:
    if isinstance(max_draws, bool) or not isinstance(max_draws, (int, np.integer)) or max_draws < 1:
        raise ValueError(f"max_draws={max_draws!r} must be an integer >= 1")
    return int(max_draws)


def _check_positive_min_size(min_size: int) -> int:
    if isinstance(min_size, bool) or not isinstance(min_size, (int, np.integer)) or min_size < 1:
        raise ConfigError(
            f"data.partition.min_size={min_size!r} must be an integer >= 1 (a client without samples cannot "
            "train); use e.g. 10"
        )
    return int(min_size)


def _dirichlet_rows(rng: np.random.Generator, conc: np.ndarray, rows: int) -> np.ndarray:
    """``rows`` draws from ``Dir(conc)``; a degenerate draw (all-zero underflow) becomes one-hot.

    For tiny concentrations every Gamma variate can underflow to zero; the limit of such a draw is
    a one-hot vector on a random coordinate, which is what is returned then.
    """
    p = rng.dirichlet(conc, size=rows)
    bad = ~np.isfinite(p).all(axis=1) | (p.sum(axis=1) <= 0)
    for r in np.flatnonzero(bad):
        p[r] = 0.0
        p[r, rng.integers(len(conc))] = 1.0
    return p


def partition_counts(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
    """Per-client class counts.

    Args:
        labels: ``[N]`` int class labels, or ``[N, L]`` 0/1 multilabel targets.
        parts: One index array per client (repeated indices are counted each time).
        num_classes: Number of classes ``C`` (``L`` for multilabel targets).

    Returns:
        ``[m, C]`` int64 matrix; entry ``(i, k)`` counts the samples of client ``i`` with label ``k``
        (for multilabel targets, the occurrences of label ``k``).
    """
    y = np.asarray(labels)
    counts = np.zeros((len(parts), num_classes), dtype=np.int64)
    for i, p in enumerate(parts):
        p = np.asarray(p, dtype=np.int64)
        if y.ndim == 1:
            counts[i] = np.bincount(y[p].astype(np.int64), minlength=num_classes)[:num_classes]
        else:
            counts[i] = (y[p] > 0).sum(axis=0, dtype=np.int64)[:num_classes]
    return counts


# ---------------------------------------------------------------------------------- configurable classes
class Partitioner:
    """Base: splits a labelled training set into client index arrays.

    Subclasses set :attr:`name` (the registry name) and implement :meth:`__call__`; their
    ``__init__`` arguments are the ``data.partition.init_args`` of the YAML config and are
    validated there (raising :class:`~fl_lightning.errors.ConfigError`).
    """

    name: ClassVar[str] = ""

    def __call__(self, labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        """Split ``labels`` over ``num_clients`` clients.

        Args:
            labels: 1-D int class labels of the training set.
            num_clients: Number of clients ``m``.
            rng: Source of randomness.

        Returns:
            One sorted int64 index array per client.
        """
        raise NotImplementedError

    def _args(self) -> dict[str, object]:
        """The constructor arguments, which subclasses keep as public attributes of the same names."""
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}

    def __repr__(self) -> str:
        # Skip the wrapper classes of jsonargparse's lazy_instance so the repr is stable.
        cls = next(c for c in type(self).__mro__ if not c.__module__.startswith("jsonargparse"))
        args = ", ".join(f"{k}={v!r}" for k, v in self._args().items())
        return f"{cls.__name__}({args})"
