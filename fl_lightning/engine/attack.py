"""The run's simulated attack: ``model.attack`` or the ``Attack`` plug-in, resolved once per run.

Both spellings declare one :class:`~fl_lightning.api.attack.SimulatedAttack` (validated by its
:meth:`~fl_lightning.api.attack.SimulatedAttack.check`); :func:`run_attack` finds the run's one attack at
setup, and the :class:`~fl_lightning.engine.round.Engine` applies it in one place of the round: to what a
malicious client sends, after its local work returned (after the strategy's ``process_upload``) and before
the failure policy, whichever executor ran the client. So any strategy, robust or not, meets the same
attackers, on every path.
"""

from __future__ import annotations

from torch import nn

from fl_lightning.api.attack import ATTACK_KINDS, SimulatedAttack
from fl_lightning.errors import ConfigError


def as_attack(value: SimulatedAttack | dict | None, field: str = "model.attack") -> SimulatedAttack | None:
    """``value`` as a checked :class:`SimulatedAttack` (a dict from Python is accepted); None stays None."""
    if value is None:
        return None
    if isinstance(value, dict):
        unknown = sorted(set(value) - {"kind", "fraction", "scale"})
        if unknown:
            raise ConfigError(
                f"{field}: unknown option(s) {', '.join(unknown)}; it takes kind, fraction, scale"
            )
        value = SimulatedAttack(**value)
    if not isinstance(value, SimulatedAttack):
        raise ConfigError(f"{field}={value!r} must be null or {{kind: sign_flip, fraction: F, scale: S}}")
    value.check(field)
    return value


def declared_attacks(strategy: nn.Module) -> list[tuple[str, SimulatedAttack]]:
    """The attacks that plug-ins nested anywhere in ``strategy`` declare (their ``attack`` attribute), as
    ``(plug-in class name, attack)``, outermost first."""
    found = []
    for module in strategy.modules():
        attack = getattr(module, "attack", None)
        if isinstance(attack, SimulatedAttack):
            found.append((type(module).__name__, attack))
    return found


def run_attack(configured: SimulatedAttack | None, strategy: nn.Module) -> tuple[str, SimulatedAttack] | None:
    """The run's one simulated attack and where it was declared (None: every client is honest).

    Raises:
        ConfigError: One line, when more than one attack is declared (``model.attack`` and an ``Attack``
            plug-in, or two plug-ins): a client would be attacked twice.
    """
    found = ([("model.attack", configured)] if configured is not None else []) + [
        (f"model.strategy ({name})", attack) for name, attack in declared_attacks(strategy)
    ]
    if len(found) > 1:
        where = " and ".join(label for label, _ in found)
        raise ConfigError(f"{where} both simulate an attack; keep one (model.attack works with any strategy)")
    return found[0] if found else None


__all__ = ["ATTACK_KINDS", "SimulatedAttack", "as_attack", "declared_attacks", "run_attack"]
