"""Errors raised for bad user input (configs, data, checkpoints) and a helper that checks numbers."""

from __future__ import annotations

import math
import numbers


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
