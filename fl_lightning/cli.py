"""``python -m fl_lightning {fit,validate,test,predict}``: LightningCLI over the federated module and data."""

from __future__ import annotations

import errno
import itertools
import logging
import os
import re
import sys
import tempfile
from typing import Any, NoReturn

import yaml
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import Callback, ProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from fl_lightning.callbacks import FederatedProgressBar, FederatedSummary
from fl_lightning.data.federated import FederatedDataModule
from fl_lightning.errors import ConfigError, RunError, check_number
from fl_lightning.server import FederatedModule
from fl_lightning.strategies import STRATEGIES

#: Trainer defaults that make one training step one round (see FederatedModule).
TRAINER_DEFAULTS: dict[str, Any] = {
    "max_steps": 40,
    "val_check_interval": 1,
    "check_val_every_n_epoch": None,
    "log_every_n_steps": 1,
    "num_sanity_val_steps": 0,
    "enable_model_summary": False,
}


class FederatedArgumentParser(LightningArgumentParser):
    """The CLI's parser: parse errors are one ``error:`` line (no usage), with the choices where they help."""

    def parse_args(self, args: Any = None, *more: Any, **kwargs: Any) -> Any:
        self._fl_args = list(sys.argv[1:] if args is None else args)
        return super().parse_args(args, *more, **kwargs)

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        text = " ".join(message.split())
        match = re.match(r'Parser key "([^"]+)"', text)
        nested = re.match(
            r'Parser key "([^"]+)": Problem with given class_path \'[^\']+\': (?:Parser key "([^"]+)": )?',
            text,
        )
        if nested:  # a bad init_args value: name the full field, e.g. model.strategy.mu
            field = ".".join(k for k in nested.groups() if k)
            text = f"{field}: {text[nested.end() :]}"
        elif match and match.group(1).endswith("strategy"):
            names = ", ".join(sorted(cls.__name__ for cls in STRATEGIES.values()))
            given = re.search(r"but (\S+) either", text)
            what = f"{given.group(1)!r} is not" if given else "value is not"
            text = f"{match.group(1)}: {what} a known strategy; choose one of {names} or a full class path"
        elif "Problems parsing config" in text:
            text = _yaml_error(getattr(self, "_fl_args", [])) or text
        if not self.exit_on_error:  # jsonargparse is trying alternatives: let it catch the error
            super().error(text, ex)
        sys.stderr.write(f"error: {text}\n")
        self.exit(2)


def _yaml_error(args: list[Any]) -> str | None:
    """``"<file>: YAML syntax error at line L, column C: <problem>"`` for the first broken ``--config``."""
    files = [b for a, b in itertools.pairwise(args) if a == "--config"]
    files += [str(a).split("=", 1)[1] for a in args if str(a).startswith("--config=")]
    for path in files:
        try:
            with open(path) as f:
                yaml.safe_load(f)
        except yaml.MarkedYAMLError as err:
            mark = err.problem_mark or err.context_mark
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            return f"{path}: YAML syntax error{where}: {err.problem or err.context}; fix the file"
        except (OSError, yaml.YAMLError):
            continue
    return None


class FederatedCLI(LightningCLI):
    """LightningCLI with the federated defaults: ``--trainer.max_steps`` is the number of rounds.

    Every constructor argument of :class:`FederatedModule`, its client, strategy and network, and of
    :class:`FederatedDataModule` and its partitioner is a config field (``class_path``/``init_args``),
    documented by ``--help`` and shown by ``--print_config``.
    """

    def __init__(self, args: Any = None, run: bool = True, **kwargs: Any) -> None:
        defaults = {
            **TRAINER_DEFAULTS,
            "callbacks": [FederatedSummary()],
            **kwargs.pop("trainer_defaults", {}),
        }
        super().__init__(
            FederatedModule,
            FederatedDataModule,
            seed_everything_default=0,
            trainer_defaults=defaults,
            save_config_kwargs={"overwrite": True},
            auto_configure_optimizers=False,
            parser_class=FederatedArgumentParser,
            args=args,
            run=run,
            **kwargs,
        )

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Callback]) -> Trainer:
        given = config.get("callbacks") or []
        given = given if isinstance(given, list) else [given]
        if config.get("enable_progress_bar") is not False and not any(
            isinstance(c, ProgressBar) for c in given
        ):
            callbacks = [*callbacks, FederatedProgressBar()]
        trainer = super()._instantiate_trainer(config, callbacks)
        _check_writable(trainer.default_root_dir, "trainer.default_root_dir")
        for logger in trainer.loggers:
            if logger.save_dir is not None:
                _check_writable(logger.save_dir, "trainer.logger.init_args.save_dir")
        return trainer

    def _set_seed(self) -> None:
        seed = self._get(self.config, "seed_everything")
        if seed is not None and not isinstance(seed, bool):
            check_number(seed, "seed_everything", low=0, high=2**32 - 1, hint="or true for a random seed")
        super()._set_seed()


def _check_writable(path: str | os.PathLike, field: str) -> None:
    """Raise a one-line :class:`ConfigError` unless ``path`` (a local folder) can be created and written."""
    path = os.fspath(path)
    if "://" in path:  # a remote file system: its own client reports problems
        return
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"{field}={path} is a file, not a folder; choose a writable folder")
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as err:
        raise ConfigError(
            f"{field}={path}: cannot write there ({err.strerror or err}); choose a writable folder"
        ) from None


def main(args: Any = None) -> None:
    """Entry point of ``python -m fl_lightning``; bad input exits with a one-line ``error:``."""
    logger = logging.getLogger("fl_lightning")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    try:
        FederatedCLI(args=args)
    except ConfigError as err:
        sys.stderr.write(f"error: {err}\n")
        raise SystemExit(2) from None
    except RunError as err:
        sys.stderr.write(f"error: {err}\n")
        raise SystemExit(1) from None
    except OSError as err:
        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        where = f" writing {err.filename}" if err.filename else ""
        sys.stderr.write(
            f"error: no space left on the device{where}; free some space or choose another folder with "
            "--trainer.default_root_dir\n"
        )
        raise SystemExit(1) from None
