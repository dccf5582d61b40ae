"""Splitting a labelled training set over the clients of a federation.

The math lives in plain functions that take the labels, the number of clients ``m`` and a
``np.random.Generator`` (all randomness comes from it; nothing is seeded globally) and return one
sorted ``int64`` index array per client. The :class:`Partitioner` classes are thin, configurable
wrappers around them (``data.partition`` in the YAML config) with a name registry.

Three families are provided:

* **Without replacement** (:func:`iid_partition`, :func:`dirichlet_partition`,
  :func:`pathological_partition`, :func:`label_quantity_partition`): every training sample goes to at
  most one client.
* **With replacement** (:func:`refill_partition` and its wrappers): the FedDyn / FL-Simulator
  sampler used by the FedSMOO paper. Clients have equal sizes, a sample may be held by several
  clients (and, after a class pool is refilled, twice by the same client), and the per-class totals
  over the federation are unequal.
* **Natural** (:class:`NaturalUsers`): one client per user of a dataset that has users.

:func:`quantity_skew_partition` (IID labels, unequal sizes) and :func:`mixed_partition` (label and quantity
skew) are NIID-Bench's quantity and mixed skews (without replacement); :func:`label_quantity_partition` is its
label-quantity skew ``noniid-#label{k}`` (``#C=k``). Two splits give every client ``k`` classes and differ
in structure: :class:`Pathological` (the FedAvg paper's shards, dealt round-robin: every class has the same
number of holders, every client the same size) and :class:`LabelQuantity` (NIID-Bench's: client ``i`` holds
class ``i mod K`` and ``k - 1`` random ones, so classes have unequal numbers of holders and clients unequal
sizes).

The package keeps one module per kind: :mod:`.base` (argument checks, the redraw loop, the
:class:`Partitioner` base), :mod:`.labels` (without replacement by label), :mod:`.replacement`,
:mod:`.quantity` (quantity and mixed skew) and :mod:`.users` (natural); every name is importable from
``fl_lightning.data.partition`` (and a config's ``class_path: fl_lightning.data.partition.Dirichlet``).
"""

from __future__ import annotations

from fl_lightning.data.partition.base import Partitioner, check_num_clients, partition_counts
from fl_lightning.data.partition.labels import (
    IID,
    Dirichlet,
    LabelQuantity,
    Pathological,
    dirichlet_partition,
    iid_partition,
    label_quantity_partition,
    pathological_partition,
)
from fl_lightning.data.partition.quantity import (
    MixedSkew,
    QuantitySkew,
    mixed_class_assignment,
    mixed_partition,
    quantity_skew_partition,
)
from fl_lightning.data.partition.replacement import (
    DirichletWithReplacement,
    PathologicalWithReplacement,
    dirichlet_with_replacement,
    pathological_with_replacement,
    refill_partition,
)
from fl_lightning.data.partition.users import NaturalUsers, natural_user_partition
from fl_lightning.errors import ConfigError

__all__ = [
    "IID",
    "PARTITIONERS",
    "Dirichlet",
    "DirichletWithReplacement",
    "LabelQuantity",
    "MixedSkew",
    "NaturalUsers",
    "Partitioner",
    "Pathological",
    "PathologicalWithReplacement",
    "QuantitySkew",
    "check_num_clients",
    "dirichlet_partition",
    "dirichlet_with_replacement",
    "get_partitioner",
    "iid_partition",
    "label_quantity_partition",
    "list_partitioners",
    "mixed_class_assignment",
    "mixed_partition",
    "natural_user_partition",
    "partition_counts",
    "pathological_partition",
    "pathological_with_replacement",
    "quantity_skew_partition",
    "refill_partition",
]


# ----------------------------------------------------------------------------------------- registry
PARTITIONERS: dict[str, type[Partitioner]] = {
    cls.name: cls
    for cls in (
        IID,
        Dirichlet,
        Pathological,
        LabelQuantity,
        DirichletWithReplacement,
        PathologicalWithReplacement,
        QuantitySkew,
        MixedSkew,
        NaturalUsers,
    )
}


def list_partitioners() -> list[str]:
    """Registered partitioner names, sorted."""
    return sorted(PARTITIONERS)


def get_partitioner(name: str, **kwargs: object) -> Partitioner:
    """Build a registered partitioner by name.

    Args:
        name: Registry name, e.g. ``"dirichlet"`` (case-insensitive; ``-`` is read as ``_``).
        **kwargs: Arguments of the partitioner's ``__init__``, e.g. ``alpha=0.1``.

    Raises:
        ConfigError: For an unknown name (the message lists the choices) or bad arguments.
    """
    key = str(name).strip().lower().replace("-", "_")
    if key not in PARTITIONERS:
        raise ConfigError(
            f"data.partition={name!r} is unknown; choose one of {', '.join(list_partitioners())}"
        )
    try:
        return PARTITIONERS[key](**kwargs)  # type: ignore[arg-type]
    except TypeError as e:
        raise ConfigError(f"data.partition={key!r}: bad arguments {sorted(kwargs)} ({e})") from None
