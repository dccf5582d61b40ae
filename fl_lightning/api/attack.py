"""Simulated Byzantine clients: one attack, validated once, applied by the engine at one point of the round.

An attack is part of the simulated environment, not of the algorithm. A run declares it either as
``model.attack`` (any strategy, no nesting) or with the ``Attack`` plug-in (``Median(Attack(FedAvg()))``),
which only holds a :class:`SimulatedAttack`; either way the engine applies it in one place, after the
executor returned a malicious client's upload (so after the whole ``process_upload`` chain) and before the
failure policy, on every path. Math in :mod:`fl_lightning.functional.robust`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fl_lightning.errors import ConfigError, check_number
from fl_lightning.functional.robust import attack_update, malicious_clients
from fl_lightning.functional.tensor import Payload

ATTACK_KINDS = ("sign_flip", "scale")


@dataclass
class SimulatedAttack:
    """Malicious clients: each replaces its update ``Delta_k = w_k - w^t`` before sending it.

    The ``round(fraction * num_clients)`` malicious clients are drawn once from the run seed
    (``seed_everything``, i.e. ``model.seed``): the same on every process, on a rerun and after a
    resume; change the seed to change them. A malicious client sampled in a round uploads
    ``w^t - scale * Delta_k`` (``sign_flip``) or ``w^t + scale * Delta_k`` (``scale``); nothing is random.

    Args:
        kind: ``sign_flip`` (send the negated, scaled update) or ``scale`` (send the scaled update).
        fraction: Fraction of all clients that are malicious, in [0, 1].
        scale: The factor ``s`` > 0 applied to the update (1 with ``sign_flip``: the plain negation).
    """

    kind: Literal["sign_flip", "scale"] = "sign_flip"
    fraction: float = 0.2
    scale: float = 1.0

    def check(self, field: str = "model.attack") -> None:
        """Raise a one-line :class:`~fl_lightning.errors.ConfigError` naming ``<field>.<option>``."""
        if self.kind not in ATTACK_KINDS:
            raise ConfigError(f"{field}.kind={self.kind!r} must be 'sign_flip' or 'scale'")
        check_number(self.fraction, f"{field}.fraction", low=0, high=1, hint="(share of malicious clients)")
        check_number(self.scale, f"{field}.scale", low=0, low_open=True, hint="e.g. 1.0 or 10")

    @property
    def factor(self) -> float:
        """``-scale`` for ``sign_flip``, ``scale`` for ``scale``."""
        return -self.scale if self.kind == "sign_flip" else self.scale

    def malicious(self, num_clients: int, seed: int) -> frozenset[int]:
        """The malicious client ids of a run with ``num_clients`` clients and run seed ``seed``."""
        return malicious_clients(num_clients, self.fraction, seed)

    def apply(self, upload: Payload, message: Payload) -> Payload:
        """What a malicious client sends instead of ``upload`` (``message["weights"]`` is ``w^t``)."""
        if "weights" not in upload:
            return upload
        sent = message.get("weights", {})
        return {**upload, "weights": attack_update(upload["weights"], sent, self.factor)}


__all__ = ["ATTACK_KINDS", "SimulatedAttack"]
