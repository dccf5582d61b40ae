"""Former spellings, read as the current ones: ``data.dataset`` from before datasets were classes, the
round policy's fields from before the policy was its own object, and the runtime's from before the runtime
was its own object.

Configs, recipes, command lines and the ``config.yaml`` of earlier runs name a dataset by its registry
name and give its options in a field of the data module named after it; both keep working:

* ``data.dataset: shakespeare`` (any :attr:`~fl_lightning.data.datasets.DatasetSource.registry_name`) is
  the class it names, ``{class_path: fl_lightning.data.shakespeare.Shakespeare}``; ``synthetic:<like>`` is
  ``Synthetic`` with ``like: <like>``;
  (its ``init_args`` in full, defaults included, as a new run's ``config.yaml`` writes them, so a sweep
  finds the runs it did before);
* the options field (``data.shakespeare``, ``data.leaf``, ``data.fedprox_synthetic``, ``data.synthetic``:
  each class's :attr:`~fl_lightning.data.datasets.DatasetSource.former_options`) is that class's
  ``init_args``, applied when the dataset is that class and ignored otherwise, as before; an unset one
  (``null`` in a ``config.yaml``) is dropped.

:func:`upgrade_config` rewrites a config mapping (a ``--config`` file, ``parse_object``'s dict) and
:func:`upgrade_args` a command line (``--data.dataset=shakespeare --data.shakespeare.max_windows=500`` is
``--data.dataset=Shakespeare --data.dataset.max_windows=500``); the parser
(:class:`~fl_lightning.config.parser.FederatedArgumentParser`) applies both before jsonargparse reads them,
so ``--print_config`` and a new run's ``config.yaml`` show the class form.

The round policy (``model.round_policy``, :class:`~fl_lightning.engine.system.policy.RoundPolicy`) was
given inside the system model; those spellings keep working too:

* ``--model.system.init_args.<field>=<v>`` and ``--model.system.<field>=<v>`` (``<field>`` one of
  ``deadline_s``, ``policy``, ``over_selection``, ``target_accuracy``, ``max_sim_time_s``) are
  ``--model.round_policy.<field>=<v>``; a JSON ``--model.system={"class_path": ..., "init_args": {...}}``
  or ``--model.system.init_args={...}`` gives its policy fields to ``model.round_policy`` the same way;
* ``model: {system: {class_path: ..., init_args: {deadline_s: 30, ...}}}`` in a config file or a run's
  ``config.yaml`` is ``model: {system: {class_path: ..., init_args: {...}}, round_policy: {deadline_s: 30}}``
  (:func:`~fl_lightning.engine.system.policy.upgrade_model`, which ``FederatedModule.load_from_checkpoint``
  applies to a checkpoint's saved arguments too).

The runtime (``model.runtime``, :class:`~fl_lightning.engine.runtime.Runtime`: ``state_memory_mb``,
``state_dir``, ``threads_per_process``, ``compile``, ``vectorize``, ``vectorize_memory_gb``,
``vectorize_cpu``) was given as arguments of the module itself; those spellings keep working too:

* ``--model.<field>=<v>`` and ``--model.<field> <v>`` are ``--model.runtime.<field>=<v>``
  (:func:`upgrade_runtime_args`);
* ``model: {vectorize: auto, threads_per_process: 1}`` in a config file, a run's ``config.yaml`` or a
  checkpoint's saved arguments is ``model: {runtime: {vectorize: auto, threads_per_process: 1}}``
  (:func:`~fl_lightning.engine.runtime.upgrade_model`; both sections' upgrades are
  :func:`~fl_lightning.engine.config.upgrade_model_section`).

The command line's three rewrites walk it with one iterator (:func:`options`, :func:`rewrite_options`).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import yaml

from fl_lightning.data.datasets import DATASETS, SYNTHETIC, DatasetSource, is_synthetic
from fl_lightning.engine.config import upgrade_model_section
from fl_lightning.engine.runtime import FIELDS as RUNTIME_FIELDS
from fl_lightning.engine.runtime import Runtime
from fl_lightning.engine.system.policy import FIELDS as POLICY_FIELDS
from fl_lightning.engine.system.policy import RoundPolicy, upgrade_model

__all__ = [
    "Option",
    "former_fields",
    "options",
    "policy_defaults",
    "rewrite_options",
    "runtime_defaults",
    "upgrade_args",
    "upgrade_config",
    "upgrade_data",
    "upgrade_dataset_args",
    "upgrade_policy_args",
    "upgrade_runtime_args",
]

#: The subcommands whose section of a root-level config file may hold a ``data`` section.
_SUBCOMMANDS = ("fit", "validate", "test", "predict")


def former_fields() -> dict[str, type[DatasetSource]]:
    """The former options fields of the data module (``shakespeare``, ...) and the class each belongs to."""
    return {cls.former_options[0]: cls for cls in DATASETS.values() if cls.former_options is not None}


def _class_path(cls: type[DatasetSource]) -> str:
    """``fl_lightning.data.<Class>`` where the package exports it (as ``--print_config`` writes it)."""
    import fl_lightning.data

    exported = getattr(fl_lightning.data, cls.__name__, None) is cls
    return f"fl_lightning.data.{cls.__name__}" if exported else f"{cls.__module__}.{cls.__qualname__}"


def _named(name: str) -> tuple[type[DatasetSource], dict[str, Any]] | None:
    """The class a former name (``shakespeare``, ``synthetic:cifar100``) stands for, with its implied
    arguments; None for anything else (a class name, an unknown name: left to the parser and the module)."""
    if is_synthetic(name):
        like = name.split(":", 1)[1] if ":" in name else None
        return DATASETS[SYNTHETIC], ({} if like is None else {"like": like})
    cls = DATASETS.get(name)
    return None if cls is None else (cls, {})


def _defaults(cls: type[DatasetSource]) -> dict[str, Any]:
    """The class's constructor defaults: the ``init_args`` a new run's ``config.yaml`` writes out in full."""
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}


def _class_of(spec: dict[str, Any]) -> type[DatasetSource] | None:
    short = str(spec.get("class_path", "")).rsplit(".", 1)[-1]
    return next((c for c in DATASETS.values() if c.__name__ == short), None)


def upgrade_data(data: dict[str, Any]) -> dict[str, Any]:
    """A config's ``data`` section with the former spellings as the class form (see the module)."""
    fields = former_fields()
    if not any(f in data for f in fields) and not (isinstance(data.get("dataset"), str)):
        return data
    data = dict(data)
    former = {f: data.pop(f) for f in list(fields) if f in data}
    spec = data.get("dataset")
    if isinstance(spec, str):
        named = _named(spec)
        if named is not None:
            cls, init_args = named
            options = former.get(cls.former_options[0]) if cls.former_options else None
            init_args = {**_defaults(cls), **init_args, **(options if isinstance(options, dict) else {})}
            data["dataset"] = {
                "class_path": _class_path(cls),
                **({"init_args": init_args} if init_args else {}),
            }
    elif isinstance(spec, dict):
        cls = _class_of(spec)
        options = former.get(cls.former_options[0]) if cls is not None and cls.former_options else None
        if isinstance(options, dict) and options:
            data["dataset"] = {**spec, "init_args": {**(spec.get("init_args") or {}), **options}}
    else:  # the dataset is chosen elsewhere (an earlier file): the options apply to it
        given = [v for v in former.values() if isinstance(v, dict) and v]
        if len(given) == 1:
            data["dataset"] = {"init_args": dict(given[0])}
    return data


def upgrade_config(config: Any) -> Any:
    """A config mapping (a ``--config`` file's content) with its ``data`` and ``model`` sections upgraded."""
    if not isinstance(config, dict):
        return config
    out = _upgrade_sections(config)
    for sub in _SUBCOMMANDS:
        if isinstance(out.get(sub), dict):
            out[sub] = _upgrade_sections(out[sub])
    return out


def _upgrade_sections(config: dict[str, Any]) -> dict[str, Any]:
    out = dict(config)
    if isinstance(out.get("data"), dict):
        out["data"] = upgrade_data(out["data"])
    if isinstance(out.get("model"), dict):
        out["model"] = upgrade_model_section(out["model"])
    return out


def _split_option(args: list[str], i: int) -> tuple[str, str | None, int]:
    """``(key, value, tokens used)`` of the option at ``args[i]`` (``--k=v`` or ``--k v``)."""
    token = args[i]
    if "=" in token:
        key, value = token[2:].split("=", 1)
        return key, value, 1
    if i + 1 < len(args) and not args[i + 1].startswith("--"):
        return token[2:], args[i + 1], 2
    return token[2:], None, 1


@dataclass(frozen=True)
class Option:
    """One item of a command line: an option split into its name and value, or any other token.

    Attributes:
        tokens: The item as given (``["--k=v"]``, ``["--k", "v"]``, or one other token).
        key: The option's name without its dashes (``model.vectorize``); None for a token that is not one of
            the options asked for.
        value: Its value (None: given without one).
    """

    tokens: tuple[str, ...]
    key: str | None = None
    value: str | None = None

    def spelled(self, key: str) -> str:
        """This option's value given to ``key`` instead: ``--<key>=<value>`` (``--<key>`` without a value)."""
        return f"--{key}" + ("" if self.value is None else f"={self.value}")


def options(args: list[str], prefixes: tuple[str, ...]) -> Iterator[Option]:
    """``args`` item by item: an option whose token starts with one of ``prefixes`` (``--model.system``)
    split into name and value (``--k=v``, or ``--k v`` where the next token is not an option), every other
    token as it is."""
    i = 0
    while i < len(args):
        token = str(args[i])
        if not token.startswith(prefixes):
            yield Option((token,))
            i += 1
            continue
        key, value, used = _split_option(args, i)
        yield Option(tuple(str(a) for a in args[i : i + used]), key, value)
        i += used


def rewrite_options(
    args: list[str], prefixes: tuple[str, ...], rewrite: Callable[[Option], list[str] | None]
) -> list[str]:
    """``args`` with each option under ``prefixes`` (:func:`options`) replaced by the tokens ``rewrite``
    makes of it, in place (None: kept as given); a command line without such options as it is."""
    if not any(str(a).startswith(prefixes) for a in args):
        return list(args)
    out: list[str] = []
    for option in options(args, prefixes):
        new = None if option.key is None else rewrite(option)
        out += list(option.tokens) if new is None else new
    return out


def upgrade_args(args: list[str]) -> list[str]:
    """A command line with the former spellings read as the current ones (see the module): the dataset's
    (:func:`upgrade_dataset_args`), the round policy's (:func:`upgrade_policy_args`) and the runtime's
    (:func:`upgrade_runtime_args`)."""
    return upgrade_runtime_args(upgrade_policy_args(upgrade_dataset_args(args)))


def upgrade_runtime_args(args: list[str]) -> list[str]:
    """A command line with the runtime's fields given to the module itself as ``model.runtime``'s:
    ``--model.<field>=<v>`` (or ``--model.<field> <v>``) becomes ``--model.runtime.<field>=<v>`` in place."""

    def rewrite(option: Option) -> list[str] | None:
        name = str(option.key).removeprefix("model.")
        return [option.spelled(f"{Runtime.field}.{name}")] if name in RUNTIME_FIELDS else None

    return rewrite_options(args, tuple(f"--model.{f}" for f in RUNTIME_FIELDS), rewrite)


def _option_value(value: Any) -> str:
    """``value`` as a command line writes it (strings as they are, anything else as JSON)."""
    return value if isinstance(value, str) else json.dumps(value)


def upgrade_policy_args(args: list[str]) -> list[str]:
    """A command line with the round policy's fields given to the system model as ``model.round_policy``'s.

    ``--model.system[.init_args].<field>=<v>`` becomes ``--model.round_policy.<field>=<v>`` in place; a
    mapping given to ``--model.system`` or ``--model.system.init_args`` (JSON or YAML) loses its policy
    fields, which follow it as ``--model.round_policy.<field>=<v>``.
    """

    def rewrite(option: Option) -> list[str] | None:
        key, value = str(option.key), option.value
        name = key.removeprefix("model.system.").removeprefix("init_args.")
        if key.startswith("model.system.") and name in POLICY_FIELDS:
            return [option.spelled(f"{RoundPolicy.field}.{name}")]
        if key in ("model.system", "model.system.init_args") and value is not None and "{" in value:
            return _split_system_value(key, value)
        return None

    return rewrite_options(args, ("--model.system",), rewrite)


def _split_system_value(key: str, value: str) -> list[str] | None:
    """``--<key>=<mapping>`` without the policy's fields, then those as ``--model.round_policy.<field>``
    options; None when the value is not a mapping or holds none of them."""
    try:
        given = yaml.safe_load(value)
    except yaml.YAMLError:
        return None
    if not isinstance(given, dict):
        return None
    system = given if key == "model.system" else {"init_args": given}
    upgraded = upgrade_model({"system": system})
    if "round_policy" not in upgraded:
        return None
    rest = upgraded["system"] if key == "model.system" else upgraded["system"]["init_args"]
    policy = [f"--model.round_policy.{k}={_option_value(v)}" for k, v in upgraded["round_policy"].items()]
    return [f"--{key}={json.dumps(rest)}", *policy]


def upgrade_dataset_args(args: list[str]) -> list[str]:
    """A command line with the former spellings of ``data.dataset`` and its options as the class form.

    ``--data.dataset=<former name>`` becomes ``--data.dataset=<Class>`` (``synthetic:<like>`` also gives
    ``--data.dataset.like=<like>``); ``--data.<field>.<arg>=<v>`` becomes ``--data.dataset.<arg>=<v>``, moved
    after the last ``--data.dataset=`` so that it applies to the dataset chosen, and dropped when the command
    line chooses another dataset (those options were ignored then); ``--data.<field>=null`` is dropped.
    """
    fields = former_fields()
    if not any(str(a).startswith(("--data.dataset", *(f"--data.{f}" for f in fields))) for a in args):
        return list(args)
    out: list[str] = []
    moved: list[tuple[str, str, str | None]] = []  # (former field, argument or "", value)
    last_dataset: int | None = None  # index in ``out`` after the last dataset option
    chosen: type[DatasetSource] | None = None  # the class the command line chooses, if it does
    for option in options(args, ("--data.",)):
        key, value = option.key, option.value
        if key is None:
            out += option.tokens
            continue
        head, _, rest = key[len("data.") :].partition(".")
        if key == "data.dataset" and value is not None:
            named = _named(value)
            if named is not None:
                cls, implied = named
                out.append(f"--data.dataset={cls.__name__}")
                out += [f"--data.dataset.{k}={v}" for k, v in implied.items()]
                chosen = cls
            else:
                out += option.tokens
                short = value.rsplit(".", 1)[-1]
                chosen = next((c for c in DATASETS.values() if c.__name__ == short), chosen)
            last_dataset = len(out)
        elif head in fields and (rest or value is not None):
            moved.append((head, rest, value))
        else:
            out += option.tokens
    extra = []
    for field, arg, value in moved:
        if chosen is not None and chosen is not fields[field]:
            continue  # options of a dataset the command line does not choose: ignored, as before
        if arg:
            extra.append(f"--data.dataset.{arg}" + ("" if value is None else f"={value}"))
        elif value is not None and value.strip().lower() not in ("null", "none", "{}"):
            try:
                given = json.loads(value)
            except ValueError:
                given = None
            if isinstance(given, dict):
                extra.append("--data.dataset=" + json.dumps({"init_args": given}))
    at = len(out) if last_dataset is None else last_dataset
    return out[:at] + extra + out[at:]


def policy_defaults() -> dict[str, Any]:
    """``model.round_policy.<field>`` at its default, per field (a run without a policy has these)."""
    return {f"{RoundPolicy.field}.{k}": v for k, v in asdict(RoundPolicy()).items()}


def runtime_defaults() -> dict[str, Any]:
    """``model.runtime.<field>`` at its default, per field (a run that sets none of them has these)."""
    return {f"{Runtime.field}.{k}": v for k, v in asdict(Runtime()).items()}
