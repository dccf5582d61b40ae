"""A run's folder against the run the sweep would start now: finished, resume, rerun, failed or new."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fl_lightning.errors import ConfigError
from fl_lightning.runs import run_number
from fl_lightning.sweep.spec import Expected

MARKER = "sweep.json"


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


def run_versions(folder: Path) -> list[Path]:
    found = [v for v in (folder / "lightning_logs").glob("version_*") if run_number(v) is not None]
    return sorted(found, key=lambda v: run_number(v) or 0)


def read_json(path: Path) -> dict[str, Any] | None:
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
    "name",
    "ckpt_path",
    "weights_only",
    "trainer.default_root_dir",
    "trainer.enable_progress_bar",
    "trainer.max_steps",
    "model.runtime.threads_per_process",
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
    from fl_lightning.config.legacy import (  # (imports the data package: only when digesting)
        policy_defaults,
        runtime_defaults,
        upgrade_config,
    )

    flat = flat_config(upgrade_config(config))  # a run's config.yaml may spell its dataset the former way
    # The round policy and the runtime at their defaults are the run without them (a config.yaml from before
    # model.round_policy has none, or only some of its fields inside model.system; one from before
    # model.runtime has its fields at the model's level, which upgrade_config moved there).
    default = {**policy_defaults(), **runtime_defaults()}
    flat = {k: v for k, v in flat.items() if not (k in default and v == default[k])}
    for section in ("model.round_policy", "model.runtime"):
        if flat.get(section, 0) in (None, {}):
            del flat[section]
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
    summary = read_json(version / "summary.json")
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
    versions = run_versions(folder)
    marker = read_json(folder / MARKER) or {}
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


def write_marker(folder: Path, marker: dict[str, Any]) -> None:
    tmp = folder / f".{MARKER}.tmp"
    tmp.write_text(json.dumps(marker, indent=2))
    os.replace(tmp, folder / MARKER)
