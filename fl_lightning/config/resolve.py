"""What a ``fit`` command line resolves to, without running it (the sweep compares runs with it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml
from jsonargparse import Namespace, set_dumper
from lightning.pytorch.cli import LightningArgumentParser

from fl_lightning.config.errors import find_cause
from fl_lightning.config.parser import SAFE_LOADER
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
        _keep_defaults(parser)

    def resolve(args: list[str], check: bool = True) -> dict[str, Any]:
        with console(), parse_errors():
            config = parser.parse_args(list(args))
            dumped = dump_as_loaded(parser, config)
        if check:
            _instantiate(parser, config)
        return dumped

    return resolve


#: jsonargparse's YAML dump (``yaml.safe_dump``, keys in order) written by libyaml where PyYAML has it.
_FAST_YAML = "fl_lightning_yaml"
_SAFE_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
set_dumper(
    _FAST_YAML,
    lambda data: yaml.dump(
        data, Dumper=_SAFE_DUMPER, default_flow_style=False, allow_unicode=True, sort_keys=False
    ),
)


def dump_as_loaded(parser: LightningArgumentParser, config: Namespace) -> dict[str, Any]:
    """``yaml.safe_load`` of ``parser.dump(config, skip_unset=False)``: what ``fit`` writes to its run's
    ``config.yaml``, read back, for a ``config`` that ``parser`` parsed.

    The same mapping, faster: not validated again (``parse_args`` just validated it) and written and read
    with libyaml (the same representers, resolvers and values; see ``tests/config/test_resolve.py``).
    """
    text = parser.dump(config, format=_FAST_YAML, skip_unset=False, skip_validation=True)
    return yaml.load(text, Loader=SAFE_LOADER)


def _keep_defaults(parser: LightningArgumentParser) -> None:
    """Make ``parser`` compute its defaults once: each parse starts from a copy of them.

    jsonargparse computes a parser's defaults again for every parse (a fifth of a sweep row's resolution);
    they depend only on the parser, which :func:`resolver` builds once and never changes afterwards (it has
    no default config files and reads no environment: see ``tests/config/test_resolve.py``).
    """
    defaults = parser.get_defaults(skip_validation=True)

    def get_defaults(skip_validation: bool = False, **kwargs: Any) -> Namespace:
        return defaults.clone()

    parser.get_defaults = get_defaults  # type: ignore[method-assign]


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
