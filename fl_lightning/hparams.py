"""The constructor arguments an object was built with, as a config that a checkpoint holds and rebuilds from.

A ``FederatedModule`` or ``FederatedDataModule`` takes objects (a client network, a strategy, a partition),
which a checkpoint cannot hold as objects: it is loaded with ``weights_only=True``, which unpickles no
classes. It holds them as their config instead, in the command line's form (``{"class_path": ...,
"init_args": {...}}``, plain values only):

- :func:`class_config` records an object built from Python: its class and each constructor argument the
  object keeps under the argument's own name (or in its ``hparams``); an argument it does not keep is left
  out, so it rebuilds with its default (``FederatedModule.load_from_checkpoint`` checks that the network
  rebuilt is the one saved, and says what to pass where it is not);
- :func:`instantiate` builds the constructor arguments back from such a config (classes of ``fl_lightning``
  or of modules already imported only: a checkpoint never imports code);
- :func:`saved_config` reads a checkpoint's config, or, for a checkpoint written before configs were
  saved, the ``config.yaml`` of the run folder it lies in;
- :func:`global_seed`: the seed of the last ``seed_everything``, which a module's ``seed=None`` follows.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import yaml

from fl_lightning.errors import ConfigError

#: Objects nested deeper than this inside a module's arguments are not recorded.
MAX_DEPTH = 4


def global_seed() -> int:
    """The seed of the last ``lightning.seed_everything(seed)`` of this process (``PL_GLOBAL_SEED``), else 0.

    ``FederatedModule(seed=None)`` and ``FederatedDataModule(seed=None)`` follow it, as the command line
    links ``model.seed`` and ``data.seed`` to ``seed_everything``: one seed for a run from Python too.
    """
    value = os.environ.get("PL_GLOBAL_SEED", "")
    return int(value) if value.strip().lstrip("-").isdigit() else 0


def is_plain(value: Any) -> bool:
    """Whether ``value`` is ``None``, a bool, int, float or str, or a list/tuple/dict of plain values."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(is_plain(v) for v in value)
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and is_plain(v) for k, v in value.items())
    return False


def as_plain(value: Any) -> Any:
    """A plain ``value`` with built-in types only (a ``str`` subclass becomes ``str``, tuples lists)."""
    if isinstance(value, (list, tuple)):
        return [as_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: as_plain(v) for k, v in value.items()}
    if isinstance(value, bool) or value is None:
        return value
    for kind in (str, int, float):
        if isinstance(value, kind):
            return kind(value)
    return value


def class_path(obj: Any) -> str:
    """``module.Class`` of ``obj`` (for a jsonargparse lazy default: of the class it stands for)."""
    cls = getattr(obj, "_lazy_class_type", None) or type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def class_config(obj: Any, depth: int = 0) -> Any:
    """``obj`` as a config: a plain value as it is, an object as ``{"class_path", "init_args"}``.

    The arguments are those of the class's ``__init__`` that the object keeps under the argument's name
    (as an attribute, not a property or method; or in its ``hparams``), recursively; None for an object
    that has no such arguments to read (it is left out of its parent's config).
    """
    if is_plain(obj):
        return as_plain(obj)
    if isinstance(obj, (list, tuple)):
        items = [class_config(v, depth + 1) for v in obj]
        return None if any(v is None for v in items) else items
    if (
        depth > MAX_DEPTH
        or isinstance(obj, torch.Tensor)
        or not hasattr(obj, "__dict__")
        or inspect.isroutine(obj)
        or inspect.isclass(obj)
    ):
        return None
    lazy = getattr(obj, "lazy_get_init_data", None)  # a jsonargparse lazy default: the config it was given
    if lazy is not None:
        data = lazy()
        init_args = getattr(data, "init_args", None)  # absent for a lazy default given no arguments
        given = {k: class_config(v, depth + 1) for k, v in vars(init_args or {}).items()} if init_args else {}
        return {"class_path": data.class_path, "init_args": given}
    cls = type(obj)
    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return None
    recorded = getattr(obj, "hparams", None)
    recorded = recorded if isinstance(recorded, Mapping) else {}
    init_args: dict[str, Any] = {}
    for name, param in params.items():
        if name == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        found, value = _kept(obj, name)
        if not found and name in recorded:
            found, value = True, recorded[name]
        if not found:
            continue
        config = class_config(value, depth + 1)
        if config is not None or value is None:
            init_args[name] = config
    return {"class_path": class_path(obj), "init_args": init_args}


def _kept(obj: Any, name: str) -> tuple[bool, Any]:
    """Whether ``obj`` keeps an argument ``name`` as a plain attribute, and its value."""
    if isinstance(inspect.getattr_static(type(obj), name, None), property):
        return False, None  # computed, not a stored argument (and may need a trainer)
    try:
        value = inspect.getattr_static(obj, name)
    except AttributeError:
        return False, None
    if inspect.isroutine(value) or isinstance(value, (staticmethod, classmethod)):
        return False, None
    return True, getattr(obj, name)


def instantiate(config: Any, field: str) -> Any:
    """A config of :func:`class_config` (or the command line's) built: ``{"class_path", "init_args"}``
    dicts become objects, recursively; other values are returned as they are.

    Raises:
        ConfigError: a class that is not ``fl_lightning``'s and whose module is not imported (a checkpoint
            never imports code), or one whose constructor refuses the arguments.
    """
    if isinstance(config, list):
        return [instantiate(v, f"{field}[{i}]") for i, v in enumerate(config)]
    if not (isinstance(config, Mapping) and "class_path" in config):
        return config
    path = str(config["class_path"])
    module_name, _, name = path.rpartition(".")
    if module_name not in sys.modules and not module_name.startswith("fl_lightning"):
        raise ConfigError(
            f"{field}: the checkpoint names the class {path}, whose module is not imported; import "
            f"{module_name or path} first (a checkpoint never imports code)"
        )
    try:
        cls: Any = importlib.import_module(module_name)
        for part in name.split("."):
            cls = getattr(cls, part)
    except (ImportError, AttributeError):
        raise ConfigError(
            f"{field}: the checkpoint names the class {path}, which does not exist here"
        ) from None
    args = {**(config.get("init_args") or {}), **(config.get("dict_kwargs") or {})}
    kwargs = {k: instantiate(v, f"{field}.{k}") for k, v in args.items()}
    try:
        return cls(**kwargs)
    except TypeError as err:
        raise ConfigError(
            f"{field}: {path} cannot be built from the checkpoint's arguments ({err})"
        ) from None


def saved_config(checkpoint: Mapping[str, Any], path: str | os.PathLike, key: str, section: str) -> dict:
    """The constructor config a checkpoint saved under ``key``; for a checkpoint without one (written before
    configs were saved), the ``section`` (``model``/``data``) of its run folder's ``config.yaml``.

    Raises:
        ConfigError: neither is there.
    """
    saved = checkpoint.get(key)
    if saved:
        return {k: v for k, v in saved.items() if not k.startswith("_")}
    ckpt = Path(path)
    run_config = ckpt.parent.parent / "config.yaml"
    if ckpt.parent.name != "checkpoints" or not run_config.is_file():
        raise ConfigError(
            f"ckpt_path: {ckpt} holds no {section} arguments and has no config.yaml beside its checkpoints/ "
            "folder; build the module as for the run and pass ckpt_path to the Trainer instead"
        )
    config = yaml.safe_load(run_config.read_text()) or {}
    values = dict(config.get(section) or {})
    seed = config.get("seed_everything")
    if type(seed) is int and (section == "model" or values.get("seed") is None):
        values["seed"] = seed  # model.seed is linked to seed_everything; a null data.seed follows it
    return values


def record_hyperparameters(obj: Any, arguments: Mapping[str, Any]) -> None:
    """Save ``obj``'s constructor config as its Lightning ``hparams`` (into every checkpoint; not logged).

    Built by the command line, the config is the command line's own (Lightning hands it to the class being
    built); from Python, :func:`class_config` of each of ``arguments`` (the constructor's arguments, with
    defaults replaced by the objects the constructor made of them).
    """
    from lightning.pytorch.core.mixins.hparams_mixin import _given_hyperparameters  # no public API (<2.7)

    given = _given_hyperparameters.get()
    params = inspect.signature(type(obj).__init__).parameters
    if given is not None and {k for k in given if not k.startswith("_")} <= set(params):
        config = {k: as_plain(v) for k, v in given.items() if not k.startswith("_") and is_plain(v)}
    else:
        config = {}
        for name, value in arguments.items():
            value_config = class_config(value)
            if value_config is not None or value is None:
                config[name] = value_config
    obj.save_hyperparameters(config, logger=False)


def rebuild(
    cls: type,
    checkpoint: Mapping[str, Any],
    path: str | os.PathLike,
    key: str,
    section: str,
    overrides: Mapping[str, Any],
    upgrade: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None,
) -> Any:
    """``cls`` built with the constructor config that ``checkpoint`` (read from ``path``) saved under
    ``key`` (:func:`saved_config`; ``section`` names its fields), ``overrides`` replacing arguments;
    ``upgrade`` rewrites the saved config first (arguments spelled as an earlier version saved them).

    Raises:
        ConfigError: see :func:`saved_config` and :func:`instantiate`.
    """
    params = inspect.signature(cls.__init__).parameters
    config = saved_config(checkpoint, path, key, section)
    if upgrade is not None:
        config = dict(upgrade(config))
    args = {
        name: instantiate(value, f"{section}.{name}")
        for name, value in config.items()
        if name in params and name not in overrides
    }
    return cls(**args, **overrides)


def read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """A checkpoint file's content (tensors on the CPU, loaded with ``weights_only=True``).

    Raises:
        ConfigError: one ``ckpt_path:`` line for a file that is missing or not a checkpoint.
    """
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"ckpt_path: {file} is not a file; give a .ckpt file written by `fit`")
    try:
        checkpoint = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # torch's own message advises weights_only=False: not passed on
        raise ConfigError(
            f"ckpt_path: {file} is not a checkpoint fl_lightning reads ({type(err).__name__}); give a .ckpt "
            "file written by `fit`"
        ) from None
    if not isinstance(checkpoint, dict):
        raise ConfigError(
            f"ckpt_path: {file} is not a Lightning checkpoint; give a .ckpt file written by `fit`"
        )
    return checkpoint


def move_flat_fields(
    hparams: Mapping[str, Any], head: str, fields: tuple[str, ...], to: str
) -> dict[str, Any]:
    """Flat hyperparameters (a checkpoint's) with ``<head>.<f>`` renamed ``<to>.<f>`` for each ``f`` in
    ``fields`` (a spelling from before those fields were one object); a key already spelled ``<to>.<f>`` wins.
    """
    out: dict[str, Any] = {}
    for key, value in hparams.items():
        prefix, _, name = key.rpartition(".")
        if prefix == head and name in fields:
            out.setdefault(f"{to}.{name}", value)
        else:
            out[key] = value
    return out
