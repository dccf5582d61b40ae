"""``python -m fl_lightning sweep <sweep.yaml>``: a grid of ``fit`` runs over seeds, N at a time, one table.

Every run of a sweep is an ordinary ``python -m fl_lightning fit`` process in its own folder,
``<out>/<row>/seed<k>/`` (its TensorBoard run, ``config.yaml``, checkpoints and ``summary.json`` under
``lightning_logs/version_N/``, its output in ``fit.log`` / ``fit.err``). ``--jobs N`` runs N at a time
(default: the machine's cores), each with ``cores // N`` intra-op threads (at least 1; as
``--model.threads_per_process`` and ``OMP_NUM_THREADS``): N processes of several threads each on N cores
oversubscribe them. Before any run starts, every row's arguments are parsed as ``fit`` parses them (a row
``fit`` would refuse stops the sweep with ``fit``'s line). Started again, a sweep skips a run only when it
is the run it would start now (the same resolved config, its summary covering ``trainer.max_steps``),
resumes one of the same config that did fewer rounds from its ``last.ckpt`` (``--ckpt_path``), and runs
one of another config again beside it (:func:`inspect_run`); a failed run is tried again. At the end it writes
``<out>/results.md`` and ``<out>/results.csv`` (mean ± std over seeds per row) and prints the table. A
failed run does not stop the others; the exit status is then 1 and the table marks the row.

The sweep file (YAML; relative paths are relative to ``root``)::

    name: fedsmoo_cpu                # default: the file's name; the output folder's name
    root: ../..                      # default: the sweep file's folder; runs start in this folder
    out: runs/fedsmoo_cpu            # under root; default: lightning_logs/sweeps/<name> in the cwd
    base: configs/fedsmoo/common.yaml        # config file(s) every run starts from (--config; optional)
    args: [--trainer.max_steps=100]  # overrides for every run, after the config files
    seeds: [0, 1, 2]                 # --seed_everything of each run (default [0])
    jobs: 2                          # default of --jobs
    threads: 1                       # threads per run (default: cores // jobs)
    target: 0.9                      # rounds until global/<metric> >= 0.9; or {tag: personal/acc, value: 0.9}
    columns: [final, best, client, rounds_to_target, wall_s, mib]   # the table's columns (below)
    grid:                            # named axes; every combination is a row named "<value>/<value>"
      split:
        dir0.1: {config: configs/fedsmoo/cifar10_dir0.1_cpu.yaml}
        path3: {config: configs/fedsmoo/cifar10_path3_cpu.yaml}
      method:
        fedavg: {config: configs/fedsmoo/strategies/fedavg.yaml}
        fedprox: {args: [--model.strategy=FedProx, --model.strategy.mu=0.01]}
    paper: {dir0.1: {fedavg: 76.00}}   # grid only: the paper's number per row, nested by axis (a column)
    notes: "Paper: Table 1."           # text under the table in results.md
    check: {table: fedsmoo_cpu.csv, tolerance: 0.0, columns: [final, best]}   # for --check

``grid`` may also be a list of such mappings with the same axes (the union of their products: e.g. one
block per dataset whose method files differ). Instead of ``grid``, ``rows`` lists the rows one by one::

    rows:
      - {name: fedavg, config: configs/a.yaml, args: [--model.local_steps=5], paper: 76.0}
      - {name: ditto, config: [configs/dense.yaml, configs/ditto.yaml], paper: {acc: 93.7, note: Table 2}}

A row's config files come after ``base`` (grid: in axis order), its ``args`` after the sweep's; the sweep
owns ``--config`` order, ``--seed_everything``, ``--trainer.default_root_dir`` and ``--ckpt_path``.
``paper`` is a number or text, or a mapping of labels to them (one "paper <label>" column each).

Columns (accuracies in %, ``<m>`` = summary.json's ``metric``: accuracy, or O-F1 for multilabel):
``final``, ``best`` (``final_global_<m>``, ``best_global_<m>``), ``best_round``, ``client`` (the mean over
clients of the deployed model on each client's local test split, ``client_<m>.mean``: the personalised
model for personalised strategies, the global model otherwise), ``personal`` (the last ``personal/<m>``
scalar: the same models merged over clients by metric state), ``rounds``, ``rounds_to_target`` and
``mib_to_target`` (from the finished run's ``global/<m>`` and ``round/bytes_*`` TensorBoard scalars; mean
over the seeds that reached it), ``wall_s`` (the run's wall time over all its starts), ``s_per_round``,
``mib``, ``mib_down``, ``mib_up``, ``mib_per_round``, ``kib_per_round``,
``kib_down_per_round``, ``kib_up_per_round``; or ``{label: eps, summary: privacy/epsilon}`` /
``{label: C-F1 (%), scalar: global/c_f1, scale: 100, digits: 2}``: any summary.json number or last
TensorBoard scalar. Default: final, best, client (when the runs have it), rounds_to_target (with a
``target``), wall_s, mib. The std is the sample standard deviation over seeds (n - 1).

A run counts as finished when a ``version_N`` of its folder has the config the run resolves to now (a
digest of its ``config.yaml``, :func:`config_digest`) and a ``summary.json`` that covers the sweep's
``trainer.max_steps`` (or ``fit`` stopped it early, e.g. ``EarlyStopping``). Options:
``--rows PATTERN...`` (shell patterns on row names), ``--seeds``, ``--out``, ``--report`` (only collect the
table), ``--print-commands`` (one ``fit`` command per run still to do, for a SLURM array or GNU parallel,
with ``--ckpt_path`` where one can resume), ``--check`` (re-run the rows into a fresh folder and compare
them with the stored table, ``check.table``, default ``<sweep file>.csv`` beside it: match if equal to the
printed precision or within ``check.tolerance``; exit 1 on a mismatch), and after ``--`` more ``fit``
arguments for every run. Bad sweep files stop with one ``error:`` line.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import difflib
import fnmatch
import hashlib
import itertools
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn

import yaml

from fl_lightning.errors import ConfigError
from fl_lightning.runs import machine_text, read_scalars

TOP_KEYS = (
    "name",
    "root",
    "out",
    "base",
    "args",
    "seeds",
    "jobs",
    "threads",
    "target",
    "columns",
    "grid",
    "rows",
    "paper",
    "notes",
    "check",
)
ROW_KEYS = ("name", "config", "args", "paper")
AXIS_KEYS = ("config", "args")
CHECK_KEYS = ("table", "tolerance", "columns")
CUSTOM_KEYS = ("label", "summary", "scalar", "scale", "digits")
#: ``fit`` options the sweep sets itself (per run); a sweep file must not set them in ``args``.
OWNED = ("--config", "--seed_everything", "--trainer.default_root_dir", "--ckpt_path")
_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+=-]*$")
MARKER = "sweep.json"
#: Where a sweep's runs go unless its file says ``out:`` (relative: to the folder the sweep starts in).
DEFAULT_OUT = Path("lightning_logs", "sweeps")


@dataclass(frozen=True)
class Column:
    """One table column: how to read a run's value and how to print it."""

    key: str
    label: str  # ``{m}`` is the metric's name, ``{target}`` the target
    digits: int
    legend: str
    read: Callable[[RunData], float | None]
    checked: bool = True  # compared by --check (wall-clock columns are not)


@dataclass(frozen=True, eq=False)
class Row:
    """A row of the table: its name, its config files and overrides, the paper's numbers."""

    name: str
    keys: tuple[str, ...]
    configs: tuple[str, ...]
    args: tuple[str, ...]
    paper: dict[str, Any]


@dataclass
class Sweep:
    """A parsed, checked sweep file."""

    path: Path
    name: str
    root: Path
    out: Path
    base: tuple[str, ...]
    args: tuple[str, ...]
    seeds: tuple[int, ...]
    axes: tuple[str, ...]  # grid axes; ("row",) for explicit rows
    rows: list[Row]
    jobs: int | None = None
    threads: int | None = None
    target: tuple[str | None, float] | None = None  # (tag, value); tag None: global/<metric>
    columns: list[Column] = field(default_factory=list)
    auto_client: bool = True  # default columns: show ``client`` only when runs have it
    notes: str = ""
    check_table: Path | None = None
    tolerance: float = 0.0
    check_columns: tuple[str, ...] | None = None


@dataclass(frozen=True, eq=False)
class Run:
    """One ``fit`` run: a row at a seed, in its own folder; ``expected`` is what it resolves to (its
    config's digest and rounds, :func:`expect`), against which the folder's content is judged."""

    row: Row
    seed: int
    folder: Path
    expected: Expected | None = None

    @property
    def label(self) -> str:
        return f"{self.row.name} seed {self.seed}"


@dataclass(frozen=True)
class Expected:
    """The run the sweep would start now: the digest of its resolved config and its rounds."""

    digest: str
    max_steps: int
    config: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass
class RunState:
    """A run folder against the run the sweep would start now.

    ``kind``: ``finished`` (that run, done: its ``summary`` and ``version``), ``resume`` (the same config,
    fewer rounds or interrupted: its ``ckpt``), ``rerun`` (a run of another config, or one that cannot be
    resumed, is there: a new one starts beside it), ``failed`` (its last start failed before a checkpoint)
    or ``new``. ``why`` says what was found, ``error`` the last start's error line.
    """

    kind: str
    summary: dict[str, Any] | None = None
    ckpt: Path | None = None
    error: str | None = None
    why: str = ""
    version: Path | None = None


class RunData:
    """A finished run's summary.json and (read on first use) its TensorBoard scalars (its version folder)."""

    def __init__(
        self, folder: Path, summary: dict[str, Any], target: tuple[str | None, float] | None
    ) -> None:
        self.folder = folder  # the run's lightning_logs/version_N
        self.summary = summary
        self.metric = str(summary.get("metric", "acc"))
        self.target = target
        self._scalars: dict[str, list[tuple[int, float]]] | None = None

    @property
    def scalars(self) -> dict[str, list[tuple[int, float]]]:
        if self._scalars is None:
            self._scalars = read_scalars(self.folder)
        return self._scalars

    def last_scalar(self, tag: str) -> float | None:
        values = self.scalars.get(tag)
        return values[-1][1] if values else None

    def target_reached(self) -> tuple[int, float] | None:
        """``(round, bytes)`` when the target tag first reached the target value, else None."""
        if self.target is None:
            return None
        tag, value = self.target
        for step, v in self.scalars.get(tag or f"global/{self.metric}", []):
            if v >= value:
                sent = sum(
                    b
                    for t in ("round/bytes_down", "round/bytes_up")
                    for s, b in self.scalars.get(t, [])
                    if s <= step
                )
                return step, sent
        return None


# ---------------------------------------------------------------------------------------------- columns


def _summary_pct(key: str) -> Callable[[RunData], float | None]:
    def read(d: RunData) -> float | None:
        v = d.summary.get(key.format(m=d.metric))
        return None if v is None else 100.0 * float(v)

    return read


def _summary_num(key: str, scale: float = 1.0, per_round: bool = False) -> Callable[[RunData], float | None]:
    def read(d: RunData) -> float | None:
        v = d.summary.get(key)
        if not isinstance(v, int | float) or isinstance(v, bool):
            return None
        rounds = d.summary.get("rounds") or 0
        if per_round:
            return None if not rounds else scale * v / rounds
        return scale * float(v)

    return read


def _run_wall(d: RunData) -> float | None:
    """The run's wall time over all its starts (``run_wall_time_s``; a summary written before it: the
    last start's, ``wall_time_s``)."""
    return _summary_num("run_wall_time_s" if "run_wall_time_s" in d.summary else "wall_time_s")(d)


def _client(d: RunData) -> float | None:
    spread = d.summary.get(f"client_{d.metric}")
    return 100.0 * float(spread["mean"]) if isinstance(spread, dict) and "mean" in spread else None


def _personal(d: RunData) -> float | None:
    v = d.last_scalar(f"personal/{d.metric}")
    return None if v is None else 100.0 * v


def _to_target_rounds(d: RunData) -> float | None:
    hit = d.target_reached()
    return None if hit is None else float(hit[0])


def _to_target_mib(d: RunData) -> float | None:
    hit = d.target_reached()
    return None if hit is None else hit[1] / 2**20


_MIB, _KIB = 1 / 2**20, 1 / 2**10
COLUMNS: dict[str, Column] = {
    c.key: c
    for c in [
        Column(
            "final", "final {m} (%)", 2, "global model after the last round", _summary_pct("final_global_{m}")
        ),
        Column("best", "best {m} (%)", 2, "global model, best round", _summary_pct("best_global_{m}")),
        Column("best_round", "best round", 1, "round of the best global value", _summary_num("best_round")),
        Column(
            "client",
            "client {m} (%)",
            2,
            "mean over clients of the deployed model (the personalised one for personalised strategies, "
            "else the global model) on each client's local test split",
            _client,
        ),
        Column(
            "personal",
            "personal {m} (%)",
            2,
            "every client's deployed model on its local test split, merged over clients (last personal/{m})",
            _personal,
        ),
        Column("rounds", "rounds", 1, "rounds done", _summary_num("rounds")),
        Column(
            "rounds_to_target",
            "rounds to {target}",
            1,
            "first round whose {tag} reached the target (mean over the seeds that reached it)",
            _to_target_rounds,
        ),
        Column("mib_to_target", "MiB to {target}", 2, "bytes down + up until then", _to_target_mib),
        Column("wall_s", "wall (s)", 1, "wall time of the run (all its starts)", _run_wall, False),
        Column("s_per_round", "s/round", 3, "mean time per round", _summary_num("mean_round_s"), False),
        Column("mib", "MiB", 2, "bytes down + up, all rounds", _summary_num("bytes_total", _MIB)),
        Column("mib_down", "MiB down", 2, "bytes to the clients", _summary_num("bytes_down", _MIB)),
        Column("mib_up", "MiB up", 2, "bytes from the clients", _summary_num("bytes_up", _MIB)),
        Column(
            "mib_per_round",
            "MiB/round",
            3,
            "bytes down + up per round",
            _summary_num("bytes_total", _MIB, True),
        ),
        Column(
            "kib_per_round",
            "KiB/round",
            1,
            "bytes down + up per round",
            _summary_num("bytes_total", _KIB, True),
        ),
        Column("kib_down_per_round", "KiB down/round", 1, "", _summary_num("bytes_down", _KIB, True)),
        Column("kib_up_per_round", "KiB up/round", 1, "", _summary_num("bytes_up", _KIB, True)),
    ]
}
DEFAULT_COLUMNS = ("final", "best", "client", "rounds_to_target", "wall_s", "mib")


def _custom_column(spec: dict[str, Any], where: str) -> Column:
    _check_keys(spec, CUSTOM_KEYS, where)
    label = spec.get("label")
    if not isinstance(label, str) or not label:
        raise ConfigError(
            f"{where}.label: give the column's header, e.g. {{label: eps, summary: privacy/epsilon}}"
        )
    sources = [k for k in ("summary", "scalar") if k in spec]
    if len(sources) != 1 or not isinstance(spec[sources[0]], str):
        raise ConfigError(f"{where}: give one of summary: <summary.json key> or scalar: <TensorBoard tag>")
    scale = spec.get("scale", 1.0)
    digits = spec.get("digits", 2)
    if not isinstance(scale, int | float) or isinstance(scale, bool):
        raise ConfigError(f"{where}.scale={scale!r} must be a number, e.g. 100 for a fraction in %")
    if not isinstance(digits, int) or isinstance(digits, bool) or not 0 <= digits <= 8:
        raise ConfigError(f"{where}.digits={digits!r} must be an integer in [0, 8]")
    source = spec[sources[0]]
    if sources[0] == "summary":
        read = _summary_num(source, float(scale))
    else:

        def read(d: RunData, tag: str = source, s: float = float(scale)) -> float | None:
            v = d.last_scalar(tag)
            return None if v is None else s * v

    key = re.sub(r"[^A-Za-z0-9]+", "_", label).strip("_").lower() or "value"
    label = label.replace("{", "{{").replace("}", "}}")  # headers are formatted with {m} and {target}
    return Column(key, label, digits, f"{sources[0]} {source}", read)


# ---------------------------------------------------------------------------------------------- parsing


def _check_keys(mapping: dict[str, Any], known: tuple[str, ...], where: str) -> None:
    for key in mapping:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(known)}"
            raise ConfigError(f"{where}: unknown key {key!r}; {hint}")


def _strings(value: Any, where: str) -> tuple[str, ...]:
    """A string or a list of strings (``config:``) as a tuple."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ConfigError(f"{where} must be a file name or a list of them, got {value!r}")


def _args(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where} must be a list of fit arguments, e.g. [--trainer.max_steps=100]")
    for arg in value:
        if not arg.startswith("--"):
            raise ConfigError(f"{where}: {arg!r} is not an option; write --<field>=<value>")
        for owned in OWNED:
            if arg == owned or arg.startswith(owned + "="):
                raise ConfigError(
                    f"{where}: {owned} is set by the sweep (config files: base/config; seeds: seeds; "
                    "folders: out; resume: automatic)"
                )
    return tuple(value)


def _key(value: Any, where: str) -> str:
    """An axis value or row name segment as a folder-safe string."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ConfigError(f"{where}: {value!r} is not a name; use letters, digits and . _ + = -")
    text = str(value)
    if not _SEGMENT.match(text):
        raise ConfigError(f"{where}: {text!r} is not a folder-safe name; use letters, digits and . _ + = -")
    return text


def _paper(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, bool):
        raise ConfigError(f"{where} must be a number, a text or a mapping of labels to them")
    if isinstance(value, int | float | str):
        return {"": value}
    if isinstance(value, dict) and all(
        isinstance(v, int | float | str) and not isinstance(v, bool) for v in value.values()
    ):
        return {str(k): v for k, v in value.items()}
    raise ConfigError(f"{where} must be a number, a text or a mapping of labels to them")


def _check_files(files: tuple[str, ...], root: Path, where: str) -> None:
    for f in files:
        path = root / f
        if not path.is_file():
            raise ConfigError(f"{where}: config file {f} not found (paths are relative to root: {root})")


def _grid_rows(grid: Any, root: Path, where: str = "grid") -> tuple[tuple[str, ...], list[Row]]:
    blocks = grid if isinstance(grid, list) else [grid]
    if not blocks:
        raise ConfigError(
            f"{where}: empty; give named axes, e.g. grid: {{method: {{fedavg: {{config: a.yaml}}}}}}"
        )
    axes: tuple[str, ...] | None = None
    rows: list[Row] = []
    for i, block in enumerate(blocks):
        at = f"{where}[{i}]" if isinstance(grid, list) else where
        if not isinstance(block, dict) or not block:
            raise ConfigError(
                f"{at} must map axis names to their values, e.g. method: {{fedavg: {{config: a.yaml}}}}"
            )
        names = tuple(_key(a, f"{at} axis") for a in block)
        if axes is not None and names != axes:
            raise ConfigError(
                f"{at}: axes {', '.join(names)} differ from the first block's {', '.join(axes)}"
            )
        axes = names
        values: list[list[tuple[str, tuple[str, ...], tuple[str, ...]]]] = []
        for axis, entries in block.items():
            if not isinstance(entries, dict) or not entries:
                raise ConfigError(f"{at}.{axis} must map values to {{config: ..., args: [...]}}")
            options = []
            for value, entry in entries.items():
                name = _key(value, f"{at}.{axis}")
                place = f"{at}.{axis}.{name}"
                entry = entry if entry is not None else {}
                if not isinstance(entry, dict):
                    raise ConfigError(f"{place} must be a mapping {{config: ..., args: [...]}} (or empty)")
                _check_keys(entry, AXIS_KEYS, place)
                configs = _strings(entry.get("config"), f"{place}.config")
                _check_files(configs, root, place)
                options.append((name, configs, _args(entry.get("args"), f"{place}.args")))
            values.append(options)
        for combo in itertools.product(*values):
            keys = tuple(c[0] for c in combo)
            rows.append(
                Row(
                    name="/".join(keys),
                    keys=keys,
                    configs=tuple(f for c in combo for f in c[1]),
                    args=tuple(a for c in combo for a in c[2]),
                    paper={},
                )
            )
    assert axes is not None
    return axes, rows


def _explicit_rows(entries: Any, root: Path) -> list[Row]:
    if not isinstance(entries, list) or not entries:
        raise ConfigError("rows must be a list of {name: ..., config: ..., args: [...], paper: ...}")
    rows = []
    for i, entry in enumerate(entries):
        where = f"rows[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where} must be a mapping {{name: ..., config: ..., args: [...]}}")
        _check_keys(entry, ROW_KEYS, where)
        if "name" not in entry:
            raise ConfigError(f"{where}: give the row a name (its folder under out)")
        name = str(entry["name"])
        for part in name.split("/"):
            _key(part, f"{where}.name")
        configs = _strings(entry.get("config"), f"{where}.config")
        _check_files(configs, root, where)
        rows.append(
            Row(
                name=name,
                keys=(name,),
                configs=configs,
                args=_args(entry.get("args"), f"{where}.args"),
                paper=_paper(entry.get("paper"), f"{where}.paper"),
            )
        )
    return rows


def _attach_paper(paper: Any, axes: tuple[str, ...], rows: list[Row]) -> list[Row]:
    """The grid's ``paper:`` (nested by axis value) onto its rows; a key naming no row is an error."""
    if paper is None:
        return rows
    found: dict[tuple[str, ...], dict[str, Any]] = {}

    def walk(node: Any, path: tuple[str, ...]) -> None:
        where = "paper" + "".join(f".{p}" for p in path)
        if len(path) == len(axes):
            found[path] = _paper(node, where)
            return
        if not isinstance(node, dict):
            raise ConfigError(f"{where}: nest the paper's numbers by axis ({', '.join(axes)})")
        for k, v in node.items():
            walk(v, (*path, str(k)))

    walk(paper, ())
    by_keys = {r.keys: r for r in rows}
    for keys in found:
        if keys not in by_keys:
            raise ConfigError(f"paper.{'.'.join(keys)}: no such row in the grid")
    return [Row(r.name, r.keys, r.configs, r.args, found.get(r.keys, {})) for r in rows]


def _positive(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{where}={value!r} must be an integer >= 1")
    return value


def load_sweep(path: str | os.PathLike) -> Sweep:
    """Read and check a sweep file; every problem is a :class:`ConfigError` naming the key and the fix."""
    path = Path(path)
    try:
        content = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such sweep file") from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot read it ({err.strerror or err})") from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(
            f"{path}: YAML syntax error{at}: {err.problem or err.context}; fix the file"
        ) from None
    if not isinstance(content, dict):
        raise ConfigError(
            f"{path}: a sweep file is a mapping with grid: or rows: (see python -m fl_lightning sweep --help)"
        )
    try:
        return _parse(path, content)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


def _parse(path: Path, c: dict[str, Any]) -> Sweep:
    _check_keys(c, TOP_KEYS, "sweep file")
    here = path.resolve().parent
    root = (here / str(c["root"])).resolve() if c.get("root") is not None else here
    if not root.is_dir():
        raise ConfigError(f"root: {root} is not a folder")
    name = _key(c.get("name", path.stem), "name")
    out = root / str(c["out"]) if c.get("out") is not None else Path.cwd().resolve() / DEFAULT_OUT / name
    base = _strings(c.get("base"), "base")
    _check_files(base, root, "base")
    if ("grid" in c) == ("rows" in c):
        raise ConfigError("give either grid: (named axes) or rows: (a list), not both or neither")
    if "grid" in c:
        axes, rows = _grid_rows(c["grid"], root)
        rows = _attach_paper(c.get("paper"), axes, rows)
    else:
        if c.get("paper") is not None:
            raise ConfigError("paper: at the top level is for grid rows; give each row its own paper:")
        axes, rows = ("row",), _explicit_rows(c["rows"], root)
    seen: set[str] = set()
    for r in rows:
        if r.name in seen:
            raise ConfigError(f"row {r.name!r} appears twice; names must be unique (they are folders)")
        seen.add(r.name)
    seeds = c.get("seeds", [0])
    if (
        not isinstance(seeds, list)
        or not seeds
        or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**32 for s in seeds)
    ):
        raise ConfigError(f"seeds={seeds!r} must be a list of integers >= 0, e.g. [0, 1, 2]")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"seeds={seeds!r} repeats a seed")
    target = _target(c.get("target"))
    columns, auto = _columns(c.get("columns"), target)
    check = c.get("check") or {}
    if not isinstance(check, dict):
        raise ConfigError("check must be a mapping {table: <csv>, tolerance: 0.0, columns: [...]}")
    _check_keys(check, CHECK_KEYS, "check")
    tolerance = check.get("tolerance", 0.0)
    if not isinstance(tolerance, int | float) or isinstance(tolerance, bool) or not tolerance >= 0:
        raise ConfigError(
            f"check.tolerance={tolerance!r} must be a number >= 0 (in the column's printed unit)"
        )
    check_columns = check.get("columns")
    if check_columns is not None:
        keys = {col.key for col in columns}
        if not isinstance(check_columns, list) or not all(k in keys for k in check_columns):
            raise ConfigError(
                f"check.columns={check_columns!r} must list columns of the table: {', '.join(keys)}"
            )
        check_columns = tuple(check_columns)
    table = (
        root / str(check["table"]) if check.get("table") is not None else path.with_suffix(".csv").resolve()
    )
    notes = c.get("notes") or ""
    if not isinstance(notes, str):
        raise ConfigError("notes must be text")
    return Sweep(
        path=path,
        name=name,
        root=root,
        out=out,
        base=base,
        args=_args(c.get("args"), "args"),
        seeds=tuple(seeds),
        axes=axes,
        rows=rows,
        jobs=_positive(c.get("jobs"), "jobs"),
        threads=_positive(c.get("threads"), "threads"),
        target=target,
        columns=columns,
        auto_client=auto,
        notes=notes.strip(),
        check_table=table,
        tolerance=float(tolerance),
        check_columns=check_columns,
    )


def _target(value: Any) -> tuple[str | None, float] | None:
    if value is None:
        return None
    tag: Any = None
    if isinstance(value, dict):
        _check_keys(value, ("tag", "value"), "target")
        tag, value = value.get("tag"), value.get("value")
        if tag is not None and (not isinstance(tag, str) or not tag):
            raise ConfigError(f"target.tag={tag!r} must be a TensorBoard tag, e.g. personal/acc")
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise ConfigError(
            f"target={value!r} must be a number (a fraction: 0.9 for 90%) or {{tag: ..., value: ...}}"
        )
    return tag, float(value)


def _columns(value: Any, target: tuple[str | None, float] | None) -> tuple[list[Column], bool]:
    if value is None:
        keys = [k for k in DEFAULT_COLUMNS if k != "rounds_to_target" or target is not None]
        return [COLUMNS[k] for k in keys], True
    if not isinstance(value, list) or not value:
        raise ConfigError(
            f"columns must be a list of column names ({', '.join(COLUMNS)}) or {{label: ..., summary: ...}}"
        )
    out = []
    for i, spec in enumerate(value):
        if isinstance(spec, dict):
            out.append(_custom_column(spec, f"columns[{i}]"))
        elif isinstance(spec, str) and spec in COLUMNS:
            if spec.endswith("to_target") and target is None:
                raise ConfigError(f"columns: {spec} needs a target: (e.g. target: 0.9)")
            out.append(COLUMNS[spec])
        else:
            close = difflib.get_close_matches(str(spec), COLUMNS, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(COLUMNS)}"
            raise ConfigError(f"columns[{i}]: unknown column {spec!r}; {hint}")
    keys = [c.key for c in out]
    if len(set(keys)) != len(keys):
        raise ConfigError("columns: a column is listed twice")
    return out, False


# ---------------------------------------------------------------------------------------------- run folders


def _versions(folder: Path) -> list[Path]:
    found = [v for v in (folder / "lightning_logs").glob("version_*") if v.name[8:].isdigit()]
    return sorted(found, key=lambda v: int(v.name[8:]))


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _read_yaml(path: Path) -> dict[str, Any] | None:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    return data if isinstance(data, dict) else None


#: Config fields that do not make a run another run: where it writes and reads, how the sweep runs it
#: (threads, progress bar, ``--ckpt_path``) and ``trainer.max_steps`` (compared on its own: fewer rounds of
#: the same config resume).
NOT_DIGESTED = (
    "ckpt_path",
    "weights_only",
    "trainer.default_root_dir",
    "trainer.enable_progress_bar",
    "trainer.max_steps",
    "model.threads_per_process",
    "data.root",
    "data.download",
)


def flat_config(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a.b.c": value}`` for a nested config mapping (lists stay values)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flat_config(value, name + "."))
        else:
            out[name] = value
    return out


def _digested(config: dict[str, Any]) -> dict[str, Any]:
    flat = flat_config(config)
    return {k: v for k, v in flat.items() if not any(k == d or k.startswith(d + ".") for d in NOT_DIGESTED)}


def config_digest(config: dict[str, Any]) -> str:
    """A short hash of a resolved ``fit`` config (as in ``config.yaml``), :data:`NOT_DIGESTED` left out."""
    text = json.dumps(_digested(config), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def config_changes(found: dict[str, Any], wanted: dict[str, Any], limit: int = 3) -> str:
    """The fields that differ between two configs, ``name: old -> new``, the first ``limit`` of them."""
    a, b = _digested(found), _digested(wanted)
    keys = sorted(k for k in a.keys() | b.keys() if a.get(k, "<unset>") != b.get(k, "<unset>"))
    keys = [k for k in keys if not any(other.startswith(k + ".") for other in keys)]  # {} -> its fields
    text = "; ".join(f"{k}: {a.get(k, '<unset>')} -> {b.get(k, '<unset>')}" for k in keys[:limit])
    return text + (f" (and {len(keys) - limit} more)" if len(keys) > limit else "")


def _ckpt_rounds(path: Path) -> int | None:
    from fl_lightning.lightning.checkpoint import load_checkpoint_file

    try:
        return int(load_checkpoint_file(path, "cpu", True, mmap=True).get("global_step", 0))
    except ConfigError:
        return None


def _finished(version: Path, expected: Expected, marker: dict[str, Any]) -> dict[str, Any] | None:
    """The summary of ``version`` if it is the run ``expected`` describes and ran to its end, else None.

    To its end: the summary is not of an interrupted start, and it covers ``trainer.max_steps`` = the
    sweep's rounds (the summary says which ``max_steps`` it ran for; one written before it did must have
    those rounds, or the sweep saw that ``fit`` exit 0: a run stopped early by a callback).
    """
    config = _read_yaml(version / "config.yaml")
    summary = _read_json(version / "summary.json")
    if config is None or summary is None or summary.get("interrupted"):
        return None
    if config_digest(config) != expected.digest:
        return None
    rounds = summary.get("rounds")
    if not isinstance(rounds, int) or rounds > expected.max_steps:
        return None
    if "max_steps" in summary:
        return summary if summary["max_steps"] == expected.max_steps else None
    steps = (config.get("trainer") or {}).get("max_steps")
    clean = marker.get("returncode") == 0 and marker.get("version") == version.name
    return summary if steps == expected.max_steps and (rounds == steps or clean) else None


def inspect_run(folder: Path, expected: Expected) -> RunState:
    """The state of a run folder against the run the sweep would start now (see :class:`RunState`).

    Finished: a version of the run has the same resolved config (its digest, :func:`config_digest`) and
    its summary covers the sweep's ``max_steps``. Else the newest version of the same config, if any,
    resumes from its ``last.ckpt`` when it did fewer rounds (a shorter run, or one interrupted); another
    config, more rounds than the sweep's, or no checkpoint runs again (beside it: nothing is removed).
    """
    versions = _versions(folder)
    marker = _read_json(folder / MARKER) or {}
    for version in reversed(versions):
        summary = _finished(version, expected, marker)
        if summary is not None:
            return RunState("finished", summary=summary, version=version)
    error = marker.get("error") if marker.get("returncode") not in (None, 0) else None
    if not versions:
        return RunState("failed" if error else "new", error=error)
    configs = {v: _read_yaml(v / "config.yaml") for v in versions}
    same = [v for v in versions if configs[v] is not None and config_digest(configs[v]) == expected.digest]
    if not same:
        found = configs[versions[-1]]
        if found is None:
            return RunState("rerun", error=error, why=f"{versions[-1].name} has no config.yaml")
        changes = config_changes(found, expected.config) if expected.config else ""
        return RunState("rerun", error=error, why="its config differs" + (f": {changes}" if changes else ""))
    ckpt = same[-1] / "checkpoints" / "last.ckpt"
    rounds = _ckpt_rounds(ckpt) if ckpt.is_file() else None
    if rounds is None:
        why = "no checkpoint to resume from" if not ckpt.is_file() else "its last.ckpt cannot be read"
        return RunState("rerun", error=error, why=why)
    if rounds >= expected.max_steps:
        why = f"it ran {rounds} rounds; the sweep's trainer.max_steps is {expected.max_steps}"
        return RunState("rerun", error=error, why=why)
    return RunState("resume", ckpt=ckpt, error=error, why=f"{rounds} of {expected.max_steps} rounds done")


def error_line(stderr: str, returncode: int) -> str:
    """The one line that says why a ``fit`` failed: its ``error:`` line, else the last line of stderr."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("error:"):
            return line
    return lines[-1] if lines else f"exit status {returncode}, nothing on stderr"


# ---------------------------------------------------------------------------------------------- launching


def machine_cores() -> int:
    """CPU cores this process may use (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _shown(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def fit_command(
    sweep: Sweep, run: Run, threads: int | None, ckpt: Path | None, extra: list[str], python: str
) -> list[str]:
    """The ``fit`` command line of a run (paths relative to ``root``, where it runs)."""
    cmd = [python, "-m", "fl_lightning", "fit"]
    for f in (*sweep.base, *run.row.configs):
        cmd.append(f"--config={f}")
    cmd.append("--trainer.enable_progress_bar=false")
    cmd += [*sweep.args, *run.row.args, *extra]
    if threads is not None:
        cmd.append(f"--model.threads_per_process={threads}")
    cmd += [f"--seed_everything={run.seed}", f"--trainer.default_root_dir={_shown(run.folder, sweep.root)}"]
    if ckpt is not None:
        cmd.append(f"--ckpt_path={_shown(ckpt, sweep.root)}")
    return cmd


def runs_of(sweep: Sweep) -> list[Run]:
    return [Run(r, s, sweep.out / r.name / f"seed{s}") for r in sweep.rows for s in sweep.seeds]


def expect(sweep: Sweep, runs: list[Run], extra: list[str], build: bool = True) -> list[Run]:
    """``runs`` with what each resolves to now, parsed as ``fit`` parses them (before anything starts).

    A row whose arguments ``fit`` would refuse (an unknown option, a value out of range, a config file
    that does not parse) stops the sweep here with ``fit``'s one line, naming the row. With ``build``, the
    model and data module of each row's first run are built too (their own checks; a pretrained network
    is fetched as ``fit`` would fetch it).
    """
    resolve = resolver(sweep.root)
    out: list[Run] = []
    resolved: dict[str, dict[str, Any]] = {}  # per row: its runs differ only in the seed (and folder)
    for run in runs:
        if run.row.name not in resolved:
            args = fit_command(sweep, run, None, None, extra, "python")[4:]
            try:
                resolved[run.row.name] = resolve(args, build)
            except ConfigError as err:
                raise ConfigError(f"{sweep.path}: row {run.row.name} (seed {run.seed}): {err}") from None
        config = {**copy.deepcopy(resolved[run.row.name]), "seed_everything": run.seed}
        steps = (config.get("trainer") or {}).get("max_steps")
        if not isinstance(steps, int) or steps < 1:
            raise ConfigError(
                f"{sweep.path}: row {run.row.name}: trainer.max_steps={steps!r}; a sweep's runs need rounds"
            )
        out.append(replace(run, expected=Expected(config_digest(config), steps, config)))
    return out


def resolver(root: Path) -> Callable[[list[str], bool], dict[str, Any]]:
    """``fit``'s parser, built once, as a function of a run's arguments (relative paths from ``root``)."""
    from fl_lightning.cli import resolver as fit_resolver

    with _in_folder(root):
        resolve = fit_resolver()

    def in_root(args: list[str], check: bool) -> dict[str, Any]:
        with _in_folder(root):
            return resolve(args, check)

    return in_root


@contextlib.contextmanager
def _in_folder(folder: Path) -> Iterator[None]:
    before = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def run_state(run: Run) -> RunState:
    """:func:`inspect_run` of a run against what it resolves to (:func:`expect` first)."""
    assert run.expected is not None, "expect() the runs first"
    return inspect_run(run.folder, run.expected)


def _say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _final_text(summary: dict[str, Any]) -> str:
    m = str(summary.get("metric", "acc"))
    name = {"acc": "acc", "o_f1": "O-F1"}.get(m, m)
    final, best = summary.get(f"final_global_{m}"), summary.get(f"best_global_{m}")
    if final is None:
        return "no global metric"
    return f"final {name} {100 * final:.2f}%" + ("" if best is None else f" (best {100 * best:.2f}%)")


@dataclass
class _Active:
    run: Run
    index: int
    proc: subprocess.Popen
    start: float
    err_path: Path
    err_offset: int
    command: list[str]


class _StopError(Exception):
    """SIGTERM while runs are active: stop them as on Ctrl-C."""


def execute(
    sweep: Sweep, runs: list[Run], jobs: int, threads: int, extra: list[str]
) -> tuple[dict[Run, str], bool]:
    """Run what is not finished, ``jobs`` at a time; returns the outcomes and whether it was interrupted.

    Outcomes: ``skipped``, ``done``, ``failed: <line>``. Ctrl-C (or SIGTERM) stops the active runs (they
    resume from their last checkpoint on the next start).
    """
    outcome: dict[Run, str] = {}
    pending = list(enumerate(runs, 1))
    active: list[_Active] = []
    width = len(str(len(runs)))
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: Any) -> None:
        raise _StopError

    signal.signal(signal.SIGTERM, on_term)
    try:
        while pending or active:
            while pending and len(active) < jobs:
                index, run = pending.pop(0)
                tag = f"[{index:>{width}}/{len(runs)}]"
                state = run_state(run)
                if state.kind == "finished":
                    outcome[run] = "skipped"
                    _say(f"{tag} skipped {run.label} (finished: {_final_text(state.summary or {})})")
                    continue
                active.append(_launch(sweep, run, index, state, threads, extra, env, tag))
            time.sleep(0.05)
            for a in [a for a in active if a.proc.poll() is not None]:
                active.remove(a)
                outcome[a.run] = _finish(sweep, a, width, len(runs))
    except (KeyboardInterrupt, _StopError):
        _stop(active)
        return outcome, True
    except BaseException:
        _stop(active)  # no run outlives the sweep
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    return outcome, False


def _launch(
    sweep: Sweep, run: Run, index: int, state: RunState, threads: int, extra: list[str], env: dict, tag: str
) -> _Active:
    run.folder.mkdir(parents=True, exist_ok=True)
    assert run.expected is not None
    # the record of this start (the previous start's goes): what it runs, the digest of its config
    _write_marker(run.folder, {"config_digest": run.expected.digest, "max_steps": run.expected.max_steps})
    cmd = fit_command(sweep, run, threads, state.ckpt, extra, sys.executable)
    shown = shlex.join(["python", *cmd[1:]])
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    out_path, err_path = run.folder / "fit.log", run.folder / "fit.err"
    with open(out_path, "a") as f:
        f.write(f"# {stamp} sweep: (cd {sweep.root} && {shown})\n")
    offset = err_path.stat().st_size if err_path.exists() else 0
    stdout, stderr = open(out_path, "a"), open(err_path, "a")  # noqa: SIM115 (the child holds them)
    try:
        proc = subprocess.Popen(cmd, cwd=sweep.root, env=env, stdout=stdout, stderr=stderr)
    finally:
        stdout.close()
        stderr.close()
    if state.kind == "resume" and state.ckpt is not None:
        _say(f"{tag} resume  {run.label} from {_shown(state.ckpt, run.folder)} ({state.why})")
    elif state.kind == "rerun":
        _say(f"{tag} rerun   {run.label} ({state.why}; the run there is kept)")
    else:
        _say(f"{tag} start   {run.label}")
    return _Active(run, index, proc, time.monotonic(), err_path, offset, cmd)


def _finish(sweep: Sweep, a: _Active, width: int, total: int) -> str:
    tag = f"[{a.index:>{width}}/{total}]"
    rc = a.proc.returncode
    seconds = time.monotonic() - a.start
    with open(a.err_path) as f:
        f.seek(a.err_offset)
        stderr = f.read()
    marker: dict[str, Any] = {
        "command": a.command[1:],
        "returncode": rc,
        "seconds": round(seconds, 1),
        **({} if a.run.expected is None else {"config_digest": a.run.expected.digest}),
    }
    if rc == 0:
        versions = [v for v in _versions(a.run.folder) if (v / "summary.json").is_file()]
        summary = _read_json(versions[-1] / "summary.json") if versions else None
        if summary is None:
            rc = marker["returncode"] = 1
            stderr = (
                "error: fit exited 0 but wrote no summary.json under "
                f"{_shown(a.run.folder, sweep.root)}/lightning_logs (does a config set trainer.logger?)"
            )
        else:
            marker["version"] = versions[-1].name
            _write_marker(a.run.folder, marker)
            _say(f"{tag} done    {a.run.label}: {_final_text(summary)}, {seconds:.0f} s")
            return "done"
    line = error_line(stderr, rc)
    marker["error"] = line
    _write_marker(a.run.folder, marker)
    _say(f"{tag} failed  {a.run.label}: {line} (log: {_shown(a.err_path, sweep.root)})")
    return f"failed: {line}"


def _write_marker(folder: Path, marker: dict[str, Any]) -> None:
    tmp = folder / f".{MARKER}.tmp"
    tmp.write_text(json.dumps(marker, indent=2))
    os.replace(tmp, folder / MARKER)


def _stop(active: list[_Active]) -> None:
    """Stop the active runs: SIGINT (Lightning stops after the round), then SIGTERM, then SIGKILL."""
    for a in active:
        if a.proc.poll() is None:
            a.proc.send_signal(signal.SIGINT)
    deadline = time.monotonic() + 20
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for a in active:
            try:
                a.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                a.proc.send_signal(sig)
        deadline = time.monotonic() + 10
    for a in active:
        a.proc.wait()
    _say(f"interrupted: {len(active)} run(s) stopped; start the sweep again to resume them from last.ckpt")


# ---------------------------------------------------------------------------------------------- the table


@dataclass
class RowResult:
    """A row's runs: the finished ones' data, and the failed and missing seeds."""

    row: Row
    data: list[RunData]
    failed: list[tuple[int, str]]
    missing: list[int]


def collect(sweep: Sweep, runs: list[Run], outcome: dict[Run, str] | None = None) -> list[RowResult]:
    """Read every run folder of the selected rows (``outcome``: what this start saw fail)."""
    outcome = outcome or {}
    results: dict[str, RowResult] = {}
    for run in runs:
        res = results.setdefault(run.row.name, RowResult(run.row, [], [], []))
        state = run_state(run)
        said = outcome.get(run, "")
        if state.kind == "finished" and state.version is not None:
            res.data.append(RunData(state.version, state.summary or {}, sweep.target))
        elif said.startswith("failed: "):
            res.failed.append((run.seed, said.removeprefix("failed: ")))
        elif state.error:  # its last start failed (a start removes the previous record)
            res.failed.append((run.seed, state.error))
        else:
            res.missing.append(run.seed)
    return list(results.values())


def machines(results: list[RowResult]) -> str:
    """The machines the runs computed on (summary.json's ``machine``), ``; ``-joined; empty if unrecorded."""
    seen = {machine_text(d.summary.get("machine")) for r in results for d in r.data}
    return "; ".join(sorted(seen - {""}))


def _mean_std(values: list[float]) -> tuple[float, float | None]:
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


@dataclass
class Cell:
    """A column's value for a row: mean, std (None for one value) and how many runs had it."""

    mean: float | None
    std: float | None
    n: int
    of: int

    def text(self, digits: int) -> str:
        if self.mean is None:
            return "-"
        s = f"{self.mean:.{digits}f}"
        if self.std is not None:
            s += f" ± {self.std:.{digits}f}"
        if self.n < self.of:
            s += f" ({self.n} of {self.of})"
        return s


def cells(sweep: Sweep, result: RowResult) -> dict[str, Cell]:
    out = {}
    for col in sweep.columns:
        values = [v for v in (col.read(d) for d in result.data) if v is not None]
        mean, std = _mean_std(values) if values else (None, None)
        out[col.key] = Cell(mean, std, len(values), len(result.data))
    return out


def _shown_columns(sweep: Sweep, results: list[RowResult]) -> list[Column]:
    if not sweep.auto_client:
        return sweep.columns
    has_client = any(_client(d) is not None for r in results for d in r.data)
    return [c for c in sweep.columns if c.key != "client" or has_client]


def _paper_labels(results: list[RowResult]) -> list[str]:
    labels: list[str] = []
    for r in results:
        for k in r.row.paper:
            if k not in labels:
                labels.append(k)
    return labels


def _paper_text(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def _runs_text(r: RowResult) -> str:
    text = str(len(r.data))
    notes = [f"{len(r.failed)} failed"] * bool(r.failed) + [f"{len(r.missing)} missing"] * bool(r.missing)
    return text + (f" ({', '.join(notes)})" if notes else "")


def _metric(results: list[RowResult]) -> str:
    metrics = {d.metric for r in results for d in r.data}
    if len(metrics) == 1:
        return {"acc": "acc", "o_f1": "O-F1"}.get(next(iter(metrics)), next(iter(metrics)))
    return "metric"


def _header(col: Column, sweep: Sweep, metric: str) -> str:
    target = "-" if sweep.target is None else f"{sweep.target[1]:g}"
    return col.label.format(m=metric, target=target)


def markdown(sweep: Sweep, results: list[RowResult]) -> str:
    """The results table in Markdown, with a legend, the failed runs and the sweep's notes."""
    columns = _shown_columns(sweep, results)
    papers = _paper_labels(results)
    metric = _metric(results)
    head = [*sweep.axes, "seeds", *(_header(c, sweep, metric) for c in columns)]
    head += [f"paper {p}".strip() for p in papers]
    lines = [f"# {sweep.name}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        row_cells = cells(sweep, r)
        values = [*r.row.keys, _runs_text(r), *(row_cells[c.key].text(c.digits) for c in columns)]
        values += [_paper_text(r.row.paper.get(p)) for p in papers]
        lines.append("| " + " | ".join(values) + " |")
    tag = (sweep.target[0] if sweep.target else None) or f"global/{metric}"
    lines += ["", f"Mean ± sample standard deviation over seeds {list(sweep.seeds)}."]
    computed_on = machines(results)
    if computed_on:
        lines[-1] += f" Computed with {computed_on}."
    lines.append("")
    lines.append("- seeds: the row's finished runs")
    lines += [
        f"- {_header(c, sweep, metric)}: {c.legend.format(m=metric, tag=tag)}" for c in columns if c.legend
    ]
    failed = [(r.row.name, seed, line) for r in results for seed, line in r.failed]
    if failed:
        lines += ["", "Failed runs:", ""] + [f"- {name} seed {seed}: {line}" for name, seed, line in failed]
    if sweep.notes:
        lines += ["", sweep.notes]
    return "\n".join(lines) + "\n"


def csv_rows(sweep: Sweep, results: list[RowResult]) -> tuple[list[str], list[dict[str, Any]]]:
    """The CSV's header and rows: row, axes, run counts, mean/std/n per column, the paper's values."""
    papers = _paper_labels(results)
    axes = [] if sweep.axes == ("row",) else list(sweep.axes)
    header = ["row", *axes, "seeds", "failed", "missing"]
    for c in sweep.columns:
        header += [f"{c.key}_mean", f"{c.key}_std", f"{c.key}_n"]
    header += [f"paper_{p}" if p else "paper" for p in papers]
    header.append("machine")
    rows = []
    for r in results:
        entry: dict[str, Any] = {"row": r.row.name, "seeds": len(r.data), "failed": len(r.failed)}
        entry["missing"] = len(r.missing)
        entry.update(zip(axes, r.row.keys, strict=False))
        for key, cell in cells(sweep, r).items():
            entry[f"{key}_mean"] = "" if cell.mean is None else repr(cell.mean)
            entry[f"{key}_std"] = "" if cell.std is None else repr(cell.std)
            entry[f"{key}_n"] = cell.n
        for p in papers:
            entry[f"paper_{p}" if p else "paper"] = r.row.paper.get(p, "")
        entry["machine"] = machines([r])
        rows.append(entry)
    return header, rows


def write_tables(sweep: Sweep, results: list[RowResult], out: Path) -> str:
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(sweep, results)
    (out / "results.md").write_text(text)
    header, rows = csv_rows(sweep, results)
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header)
        writer.writeheader()
        writer.writerows(rows)
    return text


# ---------------------------------------------------------------------------------------------- --check


def compare(sweep: Sweep, results: list[RowResult], stored: Path) -> list[tuple[str, bool, str]]:
    """Each row against the stored CSV: ``(row, match, detail)``.

    A value matches when it prints the same (the column's digits) or differs by at most
    ``check.tolerance``; means, standard deviations and the number of runs are compared. A row whose
    stored runs had failed matches only if as many fail again (a run that diverges reproducibly is part of
    the result). A mismatch on another machine than the stored table's (its ``machine`` column: torch,
    CPU kernels or GPU, threads) says so: the same config and seed need not give the same floats there.
    """
    try:
        with open(stored, newline="") as f:
            table = {r["row"]: r for r in csv.DictReader(f)}
    except (OSError, KeyError, csv.Error) as err:
        raise ConfigError(f"check.table {stored}: cannot read it as a results.csv ({err})") from None
    names = sweep.check_columns or tuple(c.key for c in sweep.columns if c.checked)
    columns = [c for c in sweep.columns if c.key in names]
    out = []
    for r in results:
        old = table.get(r.row.name)
        if old is None:
            out.append((r.row.name, False, "no such row in the stored table"))
            continue
        problems = []
        if r.missing or str(len(r.failed)) != old.get("failed", "0"):
            # a run that failed in the stored table too (a divergence) is part of the result it reproduces
            problems.append(f"runs {_runs_text(r)} (stored {old.get('seeds')}, {old.get('failed')} failed)")
        now = cells(sweep, r)
        for col in columns:
            if f"{col.key}_mean" not in old:
                problems.append(f"{col.key}: not in the stored table")
                continue
            cell = now[col.key]
            if str(cell.n) != old.get(f"{col.key}_n", str(cell.n)):
                problems.append(f"{col.key}: {cell.n} runs have it (stored {old[f'{col.key}_n']})")
            for part, value in (("mean", cell.mean), ("std", cell.std)):
                text = old.get(f"{col.key}_{part}", "")
                before = float(text) if text else None
                if not _same(value, before, col.digits, sweep.tolerance):
                    problems.append(
                        f"{col.key} {part} {_num(value, col.digits)} (stored {_num(before, col.digits)})"
                    )
        stored_on, now_on = old.get("machine") or "", machines([r])
        if problems and stored_on and now_on and stored_on != now_on:
            problems.append(f"stored on {stored_on}, run on {now_on}: float results differ across machines")
        out.append((r.row.name, not problems, "; ".join(problems)))
    return out


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _same(a: float | None, b: float | None, digits: int, tolerance: float) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return _num(a, digits) == _num(b, digits) or abs(a - b) <= tolerance


# ---------------------------------------------------------------------------------------------- main


class _Parser(argparse.ArgumentParser):
    """Option errors are one ``error:`` line (no usage block), like every other bad input."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"sweep: {message} (python -m fl_lightning sweep --help)")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m fl_lightning sweep",
        description="A grid of fit runs over seeds from one YAML file, N at a time, with a results table. "
        "The sweep file's schema: python -c 'import fl_lightning.sweep as s; help(s)' or README, 'Sweeps'.",
        usage="%(prog)s SWEEP.yaml [options] [-- FIT ARGUMENTS]",
    )
    parser.add_argument("sweep", help="the sweep file (YAML)")
    parser.add_argument("--jobs", type=int, default=None, help="runs at a time (default: jobs: or the cores)")
    parser.add_argument(
        "--threads", type=int, default=None, help="threads per run (default: threads: or cores // jobs, >= 1)"
    )
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: out: of the file)")
    parser.add_argument(
        "--rows", nargs="+", default=None, metavar="PATTERN", help="rows to run (shell patterns)"
    )
    parser.add_argument(
        "--seeds", nargs="+", type=int, default=None, help="seeds (default: seeds: of the file)"
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--report", action="store_true", help="run nothing; write the table of what is there")
    mode.add_argument(
        "--print-commands", action="store_true", help="print one fit command per run still to do; run nothing"
    )
    mode.add_argument(
        "--check",
        action="store_true",
        help="re-run the rows into a fresh folder, compare with the stored table",
    )
    return parser


def _select(sweep: Sweep, patterns: list[str] | None) -> None:
    if not patterns:
        return
    for p in patterns:
        if not any(fnmatch.fnmatchcase(r.name, p) for r in sweep.rows):
            names = ", ".join(r.name for r in sweep.rows[:8]) + (", ..." if len(sweep.rows) > 8 else "")
            raise ConfigError(f"--rows {p}: matches no row (rows: {names})")
    sweep.rows = [r for r in sweep.rows if any(fnmatch.fnmatchcase(r.name, p) for p in patterns)]


def _print_commands(sweep: Sweep, runs: list[Run], threads: int | None, extra: list[str]) -> int:
    todo = 0
    prefix = "" if Path.cwd().resolve() == sweep.root else f"cd {shlex.quote(str(sweep.root))} && "
    env = f"OMP_NUM_THREADS={threads} " if threads is not None else ""
    for run in runs:
        state = run_state(run)
        if state.kind == "finished":
            continue
        todo += 1
        _say(prefix + env + shlex.join(fit_command(sweep, run, threads, state.ckpt, extra, "python")))
    sys.stderr.write(
        f"# {todo} of {len(runs)} runs to do; then: python -m fl_lightning sweep {sweep.path} --report\n"
    )
    return 0


def run_sweep(argv: list[str]) -> int:
    """``python -m fl_lightning sweep``; returns the exit status (bad input raises :class:`ConfigError`)."""
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    args = _parser().parse_args(argv)
    sweep = load_sweep(args.sweep)
    _select(sweep, args.rows)
    if args.seeds is not None:
        if not args.seeds or min(args.seeds) < 0 or len(set(args.seeds)) != len(args.seeds):
            raise ConfigError(f"--seeds {args.seeds}: give distinct integers >= 0")
        sweep.seeds = tuple(args.seeds)
    for flag, value in (("--jobs", args.jobs), ("--threads", args.threads)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag}={value} must be >= 1")
    _args(extra, "arguments after --")
    if args.out is not None:
        sweep.out = args.out.resolve()
    elif args.check:
        sweep.out = Path(tempfile.mkdtemp(prefix=f"fl_lightning-check-{sweep.name}-"))
    if args.check and (sweep.check_table is None or not sweep.check_table.is_file()):
        raise ConfigError(
            f"{sweep.path}: no stored table {sweep.check_table} to check against; run the sweep and copy its "
            "results.csv there (or set check.table)"
        )
    runs = expect(sweep, runs_of(sweep), extra)
    explicit_threads = args.threads or sweep.threads
    if args.print_commands:
        return _print_commands(sweep, runs, explicit_threads, extra)
    outcome: dict[Run, str] = {}
    interrupted = False
    if not args.report:
        cores = machine_cores()
        jobs = args.jobs or sweep.jobs or cores
        threads = explicit_threads or max(1, cores // jobs)
        note = " (more threads than cores: oversubscribed)" if jobs * threads > cores else ""
        _say(
            f"sweep {sweep.name}: {len(sweep.rows)} rows x {len(sweep.seeds)} seeds = {len(runs)} runs in "
            f"{_shown(sweep.out, Path.cwd().resolve())}, {jobs} at a time, {threads} thread(s) each on "
            f"{cores} cores{note}"
        )
        outcome, interrupted = execute(sweep, runs, jobs, threads, extra)
    results = collect(sweep, runs, outcome)
    text = write_tables(sweep, results, sweep.out)
    _say("\n" + text)
    _say(f"written to {_shown(sweep.out / 'results.md', Path.cwd().resolve())} and results.csv")
    if interrupted:
        return 130
    status = 1 if any(r.failed or r.missing for r in results) else 0
    if args.check:
        assert sweep.check_table is not None
        mismatches = 0
        for name, ok, detail in compare(sweep, results, sweep.check_table):
            mismatches += not ok
            _say(f"{'match   ' if ok else 'MISMATCH'} {name}" + (f": {detail}" if detail else ""))
        _say(f"check against {sweep.check_table}: {len(results) - mismatches} of {len(results)} rows match")
        status = 1 if mismatches else 0  # failed runs the stored table has too are a match
    return status


def main(argv: list[str]) -> None:
    """Entry point of ``python -m fl_lightning sweep``: bad input is one ``error:`` line (exit 2)."""
    try:
        status = run_sweep(argv)
    except ConfigError as err:
        sys.stderr.write(f"error: {err}\n")
        raise SystemExit(2) from None
    raise SystemExit(status)
