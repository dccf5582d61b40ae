"""``python -m fl_lightning {fit,validate,test,predict}``: LightningCLI over the federated module and data."""

from __future__ import annotations

import argparse
import contextlib
import errno
import inspect
import io
import itertools
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import yaml
from jsonargparse import Namespace
from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter, Callback, ModelCheckpoint, ProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException
from lightning.pytorch.utilities.warnings import PossibleUserWarning

from fl_lightning.callbacks import FederatedProgressBar, FederatedSummary, PredictionWriter
from fl_lightning.callbacks.summary import flatten_config
from fl_lightning.cli_errors import (
    config_keys,
    find_cause,
    find_key,
    parse_error,
    rewrite_float_arg,
    trainer_error,
)
from fl_lightning.data.datasets import list_datasets
from fl_lightning.data.federated import FederatedDataModule
from fl_lightning.data.partition import PARTITIONERS
from fl_lightning.data.transforms import TRANSFORMS
from fl_lightning.engine.distributed import leave_process_group
from fl_lightning.engine.round import one_line
from fl_lightning.errors import ConfigError, RunError, check_number
from fl_lightning.lightning.checkpoint import (
    AtomicCheckpointIO,
    FingerprintError,
    LastRoundCheckpoint,
    load_checkpoint_file,
)
from fl_lightning.lightning.loggers import RoundStepLogger
from fl_lightning.lightning.module import FederatedModule
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

#: The subcommands that evaluate a checkpoint; without ``--config`` they read its run's ``config.yaml``.
_EVALUATION = ("validate", "test", "predict")


class _NonFiniteFloatError(Exception):
    """A float field got ``nan``/``inf`` (text to YAML): the parser parses ``new_args`` (``.nan``) instead."""

    def __init__(self, args: list[str]) -> None:
        super().__init__("retry")
        self.new_args = args


class FederatedArgumentParser(LightningArgumentParser):
    """The CLI's parser: no abbreviated options, and parse errors are one ``error:`` line (no usage).

    argparse (and jsonargparse 4) expand a prefix of an option (``--model.lr`` to ``--model.lr_decay``);
    ``allow_abbrev=False`` turns that off here and, through the parser class, in every subcommand's and
    every nested class's parser. An unknown option, class name or value gets "did you mean ...?" where a
    known one is close; a float field given ``nan``/``inf`` (text to YAML) is parsed again as
    ``.nan``/``.inf`` so that the field's own check says what it accepts.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_args(self, args: Any = None, *more: Any, **kwargs: Any) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        for _ in range(len(argv) + 1):
            self._fl_args = argv
            try:
                return super().parse_args(argv, *more, **kwargs)
            except _NonFiniteFloatError as retry:
                argv = retry.new_args
        return super().parse_args(argv, *more, **kwargs)

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error:  # jsonargparse is trying alternatives: let it catch the error
            super().error(message, ex)
        if "Problems parsing config" in message:
            text = _yaml_error(getattr(self, "_fl_args", [])) or " ".join(message.split())
        else:
            text, retry = parse_error(message, _REGISTRIES, self._option_keys, self._help_hint())
            if retry is not None:
                new_args = rewrite_float_arg(getattr(self, "_fl_args", []), *retry)
                if new_args is not None:
                    raise _NonFiniteFloatError(new_args)
        sys.stderr.write(f"error: {text}\n")
        self.exit(2)

    def _help_hint(self) -> str:
        command = getattr(self, "subcommand", None) or "fit"
        return f"`python -m fl_lightning {command} --help` lists the options"

    def _option_keys(self) -> list[str]:
        """Every dotted option: the parser's own and those of the default classes (``model.client.lr``)."""
        keys = [s[2:] for s in self._option_string_actions if s.startswith("--") and not s.endswith(".help")]
        with contextlib.suppress(Exception):  # an error inside an error message: the parser's own suffice
            keys += config_keys(self.get_defaults().as_dict())
        return keys


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


#: Known class names by the last part of the field that takes them, for "did you mean" on a mistyped name.
_REGISTRIES = {
    "strategy": list_strategies,
    "partition": lambda: [c.__name__ for c in PARTITIONERS.values()],
    "client_transform": lambda: [c.__name__ for c in TRANSFORMS.values()],
    "net": lambda: sorted({c.__name__ for c in MODELS.values()}, key=str.lower),
}


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
        defaults = {**TRAINER_DEFAULTS, **kwargs.pop("trainer_defaults", {})}
        self._claimed: list[Path] = []  # run folders this command created (see _place_run)
        self._resumed: tuple[Path, set[str]] | None = None  # a run folder continued, and its files before
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
                "`python -m fl_lightning list` lists the strategies, models, datasets and partitions; "
                "`--verbose` shows every message Lightning prints and a line per round."
            },
            args=args,
            run=run,
            **kwargs,
        )

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """Parse; ``validate``/``test``/``predict`` of a run's checkpoint read ``<run>/config.yaml`` first.

        ``validate --ckpt_path lightning_logs/version_1/checkpoints/last.ckpt`` evaluates the run with the
        configuration it was trained with (written by ``fit`` beside ``checkpoints/``), so the split and the
        network match the checkpoint. A ``--config`` given on the command line replaces it; other options
        given there override single fields of it.
        """
        argv = (
            list(sys.argv[1:] if args is None else args) if not isinstance(args, (dict, Namespace)) else None
        )
        self._run_config = _run_config(argv) if argv is not None else None
        if self._run_config is not None:
            logging.getLogger("fl_lightning").info(
                "reading the run's configuration from %s", self._run_config
            )
            args = [argv[0], f"--config={self._run_config}", *argv[1:]]
        super().parse_arguments(parser, args)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """One seed: ``seed_everything`` is also ``model.seed`` and, unless set, ``data.seed``.

        ``model.seed`` (client sampling, every client's RNG stream) is linked and cannot be set on its
        own; ``data.seed`` (partition, local test and validation splits) defaults to null, meaning
        ``seed_everything``: set it to keep a split fixed while ``seed_everything`` varies the training.
        """
        parser.link_arguments("seed_everything", "model.seed", compute_fn=_run_seed)
        for action in parser._actions:  # argparse has no public API to edit an action's help
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
        except ConfigError:
            raise
        except Exception as err:  # a class's own ConfigError, wrapped by jsonargparse (e.g. in a Union)
            cause = find_cause(err, ConfigError)
            if cause is None:
                raise
            raise ConfigError(_full_field(str(cause), config)) from None
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
        if self.subcommand in ("fit", None):  # None: a run built without a subcommand (the Flower ServerApp)
            self._place_run(config)
        saver = self.save_config_callback
        if self.subcommand not in ("fit", None) and config.get("logger") in (None, True):
            # validate/test/predict log into their checkpoint's run folder, or nowhere
            config["logger"] = self._evaluation_logger()
            if config["logger"] is False:
                self.save_config_callback = None
        try:
            trainer = self._instantiate_trainer_with_progress_bar(config, callbacks)
        finally:
            self.save_config_callback = saver
        # run folders that do not exist yet: a run that fails before its first round removes them
        dirs = [getattr(lg, "log_dir", None) for lg in trainer.loggers]  # claims fit's folder (_place_run)
        self._new_log_dirs = [Path(d) for d in dirs if d and not Path(d).exists()] + self._claimed
        return trainer

    def _place_run(self, config: dict[str, Any]) -> None:
        """Give ``fit`` its own run folder: a new ``version_N`` claimed atomically, or the one it resumes.

        Lightning picks the next ``version_N`` by listing the folder and creates it only when it first
        writes, so two runs started together took the same one. Here the folder is created with
        ``os.mkdir`` (retried with the next number if another run took it) when the logger (the default
        TensorBoard logger, or a TensorBoard/CSV logger given without a version) first needs its
        version, i.e. once the Trainer exists: a Trainer refused by Lightning leaves no folder.

        ``--ckpt_path <run>/checkpoints/<file>.ckpt`` continues in ``<run>`` when the checkpoint is the
        run's newest state (as many rounds as its ``last.ckpt``, or more): one TensorBoard run whose
        steps go on from the checkpoint's rounds (anything the run logged after them, e.g. a round cut
        short by a kill, is dropped by TensorBoard: ``purge_step``), ``last.ckpt`` and the
        ``ModelCheckpoint`` best-round tracking carried on, ``config.yaml`` and ``summary.json``
        rewritten for the run as it now stands. An older checkpoint of the run (resuming from round
        ``r`` of a run that went further) starts a new folder, so the run's later rounds are kept.
        """
        ckpt = self.config.get("fit", self.config).get("ckpt_path")
        resume = _resumed_run(ckpt)
        if resume is not None and rank_zero_only.rank == 0:
            self._resumed = (resume[0], {p.name for p in resume[0].iterdir()})
        logger = config.get("logger")
        if logger in (None, True):
            if resume is not None:
                run, rounds = resume
                config["logger"] = TensorBoardLogger(
                    save_dir=str(run.parent.parent),
                    name=run.parent.name,
                    version=run.name,
                    purge_step=rounds + 1,
                )
                # ModelCheckpoint finds its own folder full when a run resumes there: expected
                warnings.filterwarnings(
                    "ignore", message=f"Checkpoint directory {re.escape(str(run))}.* exists and is not empty"
                )
                return
            root = Path(config.get("default_root_dir") or os.getcwd(), "lightning_logs")
            _check_writable(root.parent, "trainer.default_root_dir")
            config["logger"] = TensorBoardLogger(save_dir=str(root.parent), name=root.name, version=None)
            logger = config["logger"]
        for lg in logger if isinstance(logger, list) else [logger]:
            self._claim_on_first_use(lg, resume[0] if resume else None)

    def _claim_on_first_use(self, logger: Logger, resumed: Path | None) -> None:
        """Have a TensorBoard/CSV ``logger`` without a version claim its ``version_N`` when it needs one.

        Its folder is the resumed run's when that lies in the logger's folder. Only the process of global
        rank 0 claims: the others write no logs, and Lightning hands them rank 0's folder where one is
        needed (``trainer.log_dir``, checkpoint folders).

        Lightning's loggers choose their version lazily, through private members (``_version``,
        ``_get_next_version``), and have no public hook to claim it atomically or late: they are used
        here, and lightning is capped at <2.7 (the tested release) in pyproject.toml.
        """
        if not isinstance(logger, (TensorBoardLogger, CSVLogger)) or logger._version is not None:
            return
        root = Path(logger.root_dir).resolve()
        if resumed is not None and resumed.parent == root:
            logger._version = resumed.name
            return
        if rank_zero_only.rank != 0:
            return

        def claim() -> int:
            try:
                n = _claim_version(root)
            except OSError as err:
                raise ConfigError(
                    f"trainer.logger: cannot create a run folder in {root} ({err.strerror or err}); "
                    "choose a writable save_dir"
                ) from None
            self._claimed.append(root / f"version_{n}")
            return n

        logger._get_next_version = claim  # what the logger calls for its version, the first time

    def _undo_run_folder(self) -> None:
        """A run refused before its first round leaves no trace: its claimed folder, its new event files."""
        for d in self._new_log_dirs:
            shutil.rmtree(d, ignore_errors=True)
        if self._resumed is not None:
            run, before = self._resumed
            for path in run.glob("events.out.tfevents.*"):
                if path.name not in before:
                    path.unlink(missing_ok=True)

    def _evaluation_logger(self) -> TensorBoardLogger | bool:
        """``<run>/<subcommand>/`` for a checkpoint under ``<run>/checkpoints/``; else no logger.

        A ``validate`` or ``test`` of a fitted run then appears in TensorBoard as the run
        ``version_N/test`` (its scalars at step = the checkpoint's rounds) instead of as a new
        ``version_N+1`` folder.
        """
        ckpt = self.config.get(str(self.subcommand), {}).get("ckpt_path")
        if not ckpt or Path(ckpt).parent.name != "checkpoints":
            return False
        return RoundStepLogger(save_dir=str(Path(ckpt).parent.parent), name="", version=self.subcommand)

    def _trainer_defaults(self) -> dict[str, Any]:
        """The Trainer's arguments when none is given: its signature's defaults and the CLI's."""
        params = inspect.signature(Trainer.__init__).parameters.values()
        return {
            **{p.name: p.default for p in params if p.default is not inspect.Parameter.empty},
            **self.trainer_defaults,
        }

    def _run_subcommand(self, subcommand: str) -> None:
        try:
            try:
                super()._run_subcommand(subcommand)
            except MisconfigurationException as err:  # a flag or callback Lightning refuses once it runs
                raise ConfigError(
                    trainer_error(err, getattr(self, "_trainer_config", {}), self._trainer_defaults())
                ) from None
            except FingerprintError as err:
                raise ConfigError(self._fingerprint_message(err)) from None
        except ConfigError:
            if self.trainer.global_step == 0 and self.trainer.is_global_zero:
                self._undo_run_folder()
            raise

    def _fingerprint_message(self, err: FingerprintError) -> str:
        """The fingerprint mismatch with the fix for this subcommand: which config to give."""
        subcommand = str(self.subcommand)
        written_by = _writing_run_config(self.config.get(subcommand, {}).get("ckpt_path"))
        where = (
            f"--config {written_by}"
            if written_by
            else "--config with the config.yaml of the run that wrote it"
        )
        if self._run_config is not None:  # read for this evaluation: options given with it changed it
            fix = f"The options given override these fields of the run's {self._run_config}; drop them"
        elif subcommand == "fit":
            fix = (
                f"Resume with the config it was written with ({where}) or start a new run without --ckpt_path"
            )
        else:
            fix = f"{subcommand.capitalize()} it with the config it was written with: {where}"
        return f"ckpt_path: the checkpoint comes from a different config: {'; '.join(err.diffs)}. {fix}"

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
        name_checkpoints_by_round(given)
        callbacks = [*callbacks, *self._summary_callback(given)]
        if self.subcommand == "predict" and not any(isinstance(c, BasePredictionWriter) for c in given):
            callbacks = [*callbacks, PredictionWriter()]
        plugins = config.get("plugins") or []
        plugins = plugins if isinstance(plugins, list) else [plugins]
        if not any(isinstance(p, CheckpointIO) for p in plugins):
            config["plugins"] = [*plugins, AtomicCheckpointIO()]
        interval = config.get("val_check_interval")
        if interval is not None:  # Lightning takes 0, then divides by it in the first round
            check_number(
                interval,
                "trainer.val_check_interval",
                low=0,
                low_open=True,
                hint="1 evaluates after every round",
            )
        self._trainer_config = dict(config)
        try:
            trainer = super()._instantiate_trainer(config, callbacks)
        except ConfigError:
            raise
        except (MisconfigurationException, ValueError, ImportError) as err:
            # Lightning refusing a flag (accelerator=gpu without a GPU, max_steps=-5, ...)
            raise ConfigError(trainer_error(err, self._trainer_config, self._trainer_defaults())) from None
        _check_writable(trainer.default_root_dir, "trainer.default_root_dir")
        for logger in trainer.loggers:
            if logger.save_dir is not None:
                _check_writable(logger.save_dir, "trainer.logger.init_args.save_dir")
        return trainer

    def _summary_callback(self, given: list[Callback]) -> list[Callback]:
        """A :class:`FederatedSummary` unless one is given, with the run's config as its hyperparameters."""
        config = self.config.get(str(self.subcommand), self.config)
        hparams = flatten_config(config.as_dict() if hasattr(config, "as_dict") else dict(config))
        summaries = [c for c in given if isinstance(c, FederatedSummary)]
        for summary in summaries:
            if summary.hparams is None:
                summary.hparams = hparams
        return [] if summaries else [FederatedSummary(hparams=hparams)]

    def _set_seed(self) -> None:
        seed = self._get(self.config, "seed_everything")
        if seed is not None and not isinstance(seed, bool):
            check_number(seed, "seed_everything", low=0, high=2**32 - 1, hint="or true for a random seed")
        super()._set_seed()


class _ParseOnly(FederatedCLI):
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
    with console(), _fit_errors():
        parser = _ParseOnly(args=[], run=False).parser

    def resolve(args: list[str], check: bool = True) -> dict[str, Any]:
        with console(), _fit_errors():
            config = parser.parse_args(list(args))
            dumped = yaml.safe_load(parser.dump(config, skip_none=False))
        if check:
            _instantiate(parser, config)
        return dumped

    return resolve


def _instantiate(parser: LightningArgumentParser, config: Namespace) -> None:
    """Build the classes of a parsed ``config`` (model, data, callbacks) to run their checks; a class's
    :class:`ConfigError` (perhaps wrapped by jsonargparse) is raised as one line naming the field."""
    config = config.clone()
    if config.get("data.seed") is None:
        config["data.seed"] = _run_seed(config.get("seed_everything"))
    try:
        with console():
            parser.instantiate_classes(config)
    except ConfigError:
        raise
    except Exception as err:
        cause = find_cause(err, ConfigError)
        if cause is None:
            raise ConfigError(f"the configuration cannot be built: {one_line(err)}") from None
        raise ConfigError(_full_field(str(cause), config)) from None


@contextlib.contextmanager
def _fit_errors() -> Iterator[None]:
    """A parse error (one ``error:`` line on stderr, exit 2) as a :class:`ConfigError` with that line."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            yield
    except SystemExit:
        lines = [ln for ln in stderr.getvalue().splitlines() if ln.strip()]
        line = next((ln for ln in reversed(lines) if ln.startswith("error: ")), lines[-1] if lines else "")
        raise ConfigError(line.removeprefix("error: ") or "the arguments do not parse") from None


def _run_config(argv: list[str]) -> Path | None:
    """``<run>/config.yaml`` for ``validate``/``test``/``predict --ckpt_path <run>/checkpoints/X.ckpt``.

    None for another subcommand, a command line with ``--config``, or a checkpoint outside a run folder.
    """
    if not argv or argv[0] not in _EVALUATION:
        return None
    if any(a in ("-c", "--config") or str(a).startswith("--config=") for a in argv):
        return None
    ckpt = None
    for i, arg in enumerate(argv):
        if arg == "--ckpt_path" and i + 1 < len(argv):
            ckpt = argv[i + 1]
        elif str(arg).startswith("--ckpt_path="):
            ckpt = str(arg).split("=", 1)[1]
    if not ckpt or ckpt in _SPECIAL_CKPT_PATHS or "://" in ckpt:
        return None
    path = Path(ckpt)
    config = path.parent.parent / "config.yaml"
    return config if path.parent.name == "checkpoints" and config.is_file() else None


def _writing_run_config(ckpt: Any) -> Path | None:
    """The ``config.yaml`` of the run that wrote ``ckpt``, or None if it does not exist (any more).

    It is beside the checkpoint's ``checkpoints/`` folder, or, for a copied checkpoint, beside the folder
    its checkpoint callbacks wrote to (their state records it).
    """
    if not ckpt or str(ckpt) in _SPECIAL_CKPT_PATHS or "://" in str(ckpt):
        return None
    path = Path(ckpt)
    folders = [path.parent] if path.parent.name == "checkpoints" else []
    try:
        checkpoint = load_checkpoint_file(path, "cpu", mmap=True)
        states = checkpoint.get("callbacks") or {}
        folders += [Path(s["dirpath"]) for s in states.values() if isinstance(s, dict) and s.get("dirpath")]
    except (ConfigError, OSError):
        pass
    for folder in folders:
        config = folder.parent / "config.yaml"
        if config.is_file():
            return config
    return None


def _full_field(message: str, config: Any) -> str:
    """A class's ``ConfigError`` naming its own argument (``pretrained=True: ...``), with the config field.

    A class nested in the config (a network inside ``Decomposed``) does not know where it sits; the
    first ``<argument>: <value>`` in the config with that name and value does.
    """
    match = re.match(r"(\w+)=(\S+?):? ", message)
    if match is None:
        return message
    name, value = match.groups()
    as_dict = config.as_dict() if hasattr(config, "as_dict") else config
    for candidate in (value, _yaml_scalar(value)):
        key = find_key(as_dict, name, candidate)
        if key:
            return f"{key}{message[len(name) :]}"
    return message


def _yaml_scalar(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


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


def _claim_version(parent: Path) -> int:
    """Create the next free ``version_N`` folder under ``parent`` and return its ``N``.

    ``os.mkdir`` either creates the folder or fails because it exists, so two runs started together
    never get the same one: the loser tries the next number.
    """
    parent.mkdir(parents=True, exist_ok=True)
    taken = [int(m.group(1)) for p in parent.iterdir() if (m := re.fullmatch(r"version_(\d+)", p.name))]
    n = max(taken, default=-1) + 1
    while True:
        try:
            os.mkdir(parent / f"version_{n}")
        except FileExistsError:
            n += 1
            continue
        return n


def _resumed_run(ckpt: Any) -> tuple[Path, int] | None:
    """``(run folder, rounds)`` when ``fit --ckpt_path`` should continue the checkpoint's own run.

    That is a checkpoint under ``<run>/checkpoints/`` with at least the rounds of the run's ``last.ckpt``
    (it is ``last.ckpt``, or a newer copy); None for anything else (a new run folder).
    """
    if not ckpt or str(ckpt) in _SPECIAL_CKPT_PATHS or "://" in str(ckpt):
        return None
    path = Path(ckpt).expanduser().resolve()
    if path.parent.name != "checkpoints":
        return None
    run = path.parent.parent
    rounds = _rounds(path)
    last = path.parent / "last.ckpt"
    if rounds is None or (last != path and last.exists() and (_rounds(last) or 0) > rounds):
        if rounds is not None:
            logging.getLogger("fl_lightning").info(
                "resuming from round %d of %s, which went further: this run gets a new folder", rounds, run
            )
        return None
    return run, rounds


def _rounds(path: Path) -> int | None:
    """The rounds a checkpoint file has done (its ``global_step``); None if it cannot be read."""
    try:
        return int(load_checkpoint_file(path, "cpu", True, mmap=True).get("global_step", 0))
    except ConfigError:
        return None


def name_checkpoints_by_round(callbacks: list[Callback]) -> None:
    """``ModelCheckpoint`` files named ``round=<rounds done>.ckpt`` where no ``filename`` was given.

    Lightning's default, ``{epoch}-{step}``, reads ``epoch=0-step=12.ckpt`` in a federated run (one
    epoch holds every round; the step is the round count). A given ``filename`` is kept as it is.
    """
    for cb in callbacks:
        if (
            isinstance(cb, ModelCheckpoint)
            and not isinstance(cb, LastRoundCheckpoint)
            and cb.filename is None
        ):
            cb.filename = "round={step}"
            cb.auto_insert_metric_name = False


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
    "transforms": ("--data.client_transform=NAME", lambda: [c.__name__ for c in TRANSFORMS.values()]),
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


#: Lightning's status lines and warnings a federated run does not need, hidden unless ``--verbose``: the
#: seed and device report, "stopped: max_steps reached" (the summary follows), checkpoint restore notices,
#: the distributed start-up banner, and ``ModelCheckpoint``'s "dirpath has changed" (``validate``/``test``
#: write no checkpoints; a resumed ``fit`` continues in its own folder).
_QUIET = re.compile(
    r"Seed set to \d+|GPU available: |LOCAL_RANK: \d+ - CUDA_VISIBLE_DEVICES"
    r"|`Trainer\.fit` stopped: `max_steps="
    r"|Restoring states from the checkpoint path|Restored all states from the checkpoint"
    r"|Loaded model weights from the checkpoint|The dirpath has changed from"
    r"|Initializing distributed: GLOBAL_RANK|All distributed processes registered"
)


class _DropNoise(logging.Filter):
    def __init__(self, pattern: re.Pattern[str]) -> None:
        super().__init__()
        self.pattern = pattern

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.search(record.getMessage())


class _StdoutHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stdout`` is at the time of the record (redirections and capture included)."""

    @property
    def stream(self) -> Any:
        return sys.stdout

    @stream.setter
    def stream(self, value: Any) -> None:
        """The stream is always the current ``sys.stdout``."""


def list_names(argv: list[str]) -> None:
    """``python -m fl_lightning list [strategies|models|datasets|partitions|transforms]``: the names a config
    takes."""
    parser = argparse.ArgumentParser(
        prog="python -m fl_lightning list",
        description="The names a config takes, by config field.",
        allow_abbrev=False,
    )
    parser.add_argument("what", nargs="?", help=f"one of {', '.join(LISTS)} (default: all)")
    what = parser.parse_args(argv).what
    if what is not None and what not in LISTS:
        sys.stderr.write(f"error: list: {what!r} is not one of {', '.join(LISTS)}\n")
        raise SystemExit(2)
    for name in [what] if what else LISTS:
        field, names = LISTS[name]
        sys.stdout.write(f"{name} ({field}):\n  " + ", ".join(names()) + "\n")


def _take_verbose(args: Any) -> tuple[Any, bool]:
    """``args`` without ``--verbose`` (``sys.argv`` when ``args`` is None), and whether it was given."""
    argv = sys.argv[1:] if args is None else args
    if not isinstance(argv, (list, tuple)) or "--verbose" not in argv:
        return args, False
    kept = [a for a in argv if a != "--verbose"]
    if args is None:
        sys.argv[1:] = kept
        return None, True
    return kept, True


def _set_up_console(verbose: bool) -> Callable[[], None]:
    """Route the ``fl_lightning`` logger to stdout and hide Lightning's noise; returns the undo.

    Quiet (the default): the ``fl_lightning`` logger at INFO, Lightning's :data:`_NOISE` and
    :data:`_QUIET` lines dropped. ``verbose``: the logger at DEBUG (a line per round without a terminal)
    and nothing of Lightning's dropped.
    """
    logger = logging.getLogger("fl_lightning")
    if not logger.handlers:
        handler = _StdoutHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    if verbose:
        return lambda: None
    drop = _DropNoise(re.compile(f"{_NOISE.pattern}|{_QUIET.pattern}"))
    targets: list[logging.Logger | logging.Handler] = []
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):  # the loggers with handlers
        lightning_log = logging.getLogger(name)
        targets += [lightning_log, *lightning_log.handlers]
    for target in targets:
        target.addFilter(drop)

    def undo() -> None:
        for target in targets:
            target.removeFilter(drop)

    return undo


def _filter_warnings(verbose: bool) -> None:
    """Inside ``warnings.catch_warnings()``: drop Lightning's warnings that do not apply (none if verbose)."""
    if verbose:
        return
    warnings.filterwarnings("ignore", message=f".*({_NOISE.pattern}|{_QUIET.pattern})")
    warnings.filterwarnings("ignore", message=_SYNC_DIST_ADVICE, category=PossibleUserWarning)


@contextlib.contextmanager
def console(verbose: bool = False) -> Iterator[None]:
    """The command line's console for the duration of a command: the ``fl_lightning`` logger on stdout,
    Lightning's noise and warnings that do not apply dropped (none with ``verbose``). The Flower
    ServerApp fits inside it too."""
    undo = _set_up_console(verbose)
    try:
        with warnings.catch_warnings():
            _filter_warnings(verbose)
            yield
    finally:
        undo()


def main(args: Any = None) -> None:
    """Entry point of ``python -m fl_lightning``; bad input exits with a one-line ``error:``.

    Lightning's tips, status lines, deprecation notices and advice that does not apply to federated
    runs are filtered for the duration of the command only (nothing is filtered at import);
    ``--verbose`` (anywhere on the command line) filters nothing and logs a line per round.
    """
    argv = sys.argv[1:] if args is None else list(args)
    if argv[:1] == ["list"]:
        list_names(argv[1:])
        return
    args, verbose = _take_verbose(args)
    try:
        with console(verbose):
            FederatedCLI(args=args)
        leave_process_group()
    except SIGTERMException:
        sys.stderr.write(
            "error: stopped by SIGTERM (a fit's completed rounds are in its last.ckpt and summary.json)\n"
        )
        raise SystemExit(128 + signal.SIGTERM) from None
    except KeyboardInterrupt:  # outside Lightning's own handling (which exits with status 1)
        sys.stderr.write("error: interrupted\n")
        raise SystemExit(130) from None
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
