"""The parser of a run's configuration: no abbreviated options, one ``error:`` line per bad input."""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import re
import sys
from typing import Any, NoReturn

import yaml
from lightning.pytorch.cli import LightningArgumentParser

from fl_lightning.config.errors import config_keys, parse_error, rewrite_float_arg
from fl_lightning.config.legacy import upgrade_args, upgrade_config
from fl_lightning.data.datasets import list_datasets
from fl_lightning.data.partition import PARTITIONERS
from fl_lightning.data.transforms import TRANSFORMS
from fl_lightning.models import MODELS
from fl_lightning.strategies import list_strategies

#: PyYAML's safe loader, in C where PyYAML was built with libyaml (the same values, several times faster).
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

#: Known class names by the last part of the field that takes them, for "did you mean" on a mistyped name.
REGISTRIES = {
    "strategy": list_strategies,
    "partition": lambda: [c.__name__ for c in PARTITIONERS.values()],
    "dataset": list_datasets,
    "client_transform": lambda: [c.__name__ for c in TRANSFORMS.values()],
    "net": lambda: sorted({c.__name__ for c in MODELS.values()}, key=str.lower),
}


class _NonFiniteFloatError(Exception):
    """A float field got ``nan``/``inf`` (text to YAML): the parser parses ``new_args`` (``.nan``) instead."""

    def __init__(self, args: list[str]) -> None:
        super().__init__("retry")
        self.new_args = args


class FederatedArgumentParser(LightningArgumentParser):
    """The parser of ``fit``'s configuration: no abbreviated options, parse errors are one ``error:`` line.

    argparse (and jsonargparse 4) expand a prefix of an option (``--model.lr`` to ``--model.lr_decay``);
    ``allow_abbrev=False`` turns that off here and, through the parser class, in every subcommand's and
    every nested class's parser. An unknown option, class name or value gets "did you mean ...?" where a
    known one is close; a float field given ``nan``/``inf`` (text to YAML) is parsed again as
    ``.nan``/``.inf`` so that the field's own check says what it accepts. The former spellings of
    ``data.dataset`` and its options (``--data.dataset=shakespeare --data.shakespeare.max_windows=500``, in a
    command line, a config file or a run's ``config.yaml``) are read as the dataset classes
    (:mod:`fl_lightning.config.legacy`).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_args(self, args: Any = None, *more: Any, **kwargs: Any) -> Any:
        argv = upgrade_args(list(sys.argv[1:] if args is None else args))
        for _ in range(len(argv) + 1):
            self._fl_args = argv
            try:
                return super().parse_args(argv, *more, **kwargs)
            except _NonFiniteFloatError as retry:
                argv = retry.new_args
        return super().parse_args(argv, *more, **kwargs)

    def parse_object(self, cfg_obj: Any, *more: Any, **kwargs: Any) -> Any:
        return super().parse_object(upgrade_config(cfg_obj), *more, **kwargs)

    def _load_config_parser_mode(self, content: str, *more: Any, **kwargs: Any) -> Any:
        """A config file's content with the former dataset spellings upgraded, then jsonargparse's reading."""
        return super()._load_config_parser_mode(upgraded_content(content), *more, **kwargs)

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error:  # jsonargparse is trying alternatives: let it catch the error
            super().error(message, ex)
        if "Problems parsing config" in message:
            text = yaml_error(getattr(self, "_fl_args", [])) or " ".join(message.split())
        else:
            text, retry = parse_error(message, REGISTRIES, self._option_keys, self._help_hint())
            if retry is not None:
                new_args = rewrite_float_arg(getattr(self, "_fl_args", []), *retry)
                if new_args is not None:
                    raise _NonFiniteFloatError(new_args)
        sys.stderr.write(f"error: {text}\n")
        self.exit(2)

    def _create_group_if_requested(
        self, obj: Any, nested_key: Any, as_group: Any, doc_group: Any, *args: Any, **kwargs: Any
    ) -> Any:
        """A class's options under its docstring's whole first sentence (jsonargparse titles the group with
        the docstring's first line: "FedBuff, ..., "Federated Learning with Buffered")."""
        doc = inspect.getdoc(obj) if inspect.isclass(obj) and isinstance(doc_group, str) else None
        if doc:
            doc_group = first_sentence(" ".join(doc.split("\n\n", 1)[0].split()))
        return super()._create_group_if_requested(obj, nested_key, as_group, doc_group, *args, **kwargs)

    def _help_hint(self) -> str:
        command = getattr(self, "subcommand", None) or "fit"
        return f"`python -m fl_lightning {command} --help` lists the options"

    def _option_keys(self) -> list[str]:
        """Every dotted option: the parser's own and those of the default classes (``model.client.lr``)."""
        keys = [s[2:] for s in self._option_string_actions if s.startswith("--") and not s.endswith(".help")]
        with contextlib.suppress(Exception):  # an error inside an error message: the parser's own suffice
            keys += config_keys(self.get_defaults().as_dict())
        return keys


@functools.lru_cache(maxsize=256)
def upgraded_content(content: str) -> str:
    """A config file's text with the former dataset spellings upgraded (:func:`upgrade_config`); the text
    itself when nothing changes or it is not YAML (jsonargparse reports that in one line: yaml_error).

    Kept by text (a sweep reads the same few files for every row; an edited file is new text): the
    answer is a function of the text alone. Read with libyaml where PyYAML has it (as jsonargparse reads).
    """
    try:
        loaded = yaml.load(content, Loader=SAFE_LOADER)
    except yaml.YAMLError:
        return content
    upgraded = upgrade_config(loaded)
    if upgraded is not loaded and upgraded != loaded:
        return yaml.safe_dump(upgraded, sort_keys=False)
    return content


#: Words whose full stop ends no sentence (``e.g.``, ``et al.``, ``Alg. 1``, ``Sec. 3``, ...).
ABBREVIATIONS = frozenset({"e.g", "i.e", "al", "alg", "sec", "eq", "eqs", "fig", "tab", "vs", "cf", "etc"})


def first_sentence(text: str) -> str:
    """``text`` up to its first full stop that ends a sentence (not one of an abbreviation, an initial or
    a number)."""
    for match in re.finditer(r"\.(\s|$)", text):
        word = re.split(r"[\s(]", text[: match.start()])[-1]
        if len(word) > 1 and word.lower() not in ABBREVIATIONS:
            return text[: match.start() + 1]
    return text


def yaml_error(args: list[Any]) -> str | None:
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
