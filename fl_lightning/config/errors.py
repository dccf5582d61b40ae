"""One-line messages for bad config input: jsonargparse's parse errors, Lightning's Trainer errors.

Each message names the field as it is spelled in a YAML config (``model.client.lr``, ``trainer.max_steps``)
and says what to do; where a given name or option is close to a known one, it asks "did you mean ...?"
(:mod:`difflib`), but never substitutes it: the CLI does not guess.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import math
import re
from collections.abc import Callable, Iterable
from typing import Any

#: Values of a float field that YAML reads as text (``nan``), retried as YAML floats (``.nan``).
NON_FINITE = re.compile(r"[-+]?(?:nan|inf|infinity)", re.IGNORECASE)

_KEY = re.compile(r'Parser key "([^"]+)":\s*')
_CLASS = re.compile(r"Problem with given class_path '([^']+)':\s*(?:(\w+): (?!Expected))?")
_UNION = re.compile(r"Does not validate against any of the Union subtypes Subtypes: \[(.*?)\] Errors: - ")
_TAIL = re.compile(r"(?: - Expected a <class 'NoneType'>)?(?: Given value type: .*)?$")
_NOT_A_PATH = re.compile(r"- Expected a path but (\S+) either not accessible or invalid")
_NO_ATTRIBUTE = re.compile(r"module '([\w.]+)' has no attribute '(\w+)'")
_OPTION = re.compile(r"Option '(\w+)' is not accepted")
_FLOAT = re.compile(r"Expected a <class 'float'>")
_VALUE = re.compile(r"(?:Got value|Given value): (\S+)")


def did_you_mean(names: list[str]) -> str:
    """``"did you mean A?"``, ``"did you mean A or B?"``, ``"did you mean A, B or C?"``."""
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
    return f"did you mean {listed}?"


def close_names(given: str, names: Iterable[str], n: int = 3) -> list[str]:
    """Names close to ``given``: those equal to it ignoring case, else :mod:`difflib`'s matches."""
    names = list(dict.fromkeys(names))
    same = [name for name in names if name.lower() == given.lower()]
    if same:
        return same[:n]
    lowered = {name.lower(): name for name in names}
    return [lowered[m] for m in difflib.get_close_matches(given.lower(), list(lowered), n=n, cutoff=0.6)]


def close_options(given: str, options: Iterable[str], n: int = 3) -> list[str]:
    """Dotted options close to ``given`` (``model.lr`` -> ``model.lr_decay``, ``model.client.lr``).

    A candidate is close when, under the same parent, its last name starts with the given one or is
    near it (:mod:`difflib`), when it has the same last name deeper in the same section, or when the
    whole option is near the given one (a typo in a parent: ``model.clinet.lr``).
    """
    parent, _, leaf = given.rpartition(".")
    scored: list[tuple[float, str]] = []
    for option in dict.fromkeys(options):
        if option == given:
            continue
        oparent, _, oleaf = option.rpartition(".")
        if oparent == parent and oleaf.startswith(leaf):
            score = 3.0
        elif oleaf == leaf and option.split(".")[0] == given.split(".")[0]:
            score = 2.5
        elif oparent == parent and difflib.SequenceMatcher(None, leaf, oleaf).ratio() >= 0.7:
            score = 2.0 + difflib.SequenceMatcher(None, leaf, oleaf).ratio() / 10
        elif difflib.SequenceMatcher(None, given, option).ratio() >= 0.85:
            score = 1.0
        else:
            continue
        scored.append((-score, option))
    scored.sort()
    best = -scored[0][0] if scored else 0.0
    # a prefix or the same name elsewhere is a clear match: leave mere look-alikes out then
    return [option for score, option in scored if best < 2.5 or -score >= 2.5][:n]


def config_keys(config: dict[str, Any], prefix: str = "") -> list[str]:
    """Every dotted key of a (defaults) config dict, ``class_path``/``init_args`` levels left out."""
    keys = []
    for key, value in config.items():
        if key in ("class_path", "__path__"):
            continue
        name = prefix if key == "init_args" else f"{prefix}.{key}" if prefix else key
        if key != "init_args":
            keys.append(name)
        if isinstance(value, dict):
            keys += config_keys(value, name)
    return keys


def class_options(class_path: str) -> list[str]:
    """The constructor arguments of ``class_path`` and of its bases (those ``**kwargs`` pass on)."""
    try:
        cls = import_path(class_path)
    except (ImportError, AttributeError, ValueError):
        return []
    names: list[str] = []
    for klass in getattr(cls, "__mro__", [cls]):
        try:
            params = inspect.signature(klass.__init__ if inspect.isclass(klass) else klass).parameters
        except (TypeError, ValueError):
            continue
        names += [
            p.name
            for p in params.values()
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
            break
    return list(dict.fromkeys(names))


def import_path(path: str) -> Any:
    """The object ``a.b.C`` names (a module attribute)."""
    module, _, name = path.rpartition(".")
    if not module:
        raise ValueError(f"{path!r} is not a dotted path")
    return getattr(importlib.import_module(module), name)


def parse_error(
    message: str,
    registries: dict[str, Callable[[], list[str]]],
    options: Callable[[], list[str]],
    help_hint: str,
) -> tuple[str, tuple[str, str] | None]:
    """Rewrite one of jsonargparse's (nested, multi-line) parse errors as one line.

    Args:
        message: jsonargparse's message.
        registries: Known names by the last part of a field (``strategy`` -> the strategy names), for
            "did you mean" on a mistyped bare class name.
        options: The parser's dotted options (called only for an unknown option).
        help_hint: Appended where no close option is found, e.g. "`python -m fl_lightning fit --help`
            lists them".

    Returns:
        ``(line, retry)``: ``retry`` is ``(field, value)`` when a float field got a non-finite value that
        YAML read as text (``nan``), so that the caller can parse it again as ``.nan``.
    """
    text = " ".join(message.split())
    if text.startswith("unrecognized arguments: "):
        return _unknown_arguments(text.split(": ", 1)[1].split(" "), options, help_hint), None
    path: list[str] = []
    class_path = None
    union = re.search(r"Subtypes: \[(.*?)\] Errors:", text)
    subtypes = union.group(1) if union else ""
    while True:
        if match := _KEY.match(text):
            path.append(match.group(1))
        elif match := _CLASS.match(text):
            class_path = match.group(1)
            path += [match.group(2)] if match.group(2) else []
        elif match := _UNION.match(text):
            pass
        else:
            break
        text = text[match.end() :]
    if not path:
        return text, None
    field = ".".join(path)
    detail = _TAIL.sub("", text)
    classes = [c for c in re.findall(r"<class '([\w.]+)'>", subtypes) if "." in c]
    if class_path is None and len(classes) == 1:  # a dict for an optional class (model.attack)
        class_path = classes[0]
    if match := _OPTION.search(detail):
        option = f"{field}.{match.group(1)}"
        what = f"{field}.{match.group(1)} is not an option" + (
            f" of {class_path.rpartition('.')[2]}" if class_path else ""
        )
        known = [f"{field}.{name}" for name in class_options(class_path)] if class_path else []
        near = close_options(option, known)
        return f"{what}; {did_you_mean(near) if near else help_hint}", None
    if match := _NOT_A_PATH.search(text):
        return _unknown_class(field, match.group(1), text, subtypes, registries), None
    if _FLOAT.search(text) and (value := _VALUE.search(text)) and NON_FINITE.fullmatch(value.group(1)):
        return f"{field}={value.group(1)} must be a finite number", (field, value.group(1))
    return f"{field}: {detail}", None


def _unknown_arguments(args: list[str], options: Callable[[], list[str]], help_hint: str) -> str:
    """``--model.lr is not an option; did you mean --model.lr_decay or --model.client.lr?``."""
    unknown = [a.split("=", 1)[0] for a in args if a.startswith("--")]
    if not unknown:
        return f"unrecognized arguments: {' '.join(args)}; {help_hint}"
    known = options()
    parts = []
    for arg in dict.fromkeys(unknown):
        near = close_options(arg[2:], known)
        parts.append(
            f"{arg} is not an option" + (f"; {did_you_mean(['--' + n for n in near])}" if near else "")
        )
    if not any("did you mean" in p for p in parts):
        parts[-1] += f"; {help_hint}"
    return "; ".join(parts)


def _unknown_class(
    field: str, given: str, text: str, subtypes: str, registries: dict[str, Callable[[], list[str]]]
) -> str:
    """A class name or path that does not resolve: ``did you mean`` a known one."""
    if match := _NO_ATTRIBUTE.search(text):
        module, name = match.groups()
        try:
            found = importlib.import_module(module)
            public = [n for n in dir(found) if not n.startswith("_") and inspect.isclass(getattr(found, n))]
        except ImportError:
            public = []
        near = [f"{module}.{n}" for n in close_names(name, public)]
        fix = did_you_mean(near) if near else f"module {module} has no {name}"
        return f"{field}: {given} is not a class; {fix}"
    registry = registries.get(field.rpartition(".")[2])
    names = registry() if registry else _subclass_names(subtypes)
    kind = _KINDS.get(field.rpartition(".")[2], "class")
    leaf = given.rpartition(".")[2]
    near = close_names(leaf, names) if names else []
    own = f"a {kind} of your own is named by its class path: --{field}=my_package.my_module.{leaf}"
    if registry and given in names:  # ours, and another library's class has the same name (torchvision's MLP)
        package = {"model": "fl_lightning.models", "strategy": "fl_lightning.strategies"}.get(
            kind, "fl_lightning"
        )
        path = f"{package}.{given}"
        return (
            f"{field}: {given!r} names more than one class of the libraries loaded; give its class path, "
            f"--{field}={path}"
        )
    if near:
        same = near[0].lower() == given.lower()  # a known name in another case: not a class of one's own
        return f"{field}: {given!r} is not a known {kind}; {did_you_mean(near)}" + (
            "" if same else f" ({own})"
        )
    if registry:
        listed = ", ".join(names)
        return f"{field}: {given!r} is not a known {kind}; choose one of {listed}; {own}"
    return (
        f"{field}: {given!r} is not a class that can be imported; give its full path (package.module.Class)"
    )


#: What a field's class is called in messages, by the field's last part.
_KINDS = {
    "strategy": "strategy",
    "partition": "partition",
    "client_transform": "client transform",
    "net": "model",
}


def _subclass_names(subtypes: str) -> list[str]:
    """Names of the imported subclasses of the classes in a Union's ``Subtypes: [...]`` text."""
    names: list[str] = []
    for path in re.findall(r"<class '([\w.]+)'>|\[([\w.]+)\]", subtypes):
        cls = None
        try:
            cls = import_path(path[0] or path[1])
        except (ImportError, AttributeError, ValueError):
            continue
        if not inspect.isclass(cls) or cls is type(None):
            continue
        todo = [cls]
        while todo:
            klass = todo.pop()
            for sub in klass.__subclasses__():
                if not sub.__name__.startswith("_"):
                    names.append(sub.__name__)
                todo.append(sub)
    return names


def yaml_float(value: str) -> str:
    """YAML's spelling of a non-finite float: ``nan`` -> ``.nan``, ``-inf`` -> ``-.inf``."""
    sign = value[0] if value[0] in "+-" else ""
    return f"{sign}.{'nan' if 'nan' in value.lower() else 'inf'}"


def rewrite_float_arg(args: list[str], field: str, value: str) -> list[str] | None:
    """``args`` with ``--<field>=<value>`` (or ``--<field> <value>``) spelled as a YAML float; None if absent.

    ``field`` is spelled without ``init_args`` (``model.client.lr``); the argument may have them.
    """
    for i, arg in enumerate(args):
        key, sep, given = str(arg).partition("=")
        if not key.startswith("--") or key[2:].replace(".init_args", "") != field:
            continue
        if sep and given == value:
            return [*args[:i], f"{key}={yaml_float(value)}", *args[i + 1 :]]
        if not sep and i + 1 < len(args) and args[i + 1] == value:
            return [*args[: i + 1], yaml_float(value), *args[i + 2 :]]
    return None


# ------------------------------------------------------------------------------------------ Trainer
def trainer_error(err: BaseException, config: dict[str, Any], defaults: dict[str, Any]) -> str:
    """One line for an error Lightning raised about the Trainer's flags (``MisconfigurationException``, ...).

    The flag is the Trainer argument the message names (``max_steps``, ``limit_val_batches``), else the
    one set away from its default whose value the message quotes (``accelerator='gpu'``: "No supported
    gpu backend found!"), else, for a missing package, the device flag that was set; a callback the
    message names is ``trainer.callbacks``. The line says which flag, Lightning's reason and the fix.

    Args:
        err: The exception.
        config: The Trainer's arguments as given.
        defaults: The Trainer's defaults (to tell which flags the user set).
    """
    reason = " ".join(str(err).split()).rstrip(".") or type(err).__name__
    flag = _trainer_flag(reason, config, defaults)
    if flag is None and isinstance(err, ImportError):
        flag = next((f for f in _DEVICE_FLAGS if _differs(config.get(f), defaults.get(f))), None)
    if flag is None:
        callbacks = config.get("callbacks") or []
        callbacks = callbacks if isinstance(callbacks, list) else [callbacks]
        named = [type(c).__name__ for c in callbacks if re.search(rf"\b{type(c).__name__}\b", reason)]
        if named:
            return f"trainer.callbacks ({named[0]}): {reason}; fix its init_args or remove it"
        return f"trainer: Lightning refused the Trainer's arguments: {reason}; fix the flag it names"
    value = config.get(flag)
    if flag == "accelerator" and str(value).lower() in ("gpu", "cuda", "mps", "tpu", "hpu"):
        return (
            f"trainer.accelerator={value}: Lightning finds no usable {value} here ({reason}); use "
            "--trainer.accelerator=auto (a GPU when there is one, else the CPU) or --trainer.accelerator=cpu"
        )
    return f"trainer.{flag}={value!r}: {reason}; fix trainer.{flag} or leave it out (see `fit --help`)"


#: Trainer flags that select hardware or a backend: the suspects when a package is missing.
_DEVICE_FLAGS = ("accelerator", "strategy", "precision", "plugins", "devices")


def _trainer_flag(reason: str, config: dict[str, Any], defaults: dict[str, Any]) -> str | None:
    named = [flag for flag in config if re.search(rf"(?<![\w.]){re.escape(flag)}(?!\w)", reason)]
    changed = [flag for flag in config if _differs(config[flag], defaults.get(flag))]
    for flag in named:
        if flag in changed:
            return flag
    if named:
        return named[0]
    quoted = [
        flag
        for flag in changed
        if isinstance(config[flag], (str, int, float))
        and not isinstance(config[flag], bool)
        and re.search(rf"(?<![\w.]){re.escape(str(config[flag]))}(?![\w.])", reason, re.IGNORECASE)
    ]
    return quoted[0] if quoted else None


def _differs(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return False
    try:
        return bool(a != b)
    except Exception:  # objects without a plain comparison (tensors, callbacks): assume set
        return True


def find_cause(err: BaseException, kind: type[BaseException] | tuple[type[BaseException], ...]) -> Any:
    """The first exception of ``kind`` in ``err``'s chain (``__cause__``, then ``__context__``), or None."""
    seen: set[int] = set()
    todo: BaseException | None = err
    while todo is not None and id(todo) not in seen:
        if isinstance(todo, kind):
            return todo
        seen.add(id(todo))
        todo = todo.__cause__ or todo.__context__
    return None


def find_key(config: dict[str, Any], name: str, value: Any, prefix: str = "") -> str | None:
    """The dotted key (``init_args`` levels left out) of the first ``name: value`` in a config dict."""
    for key, sub in config.items():
        here = prefix if key == "init_args" else f"{prefix}.{key}" if prefix else key
        if isinstance(sub, dict):
            found = find_key(sub, name, value, here)
            if found:
                return found
        elif key == name and type(sub) is type(value) and sub == value:
            return here
    return None
