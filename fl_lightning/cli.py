"""``python -m fl_lightning {fit,validate,test,predict}``: LightningCLI over the federated module and data."""

from __future__ import annotations

import argparse
import errno
import itertools
import logging
import os
import re
import shutil
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, NoReturn

import yaml
from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, ProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.warnings import PossibleUserWarning

from fl_lightning.callbacks import FederatedProgressBar, FederatedSummary
from fl_lightning.core.checkpoint import AtomicCheckpointIO, LastRoundCheckpoint, load_checkpoint_file
from fl_lightning.core.distributed import leave_process_group
from fl_lightning.core.module import FederatedModule
from fl_lightning.data.datasets import list_datasets
from fl_lightning.data.federated import FederatedDataModule
from fl_lightning.data.partition import PARTITIONERS
from fl_lightning.errors import ConfigError, RunError, check_number
from fl_lightning.models import MODELS
from fl_lightning.strategies import list_strategies

#: Trainer defaults that make one training step one round (see FederatedModule).
TRAINER_DEFAULTS: dict[str, Any] = {
    "max_steps": 40,
    "val_check_interval": 1,
    "check_val_every_n_epoch": None,
    "log_every_n_steps": 1,
    "num_sanity_val_steps": 0,
    "enable_model_summary": False,
}


#: ``--ckpt_path`` values Lightning resolves itself instead of naming a file.
_SPECIAL_CKPT_PATHS = ("last", "best", "hpc", "registry")


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
        optional = re.match(
            r'Parser key "([^"]+)":.*?Does not validate against any of the Union subtypes.*?'
            r"Problem with given class_path '[^']+': (?:Parser key \"([^\"]+)\": )?(.*?)"
            r"(?: - Expected a <class 'NoneType'>.*)?$",
            text,
        )
        if nested:  # a bad init_args value: name the full field, e.g. model.strategy.mu
            field = ".".join(k for k in nested.groups() if k)
            text = f"{field}: {text[nested.end() :]}"
        elif optional:  # a bad value inside an optional group, e.g. model.attack.kind
            field = ".".join(k for k in optional.groups()[:2] if k)
            text = f"{field}: {optional.group(3)}"
        elif match and match.group(1).endswith("strategy"):
            names = ", ".join(list_strategies())
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


class SaveConfigAfterRestore(SaveConfigCallback):
    """Writes ``config.yaml`` when the run starts, after ``--ckpt_path`` was loaded and accepted.

    Lightning's callback writes it in ``setup``, before the checkpoint is restored, so a resume
    refused by the fingerprint check overwrote the reused log directory's config with the rejected one.
    """

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._stage = stage

    def _save_now(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().setup(trainer, pl_module, self._stage)

    on_fit_start = on_validation_start = on_test_start = on_predict_start = _save_now


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
            save_config_callback=SaveConfigAfterRestore,
            save_config_kwargs={"overwrite": True},
            auto_configure_optimizers=False,
            parser_class=FederatedArgumentParser,
            parser_kwargs={
                "description": "Federated learning on PyTorch Lightning. "
                "`python -m fl_lightning list` lists the strategies, models, datasets and partitions."
            },
            args=args,
            run=run,
            **kwargs,
        )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """One seed: ``seed_everything`` is also ``model.seed`` and, unless set, ``data.seed``.

        ``model.seed`` (client sampling, every client's RNG stream) is linked and cannot be set on its
        own; ``data.seed`` (partition, local test and validation splits) defaults to null, meaning
        ``seed_everything``: set it to keep a split fixed while ``seed_everything`` varies the training.
        """
        parser.link_arguments("seed_everything", "model.seed", compute_fn=_run_seed)
        for action in parser._actions:
            if action.dest == "seed_everything":
                action.help = (
                    "The run's one seed: global RNGs (network initialisation), model.seed (client "
                    "sampling, clients' RNG streams; linked) and data.seed unless set (the split). "
                    "true: a random seed, recorded in config.yaml"
                )

    def instantiate_classes(self) -> None:
        """Build the classes with ``model.seed`` and a null ``data.seed`` set to the run's seed.

        ``seed_everything: true`` draws the seed after parsing, so the link's value is replaced here.
        ``config.yaml`` keeps ``data.seed: null``: rerunning it with another ``seed_everything``
        changes the split too, as the first run's command would have.
        """
        config = self.config.get(str(self.subcommand), self.config)
        seed = _run_seed(config.get("seed_everything"))
        for path in [*(self.config.get("config") or []), *(config.get("config") or [])]:
            _check_model_seed(path, seed)
        config["model.seed"] = seed
        follow = config.get("data.seed") is None
        if follow:
            config["data.seed"] = seed
        try:
            super().instantiate_classes()
        finally:
            if follow:
                config["data.seed"] = None

    def _parse_ckpt_path(self) -> None:
        """Check ``--ckpt_path`` before anything runs (one line if it is not a checkpoint).

        Lightning's version ``torch.load``s the file here to read ``hyper_parameters`` (which
        FederatedModule does not save) and lets a bad file's traceback through.
        """
        subcommand = self.config.get("subcommand")
        path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if not path or str(path) in _SPECIAL_CKPT_PATHS or "://" in str(path):
            return
        weights_only = self.config[subcommand].get("weights_only")  # --weights_only=false: the user's call
        checkpoint = load_checkpoint_file(path, "cpu", weights_only is not False, mmap=True)
        if checkpoint.get("hyper_parameters"):
            super()._parse_ckpt_path()

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Callback]) -> Trainer:
        saver = self.save_config_callback
        if self.subcommand != "fit" and config.get("logger") in (None, True):
            # validate/test/predict log into their checkpoint's run folder, or nowhere
            config["logger"] = self._evaluation_logger()
            if config["logger"] is False:
                self.save_config_callback = None
        try:
            trainer = self._instantiate_trainer_with_progress_bar(config, callbacks)
        finally:
            self.save_config_callback = saver
        # run folders that do not exist yet: a run that fails before its first round removes them
        dirs = (getattr(lg, "log_dir", None) for lg in trainer.loggers)
        self._new_log_dirs = [Path(d) for d in dirs if d and not Path(d).exists()]
        return trainer

    def _evaluation_logger(self) -> TensorBoardLogger | bool:
        """``<run>/<subcommand>/`` for a checkpoint under ``<run>/checkpoints/``; else no logger.

        A ``validate`` or ``test`` of a fitted run then appears in TensorBoard as the run
        ``version_N/test`` (its scalars at step = the checkpoint's rounds) instead of as a new
        ``version_N+1`` folder.
        """
        ckpt = self.config.get(str(self.subcommand), {}).get("ckpt_path")
        if not ckpt or Path(ckpt).parent.name != "checkpoints":
            return False
        return TensorBoardLogger(save_dir=str(Path(ckpt).parent.parent), name="", version=self.subcommand)

    def _run_subcommand(self, subcommand: str) -> None:
        try:
            super()._run_subcommand(subcommand)
        except ConfigError:
            if self.trainer.global_step == 0 and self.trainer.is_global_zero:
                for d in self._new_log_dirs:
                    shutil.rmtree(d, ignore_errors=True)
            raise

    def _instantiate_trainer_with_progress_bar(
        self, config: dict[str, Any], callbacks: list[Callback]
    ) -> Trainer:
        given = config.get("callbacks") or []
        given = given if isinstance(given, list) else [given]
        if config.get("enable_progress_bar") is not False and not any(
            isinstance(c, ProgressBar) for c in given
        ):
            callbacks = [*callbacks, FederatedProgressBar()]
        if config.get("enable_checkpointing") is not False:
            callbacks = [*callbacks, *_last_round_checkpoint(given)]
        plugins = config.get("plugins") or []
        plugins = plugins if isinstance(plugins, list) else [plugins]
        if not any(isinstance(p, CheckpointIO) for p in plugins):
            config["plugins"] = [*plugins, AtomicCheckpointIO()]
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


def _run_seed(seed_everything: bool | int | None) -> int:
    """The federated run's seed: ``seed_everything`` (0 when it is false, or not drawn yet)."""
    return seed_everything if type(seed_everything) is int else 0


def _check_model_seed(path: Any, seed: int) -> None:
    """A config file's ``model.seed`` other than ``seed_everything`` is an error, not silently replaced.

    jsonargparse overwrites a linked target read from a file; an equal value (configs and run
    ``config.yaml`` files written before the link) is accepted.
    """
    content = yaml.safe_load(path.get_content()) if hasattr(path, "get_content") else None
    model = content.get("model") if isinstance(content, dict) else None
    if isinstance(model, dict) and model.get("seed", seed) != seed:
        raise ConfigError(
            f"model.seed={model['seed']} in {path}: model.seed is seed_everything (linked); "
            f"set seed_everything: {model['seed']} and remove model.seed"
        )


def _last_round_checkpoint(given: list[Callback]) -> list[Callback]:
    """A :class:`LastRoundCheckpoint` unless one is given; it takes ``last.ckpt`` over from the others."""
    if any(isinstance(c, LastRoundCheckpoint) for c in given):
        return []
    dirpath = None
    for cb in given:
        if isinstance(cb, ModelCheckpoint) and cb.save_last:
            logging.getLogger("fl_lightning").warning(
                "trainer.callbacks: ModelCheckpoint(save_last=%s) would rewrite last.ckpt only in rounds "
                "that improve its monitor; fl_lightning writes it after every round instead (drop save_last)",
                cb.save_last,
            )
            cb.save_last = None
            dirpath = dirpath or cb.dirpath
    return [LastRoundCheckpoint(dirpath=dirpath)]


#: What ``python -m fl_lightning list`` prints: the config field and its accepted values.
LISTS: dict[str, tuple[str, Any]] = {
    "strategies": ("--model.strategy=NAME", list_strategies),
    "models": (
        "model.client.init_args.net: {class_path: fl_lightning.models.NAME}",
        lambda: sorted((c.__name__ for c in MODELS.values()), key=str.lower),
    ),
    "datasets": ("--data.dataset=NAME", list_datasets),
    "partitions": ("--data.partition=NAME", lambda: [c.__name__ for c in PARTITIONERS.values()]),
}

#: Lightning messages that are noise in a federated run: advertising tips, the TPU/HPU lines, our own
#: defaults echoed back, and advice that does not apply (in-memory tensors need no loader workers).
_NOISE = re.compile(
    r"💡 Tip|(TPU|HPU) available|`Trainer\(val_check_interval=1\)` was configured"
    r"|does not have many workers|isinstance\(treespec, LeafSpec\)` is deprecated"
)


#: Round metrics are computed from state merged across processes before they are logged, so every rank
#: logs the same value; Lightning's advice to add ``sync_dist=True`` (a mean over ranks) does not apply.
_SYNC_DIST_ADVICE = r"It is recommended to use `self.log\('(step'|(global|personal|round|train|test)/)"


class _DropNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not _NOISE.search(record.getMessage())


class _StdoutHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stdout`` is at the time of the record (redirections and capture included)."""

    @property
    def stream(self) -> Any:
        return sys.stdout

    @stream.setter
    def stream(self, value: Any) -> None:
        """The stream is always the current ``sys.stdout``."""


def list_names(argv: list[str]) -> None:
    """``python -m fl_lightning list [strategies|models|datasets|partitions]``: the names a config takes."""
    parser = argparse.ArgumentParser(
        prog="python -m fl_lightning list", description="The names a config takes, by config field."
    )
    parser.add_argument("what", nargs="?", help=f"one of {', '.join(LISTS)} (default: all)")
    what = parser.parse_args(argv).what
    if what is not None and what not in LISTS:
        sys.stderr.write(f"error: list: {what!r} is not one of {', '.join(LISTS)}\n")
        raise SystemExit(2)
    for name in [what] if what else LISTS:
        field, names = LISTS[name]
        sys.stdout.write(f"{name} ({field}):\n  " + ", ".join(names()) + "\n")


def main(args: Any = None) -> None:
    """Entry point of ``python -m fl_lightning``; bad input exits with a one-line ``error:``.

    Lightning's tips, deprecation notices and advice that does not apply to federated runs are
    filtered for the duration of the command only (nothing is filtered at import).
    """
    argv = sys.argv[1:] if args is None else list(args)
    if argv[:1] == ["list"]:
        list_names(argv[1:])
        return
    if argv[:1] == ["sweep"]:
        from fl_lightning.sweep import main as sweep

        sweep(argv[1:])  # exits with the sweep's status
        return
    logger = logging.getLogger("fl_lightning")
    if not logger.handlers:
        handler = _StdoutHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    noise = _DropNoise()
    lightning_log = logging.getLogger("lightning.pytorch")
    lightning_log.addFilter(noise)
    for handler in lightning_log.handlers:
        handler.addFilter(noise)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=f".*({_NOISE.pattern})")
            warnings.filterwarnings("ignore", message=_SYNC_DIST_ADVICE, category=PossibleUserWarning)
            FederatedCLI(args=args)
        leave_process_group()
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
    finally:
        lightning_log.removeFilter(noise)
        for handler in lightning_log.handlers:
            handler.removeFilter(noise)
