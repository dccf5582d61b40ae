"""The command line: ``python -m fl_lightning {fit,validate,test,predict,list}`` (``sweep``: ``__main__``).

- :mod:`~fl_lightning.cli.app`: :class:`FederatedCLI` (the subcommands) and :func:`main` (one ``error:``
  line and an exit status for bad input);
- :mod:`~fl_lightning.cli.runs`: the run folder a command writes to, the config an evaluation reads,
  what a refused run leaves;
- :mod:`~fl_lightning.cli.help`: what ``--help`` says;
- :mod:`~fl_lightning.cli.lists`: ``python -m fl_lightning list``.

Parsing and building a run from its configuration is :mod:`fl_lightning.config`'s (the Flower apps and the
sweep use it too); the console (what a command prints) is :mod:`fl_lightning.lightning.console`'s. Both are
re-exported here under the names the command line has always had.
"""

from __future__ import annotations

from fl_lightning.cli.app import FederatedCLI, main
from fl_lightning.cli.lists import LISTS, list_names
from fl_lightning.config import TRAINER_DEFAULTS, resolver
from fl_lightning.lightning.console import console

__all__ = ["LISTS", "TRAINER_DEFAULTS", "FederatedCLI", "console", "list_names", "main", "resolver"]
