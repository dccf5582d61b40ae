"""The sweep file: its schema, parsed and checked into a :class:`Sweep` of rows, seeds and runs."""

from __future__ import annotations

import difflib
import itertools
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fl_lightning.errors import ConfigError
from fl_lightning.sweep.columns import (
    COLUMNS,
    CUSTOM_KEYS,
    DEFAULT_COLUMNS,
    Column,
    clock_column,
    custom_column,
    spec_alias,
)

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


#: ``fit`` options the sweep sets itself (per run); a sweep file must not set them in ``args``.
OWNED = ("--config", "--seed_everything", "--trainer.default_root_dir", "--ckpt_path")


_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+=-]*$")


#: Where a sweep's runs go unless its file says ``out:`` (relative: to the folder the sweep starts in).
DEFAULT_OUT = Path("lightning_logs", "sweeps")


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


def check_keys(mapping: dict[str, Any], known: tuple[str, ...], where: str) -> None:
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


def fit_args(value: Any, where: str) -> tuple[str, ...]:
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
                check_keys(entry, AXIS_KEYS, place)
                configs = _strings(entry.get("config"), f"{place}.config")
                _check_files(configs, root, place)
                options.append((name, configs, fit_args(entry.get("args"), f"{place}.args")))
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
        check_keys(entry, ROW_KEYS, where)
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
                args=fit_args(entry.get("args"), f"{where}.args"),
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
    check_keys(c, TOP_KEYS, "sweep file")
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
    check_keys(check, CHECK_KEYS, "check")
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
        args=fit_args(c.get("args"), "args"),
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
        check_keys(value, ("tag", "value"), "target")
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
            check_keys(spec, CUSTOM_KEYS, f"columns[{i}]")
            out.append(custom_column(spec, f"columns[{i}]"))
        elif isinstance(spec, str) and clock_column(spec, f"columns[{i}]") is not None:
            out.append(clock_column(spec, f"columns[{i}]"))  # type: ignore[arg-type]
        elif isinstance(spec, str) and spec_alias(spec) in COLUMNS:
            spec = spec_alias(spec)
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


def shown(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def runs_of(sweep: Sweep) -> list[Run]:
    return [Run(r, s, sweep.out / r.name / f"seed{s}") for r in sweep.rows for s in sweep.seeds]
