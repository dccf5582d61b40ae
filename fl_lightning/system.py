"""The system models (``model.system``): the clients as devices on a simulated clock; and the round's policy
(``model.round_policy``): what a round does with its slow clients.

Re-exported from :mod:`fl_lightning.engine.system`, where the engine runs them: give them to
``FederatedModule(system=..., round_policy=...)`` (README.md, "System heterogeneity")::

    from fl_lightning.system import Devices, RoundPolicy
    policy = RoundPolicy(deadline_s=30, policy="partial")
    FederatedModule(system=Devices(availability=0.8), round_policy=policy)
"""

from __future__ import annotations

from fl_lightning.engine.system import Devices, RoundPolicy, Stragglers, SystemModel, Trace

__all__ = ["Devices", "RoundPolicy", "Stragglers", "SystemModel", "Trace"]
