"""``python -m fl_lightning {fit,validate,test}``: LightningCLI over the federated module and data."""

from __future__ import annotations

import logging
import re
import sys
from typing import Any, NoReturn

from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, ProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback

from fl_lightning.callbacks import FederatedProgressBar, FederatedSummary
from fl_lightning.checkpoint import AtomicCheckpointIO, LastRoundCheckpoint, load_checkpoint_file
from fl_lightning.data.federated import FederatedDataModule
from fl_lightning.errors import ConfigError
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


#: ``--ckpt_path`` values Lightning resolves itself instead of naming a file.
_SPECIAL_CKPT_PATHS = ("last", "best", "hpc", "registry")


class FederatedArgumentParser(LightningArgumentParser):
    """The CLI's parser: parse errors are reported on one line, with the choices where they help."""

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        text = " ".join(message.split())
        match = re.match(r'Parser key "([^"]+)"', text)
        if match and match.group(1).endswith("strategy"):
            names = ", ".join(sorted(cls.__name__ for cls in STRATEGIES.values()))
            given = re.search(r"but (\S+) either", text)
            what = f"{given.group(1)!r} is not" if given else "value is not"
            text = f"{match.group(1)}: {what} a known strategy; choose one of {names} or a full class path"
        super().error(text, ex)


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
            args=args,
            run=run,
            **kwargs,
        )

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
        return super()._instantiate_trainer(config, callbacks)


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
