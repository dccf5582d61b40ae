"""What a ``fit`` command line resolves to, without running it (the sweep compares runs with it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml
from jsonargparse import Namespace
from lightning.pytorch.cli import LightningArgumentParser

from fl_lightning.config.errors import find_cause
from fl_lightning.config.run import RunBuilder, full_field, parse_errors, run_seed
from fl_lightning.engine.round import one_line
from fl_lightning.errors import ConfigError
from fl_lightning.lightning.console import console


class _ParseOnly(RunBuilder):
    """The ``fit`` parser, building nothing: what a command line resolves to (see :func:`resolver`)."""

    def instantiate_classes(self) -> None:
        """Nothing is built: only the parsed configuration is wanted."""

    def _set_seed(self) -> None:
        """No global seeding: nothing runs."""


def resolver() -> Callable[..., dict[str, Any]]:
    """A function from ``fit``'s arguments (without ``fit``) to the configuration they resolve to.

    The configuration is what ``fit`` writes to its run's ``config.yaml`` (the same parser, defaults,
    links and dump), as a plain mapping; ``trainer.default_root_dir`` and the like are in it as given. The
    parser is built once; each call parses one command line (relative paths from the current folder).
    Bad arguments raise :class:`ConfigError` with ``fit``'s own one-line message; with ``check`` (the
    default), the model and the data module are also built (not the Trainer; no data is loaded), so that
    their own checks (``model.participation=1.5``) run too.
    """
    with console(), parse_errors():
        parser = _ParseOnly(args=[], run=False).parser

    def resolve(args: list[str], check: bool = True) -> dict[str, Any]:
        with console(), parse_errors():
            config = parser.parse_args(list(args))
            dumped = yaml.safe_load(parser.dump(config, skip_unset=False))
        if check:
            _instantiate(parser, config)
        return dumped

    return resolve


def _instantiate(parser: LightningArgumentParser, config: Namespace) -> None:
    """Build the classes of a parsed ``config`` (model, data, callbacks) to run their checks; a class's
    :class:`ConfigError` (perhaps wrapped by jsonargparse) is raised as one line naming the field."""
    config = config.clone()
    if config.get("data.seed") is None:
        config["data.seed"] = run_seed(config.get("seed_everything"))
    try:
        with console():
            parser.instantiate_classes(config)
    except ConfigError:
        raise
    except Exception as err:
        cause = find_cause(err, ConfigError)
        if cause is None:
            raise ConfigError(f"the configuration cannot be built: {one_line(err)}") from None
        raise ConfigError(full_field(str(cause), config)) from None
