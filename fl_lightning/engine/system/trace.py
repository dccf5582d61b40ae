"""Devices read from a CSV trace: one line per client (speed, bandwidth, availability, dropout)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

from fl_lightning.engine.system.base import SystemModel
from fl_lightning.engine.system.profiles import Profiles
from fl_lightning.errors import ConfigError, check_number

#: The trace's columns, in order; ``dropout`` may be left out (0 for every client).
COLUMNS = ("client", "speed", "download_mbps", "upload_mbps", "availability", "dropout")
REQUIRED = COLUMNS[:5]
#: What each column holds, for the messages.
UNITS = {
    "client": "an integer client id from 0",
    "speed": "training samples per second, > 0",
    "download_mbps": "Mbit/s, > 0",
    "upload_mbps": "Mbit/s, > 0",
    "availability": "a probability in [0, 1]",
    "dropout": "a probability in [0, 1]",
}


class Trace(SystemModel):
    """Every client's device read from a CSV file (``--model.system=Trace --model.system.path=devices.csv``).

    The file has a header line and one line per client::

        client,speed,download_mbps,upload_mbps,availability,dropout
        0,120.5,22.0,6.1,0.9,0.0
        1,35.0,8.4,1.2,0.6,0.05

    ``speed`` in training samples per second, bandwidths in Mbit/s, ``availability`` the probability of being
    online when a round samples, ``dropout`` (optional column, default 0) the probability of dropping out in
    the middle of a round's work; a client's time for a round is then download + computation + upload as in
    :class:`~fl_lightning.engine.system.base.SystemModel` (FedScale's replay of device traces, Lai et al.,
    ICML 2022, Sec. 3, in this form). Every client of the federation needs a line. A missing or malformed file
    is one line naming the file, the line and the column.

    Args:
        path: The CSV file (relative paths from the folder the command runs in).
        day_s: Period of a day/night cycle in simulated seconds (None: none); see ``Devices``.
        online_fraction: Share of each period a client is online, in (0, 1] (with ``day_s``).
    """

    def __init__(
        self,
        path: str,
        day_s: float | None = None,
        online_fraction: float = 0.5,
    ) -> None:
        super().__init__()
        f = self.field
        if day_s is not None:
            check_number(day_s, f"{f}.day_s", low=0, low_open=True, hint="(simulated seconds, e.g. 86400)")
        check_number(online_fraction, f"{f}.online_fraction", low=0, high=1, low_open=True)
        self.path = str(path)
        self.day_s = day_s
        self.online_fraction = online_fraction
        self.rows = read_trace(Path(path), f"{f}.path")

    def profiles(self, num_clients: int, seed: int) -> Profiles:
        """The trace's lines of clients ``0 .. num_clients - 1`` (a missing one is a one-line error); the
        day/night phases, if any, spread evenly over the clients (``k / num_clients``)."""
        missing = [c for c in range(num_clients) if c not in self.rows]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise ConfigError(
                f"{self.field}.path: {self.path} has no line for client {missing[0]}{more}; data.num_clients="
                f"{num_clients} needs a line for each client 0..{num_clients - 1}"
            )
        rows = [self.rows[c] for c in range(num_clients)]
        cycle = self.day_s is not None
        return Profiles(
            speed=tuple(r["speed"] for r in rows),
            download_mbps=tuple(r["download_mbps"] for r in rows),
            upload_mbps=tuple(r["upload_mbps"] for r in rows),
            availability=tuple(r["availability"] for r in rows),
            dropout=tuple(r.get("dropout", 0.0) for r in rows),
            phase=tuple(k / num_clients for k in range(num_clients)) if cycle else (),
            day_s=self.day_s if cycle else 86400.0,
            online_fraction=self.online_fraction if cycle else 1.0,
        )


def read_trace(path: Path, field: str) -> dict[int, dict[str, float]]:
    """``{client: {column: value}}`` of a trace file, every value checked.

    Raises:
        ConfigError: One line naming ``field``, the file, and for a bad value its line and column.
    """
    header = ",".join(REQUIRED) + "[,dropout]"
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "does not exist"
        raise ConfigError(
            f"{field}: {path} {what}; give a CSV file with the header {header}, one line per client"
        )
    try:
        with open(path, newline="") as handle:
            lines = list(csv.reader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise ConfigError(f"{field}: {path} cannot be read as CSV ({type(err).__name__}: {err})") from None
    if not lines:
        raise ConfigError(f"{field}: {path} is empty; give the header {header} and one line per client")
    names = [n.strip() for n in lines[0]]
    if names != list(REQUIRED) and names != list(COLUMNS):
        raise ConfigError(f"{field}: {path} line 1: the header must be {header}, found {','.join(names)!r}")
    rows: dict[int, dict[str, float]] = {}
    for number, values in enumerate(lines[1:], start=2):
        if not values or all(not v.strip() for v in values):
            continue  # a blank line
        if len(values) != len(names):
            raise ConfigError(
                f"{field}: {path} line {number}: {len(values)} values, expected {len(names)} "
                f"({','.join(names)})"
            )
        row = {
            name: _value(path, field, number, col, name, text)
            for col, (name, text) in enumerate(zip(names, values, strict=True), start=1)
        }
        client = int(row.pop("client"))
        if client in rows:
            raise ConfigError(
                f"{field}: {path} line {number}, column 1 (client): client {client} has two lines"
            )
        rows[client] = row
    if not rows:
        raise ConfigError(f"{field}: {path} has a header but no client lines; add one line per client")
    return rows


def _value(path: Path, field: str, line: int, column: int, name: str, text: str) -> float:
    where = f"{field}: {path} line {line}, column {column} ({name})"
    raw = text.strip()
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{where}: {raw!r} is not a number ({UNITS[name]})") from None
    if name == "client":
        ok = value.is_integer() and value >= 0
    elif name in ("availability", "dropout"):
        ok = 0 <= value <= 1
    else:
        ok = math.isfinite(value) and value > 0
    if not ok:
        raise ConfigError(f"{where}: {raw} must be {UNITS[name]}")
    return value


__all__ = ["COLUMNS", "Trace", "read_trace"]
