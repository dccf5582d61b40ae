"""What ``--help`` says: the commands, and every option of a subcommand in a few lines each.

The parser documents every field (``class_path``/``init_args``, docstrings); this module only shapes how
the help reads: usage as the command is typed (``python -m fl_lightning fit [options]``, not one line per
option), Lightning's Trainer flags in their first sentence (their docstrings' "Default: ..." name
Lightning's defaults, not a federated run's), the flags a federated round refuses left out (the epilog
names them and what to set instead), and no list of every known subclass (``--model.strategy.help NAME``
and ``python -m fl_lightning list`` show them). Nothing here changes what parses.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

from jsonargparse import DefaultHelpFormatter

from fl_lightning.config.parser import first_sentence
from fl_lightning.lightning.module import REFUSED_TRAINER_ARGS

PROG = "python -m fl_lightning"

#: The top-level help: every command, ``list`` and ``sweep`` (dispatched before this parser) included.
DESCRIPTION = (
    "Federated learning on PyTorch Lightning: a strategy, a model and a data split in a YAML config.\n\n"
    "commands (fit --help, fit --print_config: every field of a config):\n"
    "  fit       train; one training step is one federated round\n"
    "  validate  a checkpoint's global model on the validation split (--ckpt_path C.ckpt)\n"
    "  test      ... on the test set\n"
    "  predict   ... its predictions on the test set, in predictions.csv\n"
    "  list      python -m fl_lightning list [strategies|models|datasets|partitions|transforms|systems|\n"
    "            round_policy]\n"
    "  sweep     python -m fl_lightning sweep FILE.yaml: fit runs over seeds, one table\n\n"
    "`--verbose` (anywhere) shows every message Lightning prints and a line per round."
)

#: What each subcommand does (Lightning's describe its Trainer methods).
SUBCOMMANDS = {
    "fit": "Train: one training step is one federated round (trainer.max_steps rounds); --ckpt_path resumes.",
    "validate": "Evaluate a checkpoint's global model on the validation split (global/*; the test set when "
    "data.val_fraction is 0).",
    "test": "Evaluate a checkpoint's global model on the test set (test/*).",
    "predict": "Write a checkpoint's global-model predictions on the test set to predictions.csv.",
}

#: What a federated run makes of the Trainer flags whose defaults it sets, and of the subcommands' own.
FEDERATED_HELP = {
    "ckpt_path": "A checkpoint written by fit (e.g. lightning_logs/version_0-fedavg-dirichlet/checkpoints/"
    "last.ckpt): fit resumes it, validate/test/predict evaluate it with its run's config.yaml.",
    "weights_only": "Checkpoints are loaded with torch.load(weights_only=True) unless this is false (for "
    "checkpoints you trust only: it runs code from the file).",
    "trainer.max_steps": "Rounds to run (one training step is one federated round); a run resumed with "
    "--ckpt_path goes on up to it.",
    "trainer.val_check_interval": "Rounds between evaluations of the global model (global/*, what "
    "ModelCheckpoint and EarlyStopping monitor); 1: after every round.",
    "trainer.check_val_every_n_epoch": "Leave null: validation is counted in rounds (val_check_interval).",
    "trainer.log_every_n_steps": "Rounds between logged training scalars; 1: every round.",
    "trainer.num_sanity_val_steps": "Validation batches before round 1 (0: none).",
}

#: The flags a federated round refuses, left out of the help (see the epilog).
HIDDEN = {f"trainer.{name}" for name in REFUSED_TRAINER_ARGS}


def epilog() -> str:
    """The subcommands' epilog: the Trainer flags left out, and what to set instead."""
    refused = ", ".join(f"{name} (use {field})" for name, field in REFUSED_TRAINER_ARGS.items())
    return (
        f"Trainer flags a federated round cannot honour are refused and not listed: {refused}. "
        "`python -m fl_lightning list` lists the strategies, models, datasets, partitions, transforms and "
        "system models; "
        "`--model.strategy.help NAME` the options of one."
    )


@contextlib.contextmanager
def usage_of(subcommand: str | None) -> Iterator[None]:
    """``python -m fl_lightning <subcommand>`` as the program of every parser made meanwhile (argparse's
    default is ``sys.argv[0]``'s name, ``__main__.py``): jsonargparse makes one for a class's help,
    ``--model.strategy.help FedBuff``, without a ``prog``."""
    saved = sys.argv[0] if sys.argv else None
    if saved is None or subcommand is None:
        yield
        return
    sys.argv[0] = f"{PROG} {subcommand}"
    try:
        yield
    finally:
        sys.argv[0] = saved


class FederatedHelpFormatter(DefaultHelpFormatter):
    """jsonargparse's help, shortened (see the module docstring); ``add_argument``, ``_get_help_string`` and
    ``_fill_text`` are argparse's extension points for formatters (``ArgumentDefaultsHelpFormatter`` and
    ``RawDescriptionHelpFormatter`` override the latter two). Descriptions keep their line breaks."""

    def add_argument(self, action: argparse.Action) -> None:
        if action.dest in HIDDEN:
            return
        super().add_argument(action)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = super()._get_help_string(action)
        text = re.sub(r", known subclasses: [^)]*", "", text)
        own = action.help if isinstance(action.help, str) else ""
        lightnings = action.dest.startswith("trainer.") or action.dest in FEDERATED_HELP
        if lightnings and own and text.startswith(own):
            short = FEDERATED_HELP.get(action.dest) or first_sentence(own)
            text = short + text[len(own) :]
        return text

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        """Paragraphs wrapped, indented lines (a table of commands) kept as written."""
        return "\n".join(
            indent + line if line.startswith(" ") else textwrap.fill(line, width, initial_indent=indent)
            for line in text.splitlines()
        )


def describe_subcommands(parser: Any) -> None:
    """The top-level list of subcommands with :data:`SUBCOMMANDS`' lines (LightningCLI passes its Trainer
    methods' docstrings; argparse keeps a subcommand's line in a private pseudo-action, with no API to
    change it after ``add_subcommand``)."""
    action = getattr(parser, "_subcommands_action", None)
    for choice in getattr(action, "_choices_actions", []):
        choice.help = SUBCOMMANDS.get(choice.dest, choice.help)


def parser_kwargs(subcommands: Any) -> dict[str, Any]:
    """``LightningCLI``'s ``parser_kwargs``: the top-level parser's and each subcommand's."""
    kwargs: dict[str, Any] = {
        "prog": PROG,
        "description": DESCRIPTION,
        "formatter_class": FederatedHelpFormatter,
    }
    for name in subcommands:
        kwargs[name] = {
            "usage": f"{PROG} {name} [--config CONFIG] [options]",
            "description": SUBCOMMANDS.get(name),
            "epilog": epilog(),
            "formatter_class": FederatedHelpFormatter,
        }
    return kwargs
