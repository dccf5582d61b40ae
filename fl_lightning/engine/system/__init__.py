"""The client system model (``model.system``): devices on a simulated clock, and the round's policy.

- :mod:`~fl_lightning.engine.system.base`: :class:`SystemModel`, a client's time (download + computation +
  upload), availability, dropout, and a round under its policy (deadline, over-selection);
- :mod:`~fl_lightning.engine.system.policy`: :class:`RoundPolicy` (``model.round_policy``), the deadline with
  drop or partial work, over-selection, the target accuracy and the simulated time budget;
- :mod:`~fl_lightning.engine.system.devices`: :class:`Devices`, devices drawn from seeded distributions;
- :mod:`~fl_lightning.engine.system.trace`: :class:`Trace`, devices read from a CSV file;
- :mod:`~fl_lightning.engine.system.stragglers`: :class:`Stragglers`, FedProx's stragglers (Sec. 5.2);
- :mod:`~fl_lightning.engine.system.profiles`, :mod:`~fl_lightning.engine.system.setup`,
  :mod:`~fl_lightning.engine.system.plan`: the devices, the run they time, a round's plan.

The math is in :mod:`fl_lightning.functional.system`.
"""

from __future__ import annotations

from fl_lightning.engine.system.base import Instant, SystemModel
from fl_lightning.engine.system.devices import Devices
from fl_lightning.engine.system.plan import RoundPlan
from fl_lightning.engine.system.policy import RoundPolicy
from fl_lightning.engine.system.profiles import Profiles
from fl_lightning.engine.system.setup import Setup
from fl_lightning.engine.system.stragglers import Stragglers
from fl_lightning.engine.system.trace import Trace

__all__ = [
    "Devices",
    "Instant",
    "Profiles",
    "RoundPlan",
    "RoundPolicy",
    "Setup",
    "Stragglers",
    "SystemModel",
    "Trace",
]
