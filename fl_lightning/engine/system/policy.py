"""The round's policy (``model.round_policy``): what a round does with its slow clients, and the run's
simulated-time goals.

A :class:`RoundPolicy` is one object apart from the devices (``model.system``: where the devices come from),
given to ``FederatedModule(round_policy=...)`` and shared by whichever system model runs::

    --model.system=Devices --model.round_policy.deadline_s=30 --model.round_policy.policy=partial

Before the policy was its own object, its fields were arguments of every system model
(``--model.system.init_args.deadline_s=30``, ``model.system.init_args.policy`` in a config file or a
checkpoint's saved arguments); :func:`upgrade_model` and :func:`upgrade_flat` read those spellings as this
one (the command line's and config files' through :mod:`fl_lightning.config.legacy`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from fl_lightning.errors import ConfigError, as_fields_object, check_number
from fl_lightning.hparams import move_flat_fields


@dataclass(frozen=True)
class RoundPolicy:
    """What a synchronous round does with clients past its deadline, and when the simulated run ends.

    With a deadline ``D`` (``deadline_s``) a client whose round takes ``t_k > D`` simulated seconds is dropped
    (``policy: drop``) or runs the local steps that fit, ``floor((D - down - up) v_k / b)`` (``policy:
    partial``; dropped if none fits); the round then lasts until ``D``. With over-selection ``r`` a round
    samples ``ceil((1 + r) K)`` clients and keeps the first ``K`` to finish (Bonawitz et al., MLSys 2019,
    Sec. 2.2). Under :class:`~fl_lightning.engine.system.stragglers.Stragglers` (FedProx's preset rounds,
    Li et al., MLSys 2020, Sec. 5.2) ``policy`` says whether the stragglers' partial work is dropped (the
    paper's FedAvg) or aggregated (FedProx). Every field but ``policy`` needs a simulated clock
    (``model.system``).

    Args:
        deadline_s: The round's deadline in simulated seconds (None: the round waits for every client).
        policy: What a client past the deadline (or a straggler) contributes: ``drop`` (nothing) or
            ``partial`` (its local steps cut to what fits).
        over_selection: ``r >= 0``: sample ``ceil((1 + r) K)`` clients and keep the first ``K`` to finish.
        target_accuracy: A global accuracy (a fraction) whose first simulated time ``summary.json`` reports
            as ``sim_time_to_target_s`` (None: not reported).
        max_sim_time_s: End the run cleanly once the simulated clock reaches this (None: no budget).
    """

    deadline_s: float | None = None
    policy: Literal["drop", "partial"] = "drop"
    over_selection: float = 0.0
    target_accuracy: float | None = None
    max_sim_time_s: float | None = None

    #: How the config spells this object (messages name ``model.round_policy.<field>``).
    field: ClassVar[str] = "model.round_policy"

    def __post_init__(self) -> None:
        """Refuse a bad value with one line naming its ``model.round_policy.<field>``."""
        f = self.field
        if self.deadline_s is not None:
            check_number(self.deadline_s, f"{f}.deadline_s", low=0, low_open=True, hint="(simulated seconds)")
        if self.policy not in ("drop", "partial"):
            raise ConfigError(f"{f}.policy={self.policy!r} must be 'drop' or 'partial'")
        check_number(self.over_selection, f"{f}.over_selection", low=0, hint="e.g. 0.3 samples 30% more")
        if self.target_accuracy is not None:
            check_number(self.target_accuracy, f"{f}.target_accuracy", low=0, high=1, hint="(a fraction)")
        if self.max_sim_time_s is not None:
            check_number(self.max_sim_time_s, f"{f}.max_sim_time_s", low=0, low_open=True)

    def given(self) -> list[str]:
        """The fields set away from their defaults, as ``model.round_policy.<field>=<value>``."""
        default = RoundPolicy()
        out = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value != getattr(default, f.name):
                out.append(
                    f"{self.field}.{f.name}=" + (f"{value:g}" if isinstance(value, float) else f"{value}")
                )
        return out


#: The policy's fields, which system models took as arguments before the policy was its own object.
FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(RoundPolicy))


def as_round_policy(value: RoundPolicy | Mapping[str, Any] | None) -> RoundPolicy:
    """``value`` as a :class:`RoundPolicy`: itself, the default for None, or built from a mapping (the
    command line's saved config of it).

    Raises:
        ConfigError: one line for a field it does not have, or a value that is not a policy.
    """
    return as_fields_object(
        RoundPolicy, value, RoundPolicy.field, "round policy", "RoundPolicy(deadline_s=30)"
    )


def upgrade_model(model: Mapping[str, Any]) -> dict[str, Any]:
    """A ``model`` config section (a config file's, a checkpoint's saved arguments) with the policy's fields
    given inside ``system`` (``system: {class_path: Devices, init_args: {deadline_s: 30}}``, the spelling
    from before the policy was its own object) moved to ``round_policy``; fields that ``round_policy`` sets
    itself win. A section without them is returned as it is."""
    system = model.get("system")
    if not isinstance(system, Mapping):
        return dict(model)
    init_args = system.get("init_args")
    init_args = dict(init_args) if isinstance(init_args, Mapping) else {}
    direct = {k: system[k] for k in FIELDS if k in system}  # ``system: {class_path: ..., deadline_s: 30}``
    moved = {**direct, **{k: init_args.pop(k) for k in FIELDS if k in init_args}}
    if not moved:
        return dict(model)
    system = {k: v for k, v in system.items() if k not in FIELDS}
    if "init_args" in system:
        system["init_args"] = init_args
    current = model.get("round_policy")
    current = dict(current) if isinstance(current, Mapping) else {}
    return {**model, "system": system, "round_policy": {**moved, **current}}


def upgrade_flat(hparams: Mapping[str, Any]) -> dict[str, Any]:
    """Flat ``{"model.system.deadline_s": 30, ...}`` hyperparameters (a checkpoint's, for the resume's
    "changed hyperparameters" line) with the policy's fields under ``model.round_policy``."""
    return move_flat_fields(hparams, "model.system", FIELDS, RoundPolicy.field)


__all__ = ["FIELDS", "RoundPolicy", "as_round_policy", "upgrade_flat", "upgrade_model"]
