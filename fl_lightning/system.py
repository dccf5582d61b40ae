"""The system models (``model.system``): the clients as devices on a simulated clock.

Re-exported from :mod:`fl_lightning.engine.system`, where the engine runs them: give one to
``FederatedModule(system=...)`` (README.md, "System heterogeneity")::

    from fl_lightning.system import Devices
    FederatedModule(system=Devices(availability=0.8, deadline_s=30, policy="partial"))
"""

from __future__ import annotations

from fl_lightning.engine.system import Devices, Stragglers, SystemModel, Trace

__all__ = ["Devices", "Stragglers", "SystemModel", "Trace"]
