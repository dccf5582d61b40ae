"""Errors raised for bad user input (configs, data, checkpoints) and helpers that check numbers and build a
config object from its fields."""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A bad configuration value, data file or checkpoint.

    The message is one line that names the offending field (as it is spelled in the YAML config,
    e.g. ``data.partition.alpha``) and says how to fix it. The CLI prints it without a traceback.
    """


class RunError(RuntimeError):
    """A run that cannot go on for a reason the user has to act on (e.g. every client keeps failing).

    Like :class:`ConfigError` its message is one line with the cause and what to do; the CLI prints it
    without a traceback (exit status 1: the config parsed, the run itself failed).
    """


def check_number(
    value: object,
    field: str,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    hint: str = "",
) -> None:
    """Raise :class:`ConfigError` unless ``value`` is a finite real number in the given range.

    NaN compares False with everything, so checks written as ``if value <= 0: raise`` let it through;
    this helper rejects NaN and infinities first.

    Args:
        value: The value from the config.
        field: The field as spelled in the YAML config, e.g. ``model.client.lr``.
        low: Lower bound (None: unbounded below).
        high: Upper bound (None: unbounded above).
        low_open: Exclude ``low`` itself (``> low`` instead of ``>= low``).
        high_open: Exclude ``high`` itself (``< high`` instead of ``<= high``).
        hint: Appended to the message: what the value means or a typical value. One starting with
            ``(`` follows after a space, anything else after ``"; "``.

    Raises:
        ConfigError: ``"<field>=<value> must be <range>[ hint]"``, one line.
    """
    if low is not None and high is not None:
        rng = f"in {'(' if low_open else '['}{_fmt(low)}, {_fmt(high)}{')' if high_open else ']'}"
    elif low is not None:
        rng = f"{'>' if low_open else '>='} {_fmt(low)}"
    elif high is not None:
        rng = f"{'<' if high_open else '<='} {_fmt(high)}"
    else:
        rng = ""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (low is None or (value > low if low_open else value >= low)) and (
            high is None or (value < high if high_open else value <= high)
        )
    else:
        rng = f"a finite number {rng}".rstrip()
    if not ok:
        tail = "" if not hint else (f" {hint}" if hint.startswith("(") else f"; {hint}")
        raise ConfigError(f"{field}={value!r} must be {rng}{tail}")


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def as_fields_object(cls: type[T], value: Any, field: str, noun: str, example: str) -> T:
    """``value`` as a ``cls`` (a dataclass of config fields, e.g. ``RoundPolicy``, ``Runtime``): itself, the
    default for None, or built from a mapping of its fields (the command line's saved config of it, a
    checkpoint's).

    Raises:
        ConfigError: one line naming ``<field>.<name>`` for a name ``cls`` does not have, or ``<field>`` for
            a value that is neither (``example`` shows how to write one).
    """
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
        unknown = sorted(set(value) - set(names))
        if unknown:
            raise ConfigError(
                f"{field}.{unknown[0]} is not a field of the {noun}; use one of " + ", ".join(names)
            )
        return cls(**value)
    raise ConfigError(
        f"{field}={value!r} must be a {cls.__name__} (e.g. {example}) or a mapping of its fields"
    )
