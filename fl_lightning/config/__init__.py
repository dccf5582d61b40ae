"""A run's configuration: ``fit``'s YAML and command-line overrides, parsed and built into a run.

- :mod:`~fl_lightning.config.parser`: the parser (no abbreviated options, one ``error:`` line);
- :mod:`~fl_lightning.config.errors`: jsonargparse's and Lightning's messages rewritten as one line
  naming the field ("did you mean ...?");
- :mod:`~fl_lightning.config.run`: :class:`RunBuilder`, the LightningCLI that builds the Trainer, the
  ``FederatedModule`` and the ``FederatedDataModule`` (one seed, the run's Trainer), and :func:`build_run`;
- :mod:`~fl_lightning.config.resolve`: :func:`resolver`, what a ``fit`` command line resolves to.

The command line (:mod:`fl_lightning.cli`), the Flower apps and the sweep all read a run's configuration
through this package, so one config and seed give the same run on every path.
"""

from __future__ import annotations

from fl_lightning.config.resolve import resolver
from fl_lightning.config.run import TRAINER_DEFAULTS, RunBuilder, build_run

__all__ = ["TRAINER_DEFAULTS", "RunBuilder", "build_run", "resolver"]
