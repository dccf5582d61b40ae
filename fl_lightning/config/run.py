"""A run built from its configuration: ``fit``'s YAML and overrides to Trainer, module and data.

:class:`RunBuilder` is the LightningCLI every path builds a run with (the command line's subcommands
derive from it, the Flower apps build through :func:`build_run`): the same parser, defaults, seed links and
one-line errors, so one config and seed give the same initial model and split everywhere. The Trainer
is :func:`~fl_lightning.lightning.trainer.federated_trainer`.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import io
import re
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import Namespace
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from fl_lightning.callbacks.summary import flatten_config
from fl_lightning.config.errors import find_cause, find_key, trainer_error
from fl_lightning.config.parser import FederatedArgumentParser
from fl_lightning.data.federated import FederatedDataModule
from fl_lightning.errors import ConfigError, check_number
from fl_lightning.lightning.console import quiet
from fl_lightning.lightning.loggers import folder_label, run_label
from fl_lightning.lightning.module import FederatedModule
from fl_lightning.lightning.trainer import DEFAULT_ROUNDS, ROUND_DEFAULTS, round_trainer

#: The Trainer defaults of a run's configuration: one training step is one round (see FederatedModule).
TRAINER_DEFAULTS: dict[str, Any] = {"max_steps": DEFAULT_ROUNDS, **ROUND_DEFAULTS}


class SaveConfigAfterRestore(SaveConfigCallback):
    """Writes ``config.yaml`` when the run starts, after ``--ckpt_path`` was loaded and accepted.

    Lightning's callback writes it in ``setup``, before the checkpoint is restored, so a resume
    refused by the fingerprint check overwrote the reused log directory's config with the rejected one.
    """

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._stage = stage

    def _save_now(self, trainer: Trainer, pl_module: LightningModule) -> None:
        with warnings.catch_warnings():
            # Lightning 2.6 saves with jsonargparse's deprecated ``skip_none=False`` (same output as
            # ``skip_unset=False``); the deprecation is Lightning's to fix, not the user's to read
            warnings.filterwarnings(
                "ignore",
                message=r"\s*(skip_none parameter was deprecated|By default only one Jsonargparse)",
                category=DeprecationWarning,
            )
            super().setup(trainer, pl_module, self._stage)

    on_fit_start = on_validation_start = on_test_start = on_predict_start = _save_now


#: Parsers built in this process (:meth:`RunBuilder.setup_parser`), by what they were built from: the parser,
#: the subcommands' parsers and the arguments each subcommand's Trainer method takes, as built (unparsed).
_BUILT_PARSERS: dict[str, tuple[Any, Any, Any]] = {}


class RunBuilder(LightningCLI):
    """LightningCLI with the federated defaults: ``trainer.max_steps`` is the number of rounds.

    Every constructor argument of :class:`FederatedModule`, its client, strategy and network, and of
    :class:`FederatedDataModule` and its partitioner is a config field (``class_path``/``init_args``),
    documented by ``--help`` and shown by ``--print_config``. ``seed_everything`` is the run's one seed
    (``model.seed`` is linked to it; ``data.seed`` follows it unless set). The Trainer is
    :func:`~fl_lightning.lightning.trainer.federated_trainer`'s, with the run's config as the summary's
    hyperparameters; a Trainer flag Lightning refuses is one ``ConfigError`` line.
    """

    def __init__(self, args: Any = None, run: bool = True, **kwargs: Any) -> None:
        defaults = {**TRAINER_DEFAULTS, **kwargs.pop("trainer_defaults", {})}
        self._claimed: list[Path] = []  # run folders the Trainer's loggers created
        kwargs.setdefault("parser_kwargs", {})
        super().__init__(
            FederatedModule,
            FederatedDataModule,
            seed_everything_default=0,
            trainer_defaults=defaults,
            save_config_callback=SaveConfigAfterRestore,
            save_config_kwargs={"overwrite": True},
            auto_configure_optimizers=False,
            parser_class=FederatedArgumentParser,
            args=args,
            run=run,
            **kwargs,
        )

    def setup_parser(self, add_subcommands: bool, main_kwargs: Any, subparser_kwargs: Any) -> None:
        """LightningCLI's parser, built once per process and copied for each run built after the first.

        Building it reads the signature and docstring of every class a config can name (about 0.5 s, a
        third of a one-round run's own time); runs built one after another in one process (a notebook, a
        sweep's checks, the tests) get a copy of the first one's parser as it was before any parsing, so
        no run sees another's defaults or links. A parser built from arguments that do not print the same
        twice (an object's address) is not kept.
        """
        key = self._parser_key(add_subcommands, main_kwargs, subparser_kwargs)
        built = _BUILT_PARSERS.get(key) if key is not None else None
        if built is None:
            super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)
            built = (
                self.parser,
                getattr(self, "_subcommand_parsers", None),
                getattr(self, "_subcommand_method_arguments", None),
            )
            if key is not None:
                _BUILT_PARSERS[key] = copy.deepcopy(built)
            return
        self.parser, parsers, method_arguments = copy.deepcopy(built)  # one copy: shared parts stay shared
        if parsers is not None:
            self._subcommand_parsers, self._subcommand_method_arguments = parsers, method_arguments

    def _parser_key(self, add_subcommands: bool, main_kwargs: Any, subparser_kwargs: Any) -> str | None:
        """What the parser is built from, printed; None when that print holds an object's address."""
        trainer_defaults = {k: v for k, v in self.trainer_defaults.items() if k != "callbacks"}
        key = repr(
            (
                type(self).__module__,
                type(self).__qualname__,
                add_subcommands,
                main_kwargs,
                subparser_kwargs,
                trainer_defaults,
                self.seed_everything_default,
                self._model_class,
                self._datamodule_class,
                self.subclass_mode_model,
                self.subclass_mode_data,
                self.trainer_class,
                self.parser_class,
                self.auto_configure_optimizers,
            )
        )
        return None if " at 0x" in key else key

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """Parse ``args`` (``sys.argv`` when None), as LightningCLI does.

        LightningCLI warns ("LightningCLI's args parameter is intended to run from within Python ...")
        whenever ``args`` is given while ``sys.argv`` has arguments: here ``args`` are often built from
        ``sys.argv`` (``validate`` reading a run's config), so the warning would only be noise.
        """
        if isinstance(args, (dict, Namespace)):
            self.config = parser.parse_object(args)
        else:
            self.config = parser.parse_args(args)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """One seed: ``seed_everything`` is also ``model.seed`` and, unless set, ``data.seed``.

        ``model.seed`` (client sampling, every client's RNG stream) is linked and cannot be set on its
        own; ``data.seed`` (partition, local test and validation splits) defaults to null, meaning
        ``seed_everything``: set it to keep a split fixed while ``seed_everything`` varies the training.
        """
        parser.link_arguments("seed_everything", "model.seed", compute_fn=run_seed)
        parser.add_argument(
            "--name",
            type=str | None,
            default="auto",
            help="A label of the run folder, lightning_logs/version_N-<name> (TensorBoard's run name too); "
            "auto (the default): the strategy, partition, client transform and system model "
            "(version_3-fedbuff-dirichlet-devices); null, '' or none: a bare version_N.",
        )
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
        seed = run_seed(config.get("seed_everything"))
        for path in [*(self.config.get("config") or []), *(config.get("config") or [])]:
            check_model_seed(path, seed)
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
            raise ConfigError(full_field(str(cause), config)) from None
        finally:
            if follow:
                config["data.seed"] = None

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Callback]) -> Trainer:
        """The Trainer of :func:`~fl_lightning.lightning.trainer.federated_trainer`, with the config's
        callbacks, ``callbacks`` and the config saver (as LightningCLI's), and the config as hparams."""
        given = config.get("callbacks") or []
        given = [*(given if isinstance(given, list) else [given]), *callbacks]
        run_config = self.config.get(str(self.subcommand), self.config)
        if self.save_config_callback and not config.get("fast_dev_run", False):
            saver = self.save_config_callback
            given.append(saver(self._parser(self.subcommand), run_config, **self.save_config_kwargs))
        config["callbacks"] = given
        hparams = flatten_config(run_config.as_dict() if hasattr(run_config, "as_dict") else dict(run_config))
        self._trainer_config = dict(config)
        name = folder_label(run_config.get("name"))
        if name == "auto":
            name = run_label(getattr(self, "model", None), getattr(self, "datamodule", None))
        try:
            return round_trainer(**config, name=name, hparams=hparams, on_new_run_folder=self._claimed.append)
        except ConfigError:
            raise
        except (MisconfigurationException, ValueError, ImportError) as err:
            # Lightning refusing a flag (accelerator=gpu without a GPU, max_steps=-5, ...)
            raise ConfigError(trainer_error(err, self._trainer_config, self._trainer_defaults())) from None

    def _trainer_defaults(self) -> dict[str, Any]:
        """The Trainer's arguments when none is given: its signature's defaults and the run's."""
        params = inspect.signature(Trainer.__init__).parameters.values()
        return {
            **{p.name: p.default for p in params if p.default is not inspect.Parameter.empty},
            **self.trainer_defaults,
        }

    def _set_seed(self) -> None:
        """Check ``seed_everything`` (one line for a bad value), then seed the global RNGs as Lightning does.

        Lightning logs "Seed set to N"; the console leaves it out unless ``--verbose``.
        """
        seed = self._get(self.config, "seed_everything")
        if seed is not None and not isinstance(seed, bool):
            check_number(seed, "seed_everything", low=0, high=2**32 - 1, hint="or true for a random seed")
        super()._set_seed()


class _WithoutTrainer(RunBuilder):
    """The run's model and data, no Trainer (a process that trains clients only: a Flower ClientApp)."""

    def instantiate_trainer(self, **kwargs: Any) -> None:
        return None


def build_run(args: Sequence[str], trainer: bool = True) -> RunBuilder:
    """The run ``fit`` builds from ``args`` (its arguments, without ``fit``): ``.model``, ``.datamodule``,
    ``.trainer`` (None without ``trainer``) and ``.config``, the global RNGs seeded with
    ``seed_everything`` first, as ``fit`` does.

    Raises:
        ConfigError: ``fit``'s one line for bad arguments or values.
    """
    with quiet(), parse_errors():  # built inside no command's console: Lightning's noise left out here
        return (RunBuilder if trainer else _WithoutTrainer)(args=list(args), run=False)


@contextlib.contextmanager
def parse_errors() -> Iterator[None]:
    """A parse error (one ``error:`` line on stderr, exit 2) as a :class:`ConfigError` with that line."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            yield
    except SystemExit:
        lines = [ln for ln in stderr.getvalue().splitlines() if ln.strip()]
        line = next((ln for ln in reversed(lines) if ln.startswith("error: ")), lines[-1] if lines else "")
        raise ConfigError(line.removeprefix("error: ") or "the arguments do not parse") from None


def full_field(message: str, config: Any) -> str:
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


def run_seed(seed_everything: bool | int | None) -> int:
    """The federated run's seed: ``seed_everything`` (0 when it is false, or not drawn yet)."""
    return seed_everything if type(seed_everything) is int else 0


def check_model_seed(path: Any, seed: int) -> None:
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
