"""How rounds run: the engine's configuration (``model.participation``, ``model.system``, ...), and the
``model`` config section's former spellings read as the current ones (:func:`upgrade_model_section`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fl_lightning.engine import runtime
from fl_lightning.engine.attack import SimulatedAttack
from fl_lightning.engine.local import LocalConfig
from fl_lightning.engine.system import RoundPolicy, SystemModel, policy
from fl_lightning.errors import ConfigError, check_number


@dataclass
class EngineConfig:
    """How rounds run; the fields are :class:`~fl_lightning.lightning.module.FederatedModule`'s arguments of
    the same names (``model.participation``, ...).

    Attributes:
        local: The clients' local work (steps, lr decay, clipping, seed, compile, vectorise).
        participation: Fraction of clients per round in (0, 1].
        clients_per_round: A fixed count per round (overrides ``participation``).
        tolerate_client_failures: Exclude (and count) a client whose local work raises or uploads
            non-finite values instead of stopping the run.
        max_failed_rounds: Consecutive rounds without any accepted upload after which the run stops (an
            asynchronous strategy: this many times ``M`` consecutive failed arrivals).
        attack: Simulated malicious clients, ``model.attack`` (None: every client is honest, unless an
            ``Attack`` plug-in in the strategy declares them: :func:`~fl_lightning.engine.attack.run_attack`).
        eval_fraction: Fraction of the clients whose deployed model is evaluated during fit.
        system: The clients as devices on a simulated clock (``model.system``; None: every client online,
            equally fast, finishing its work).
        round_policy: What a round does with its slow clients, and the simulated run's goals
            (``model.round_policy``: deadline, drop or partial work, over-selection, target accuracy, time
            budget); the system model applies it.
    """

    local: LocalConfig
    participation: float = 1.0
    clients_per_round: int | None = None
    tolerate_client_failures: bool = True
    max_failed_rounds: int = 3
    attack: SimulatedAttack | None = None
    eval_fraction: float = 1.0
    system: SystemModel | None = None
    round_policy: RoundPolicy = field(default_factory=RoundPolicy)

    def __post_init__(self) -> None:
        """Refuse a bad value with one line naming its ``model.<field>`` (as the config spells it)."""
        hint = "e.g. 0.1 samples 10% of clients"
        check_number(self.participation, "model.participation", low=0, high=1, low_open=True, hint=hint)
        if self.max_failed_rounds < 1:
            raise ConfigError(f"model.max_failed_rounds={self.max_failed_rounds} must be >= 1 (default 3)")
        hint = "e.g. 0.1 evaluates 10%"
        check_number(self.eval_fraction, "model.eval_fraction", low=0, high=1, low_open=True, hint=hint)
        if self.system is not None and not isinstance(self.system, SystemModel):
            raise ConfigError(
                f"model.system={self.system!r} must be a SystemModel (Devices, Trace, Stragglers)"
            )
        if not isinstance(self.round_policy, RoundPolicy):
            raise ConfigError(f"model.round_policy={self.round_policy!r} must be a RoundPolicy")

    @property
    def seed(self) -> int:
        """The run seed (``model.seed``, i.e. ``seed_everything``)."""
        return self.local.seed


def upgrade_model_section(model: Mapping[str, Any]) -> dict[str, Any]:
    """A ``model`` config section (a config file's, a run's ``config.yaml``, a checkpoint's saved arguments)
    with the former spellings as the current ones: the round policy's fields inside ``system``
    (:func:`fl_lightning.engine.system.policy.upgrade_model`) and the runtime's at the section's own level
    (:func:`fl_lightning.engine.runtime.upgrade_model`)."""
    return runtime.upgrade_model(policy.upgrade_model(model))


def upgrade_model_hparams(hparams: Mapping[str, Any]) -> dict[str, Any]:
    """Flat ``model.*`` hyperparameters (a checkpoint's) with the round policy's and the runtime's fields
    under ``model.round_policy`` and ``model.runtime``, as a current checkpoint saves them."""
    return runtime.upgrade_flat(policy.upgrade_flat(hparams))


__all__ = ["EngineConfig", "upgrade_model_hparams", "upgrade_model_section"]
