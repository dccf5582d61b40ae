"""``python -m fl_lightning {fit,validate,test,predict,list}``: the command line over a run's config."""

from __future__ import annotations

import errno
import re
import signal
import sys
from pathlib import Path
from typing import Any

from jsonargparse import Namespace
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import BasePredictionWriter, Callback
from lightning.pytorch.cli import LightningArgumentParser
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException
from torch.multiprocessing import ProcessRaisedException

from fl_lightning.callbacks import PredictionWriter
from fl_lightning.cli import help as cli_help
from fl_lightning.cli import runs
from fl_lightning.cli.lists import list_names
from fl_lightning.config.errors import trainer_error
from fl_lightning.config.run import RunBuilder
from fl_lightning.engine.distributed import leave_process_group
from fl_lightning.errors import ConfigError, RunError
from fl_lightning.lightning.checkpoint import FingerprintError, load_checkpoint_file
from fl_lightning.lightning.console import console
from fl_lightning.lightning.loggers import continue_version


class FederatedCLI(RunBuilder):
    """The subcommands ``fit``, ``validate``, ``test`` and ``predict`` over a run's configuration.

    On top of :class:`~fl_lightning.config.run.RunBuilder` (parser, seeds, the run's Trainer): the help as
    the command is typed (:mod:`fl_lightning.cli.help`), ``--ckpt_path`` checked before anything runs,
    the run folder a command writes to and the config it reads (:mod:`fl_lightning.cli.runs`), and errors
    while it runs as one line, a refused run leaving no folder behind.
    """

    def __init__(self, args: Any = None, run: bool = True, **kwargs: Any) -> None:
        self._resumed: tuple[Path, set[str]] | None = None  # a run folder continued, and its files before
        self._new_log_dirs: list[Path] = []
        kwargs.setdefault("parser_kwargs", cli_help.parser_kwargs(self.subcommands()))
        super().__init__(args=args, run=run, **kwargs)

    def setup_parser(self, add_subcommands: bool, main_kwargs: Any, subparser_kwargs: Any) -> None:
        super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)
        cli_help.describe_subcommands(self.parser)

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
        self._run_config = runs.run_config(argv) if argv is not None else None
        if self._run_config is not None:
            runs.log.info("reading the run's configuration from %s", self._run_config)
            args = [argv[0], f"--config={self._run_config}", *argv[1:]]
        subcommand = argv[0] if argv and argv[0] in self.subcommands() else None
        with cli_help.usage_of(subcommand):
            super().parse_arguments(parser, args)

    def _parse_ckpt_path(self) -> None:
        """Check ``--ckpt_path`` before anything runs (one line if it is not a checkpoint).

        Lightning's version ``torch.load``s the file here, lets a bad file's traceback through, and replaces
        the ``model`` config given with the checkpoint's ``hyper_parameters``. Here the config is the command
        line's: the checkpoint's fingerprint check refuses one it does not fit, and a resume warns about
        changed hyperparameters (``FederatedModule.load_from_checkpoint`` reads them from Python).
        """
        subcommand = self.config.get("subcommand")
        path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if not runs.local_checkpoint(path):
            return
        weights_only = self.config[subcommand].get("weights_only")  # --weights_only=false: the user's call
        load_checkpoint_file(path, "cpu", weights_only is not False, mmap=True)

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Callback]) -> Trainer:
        """The run's Trainer, in the run folder of the subcommand (see :mod:`fl_lightning.cli.runs`)."""
        if self.subcommand == "fit":
            config["logger"] = self._fit_logger(config.get("logger"))
        saver = self.save_config_callback
        if self.subcommand not in ("fit", None) and config.get("logger") in (None, True):
            # validate/test/predict log into their checkpoint's run folder, or nowhere
            ckpt = self.config.get(str(self.subcommand), {}).get("ckpt_path")
            config["logger"] = runs.evaluation_logger(ckpt, str(self.subcommand))
            if config["logger"] is False:
                self.save_config_callback = None
        given = config.get("callbacks") or []
        given = given if isinstance(given, list) else [given]
        if self.subcommand == "predict" and not any(isinstance(c, BasePredictionWriter) for c in given):
            callbacks = [*callbacks, PredictionWriter()]
        try:
            trainer = super()._instantiate_trainer(config, callbacks)
        finally:
            self.save_config_callback = saver
        # the run folder is claimed now (first use of log_dir), not when the first round logs; folders
        # that do not exist yet are this command's: a run that fails before its first round removes them
        dirs = [getattr(lg, "log_dir", None) for lg in trainer.loggers]
        self._new_log_dirs = [Path(d) for d in dirs if d and not Path(d).exists()] + self._claimed
        return trainer

    def _fit_logger(self, logger: Any) -> Any:
        """``fit``'s logger: the run it continues (``--ckpt_path`` of the run's newest state), else as given
        (None: the run's Trainer creates ``lightning_logs/version_N``)."""
        resume = runs.resumed_run(self.config.get("fit", self.config).get("ckpt_path"))
        if resume is None:
            return logger
        run, rounds = resume
        if rank_zero_only.rank == 0:
            self._resumed = (run, runs.files_of(run))
        if logger in (None, True):
            return runs.resume_logger(run, rounds)
        for lg in logger if isinstance(logger, list) else [logger]:
            if isinstance(lg, Logger):
                continue_version(lg, run)
        return logger

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
                runs.remove_new_files(self._new_log_dirs, self._resumed)
            raise

    def _fingerprint_message(self, err: FingerprintError) -> str:
        """The fingerprint mismatch with the fix for this subcommand: which config to give."""
        subcommand = str(self.subcommand)
        written_by = runs.writing_run_config(self.config.get(subcommand, {}).get("ckpt_path"))
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


#: The last line of an fl_lightning error's traceback, as a launched process reports it to its parent.
_LAUNCHED_ERROR = re.compile(r"^fl_lightning\.errors\.(ConfigError|RunError): (.+)$", re.MULTILINE)


def launched_error(err: ProcessRaisedException) -> ConfigError | RunError | None:
    """The ``ConfigError``/``RunError`` a process of Lightning's spawn or fork launcher raised, else None.

    With ``trainer.strategy=ddp_spawn`` or ``ddp_fork`` the parent gets the child's traceback as text.
    """
    found = _LAUNCHED_ERROR.findall(str(err))
    if not found:
        return None
    kind, message = found[-1]
    return (ConfigError if kind == "ConfigError" else RunError)(message)


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
        try:
            with console(verbose):
                FederatedCLI(args=args)
        except ProcessRaisedException as err:  # a launched process's own error line, not its traceback
            error = launched_error(err)
            if error is None:
                raise
            raise error from None
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
