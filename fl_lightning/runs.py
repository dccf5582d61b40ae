"""Reading finished ``fit`` runs from disk (for recipes and benchmarks): newest run, summary, scalars."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: A run folder's name: ``version_N``, or ``version_N-<label>`` (a run's ``name``: ``version_3-fedbuff``).
RUN_FOLDER = re.compile(r"version_(\d+)(?:-[\w.+=-]+)?")


def run_number(path: str | Path) -> int | None:
    """The ``N`` of a run folder ``version_N[-<label>]``; None for another name."""
    match = RUN_FOLDER.fullmatch(Path(path).name)
    return int(match.group(1)) if match else None


def latest_run(root: str | Path, with_summary: bool = False) -> Path:
    """The newest ``<root>/lightning_logs/version_<n>[-<label>]`` folder (the highest ``n``).

    With ``with_summary`` only runs that finished (wrote ``summary.json``) count.
    """
    runs = [
        v
        for v in Path(root, "lightning_logs").glob("version_*")
        if run_number(v) is not None and (not with_summary or (v / "summary.json").exists())
    ]
    if not runs:
        raise FileNotFoundError(f"no {'finished ' if with_summary else ''}run under {root}/lightning_logs")
    return max(runs, key=lambda p: run_number(p) or 0)


def read_summary(run: str | Path) -> dict[str, Any]:
    """A run folder's ``summary.json`` (written by :class:`~fl_lightning.callbacks.FederatedSummary`)."""
    return json.loads(Path(run, "summary.json").read_text())


def read_scalars(run: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every TensorBoard scalar tag of a run folder with its ``(step, value)`` pairs, in logging order.

    The step of every tag is the number of rounds done when it was logged (see README, "Reading
    TensorBoard").
    """
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run), size_guidance={"scalars": 0})
    events.Reload()
    return {t: [(e.step, e.value) for e in events.Scalars(t)] for t in events.Tags().get("scalars", [])}


def read_texts(run: str | Path) -> dict[str, list[tuple[int, str]]]:
    """Every TensorBoard text tag of a run folder (``cluster/assignment``, ``partition/counts``) with its
    ``(step, text)`` pairs, in logging order (the step: rounds done, as for scalars)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run), size_guidance={"tensors": 0})
    events.Reload()
    out: dict[str, list[tuple[int, str]]] = {}
    for tag in events.Tags().get("tensors", []):
        if events.SummaryMetadata(tag).plugin_data.plugin_name != "text":
            continue
        texts = [(e.step, b"".join(e.tensor_proto.string_val).decode()) for e in events.Tensors(tag)]
        out[tag.removesuffix("/text_summary")] = texts
    return out


def _csv_numbers(path: Path) -> list[dict[str, Any]]:
    """A CSV file's rows, numbers as floats and text kept (blank cells left out); empty if it is missing."""
    import csv

    if not path.is_file():
        return []
    out = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            parsed: dict[str, Any] = {}
            for k, v in row.items():
                if v is None or v == "":
                    continue
                try:
                    parsed[k] = float(v)
                except ValueError:
                    parsed[k] = v
            out.append(parsed)
    return out


def read_curves(run: str | Path) -> list[dict[str, float]]:
    """A run folder's ``curves.csv`` (one row per round: ``round``, ``sim_time_s``, ``wall_time_s``,
    cumulative ``bytes_*``, the metrics by tag), numbers as floats; blank cells left out; empty if none."""
    return _csv_numbers(Path(run, "curves.csv"))


def read_clients(run: str | Path) -> list[dict[str, Any]]:
    """A run folder's ``clients.csv`` (one row per client), numbers as floats; empty if none."""
    return _csv_numbers(Path(run, "clients.csv"))


def last_scalars(run: str | Path, tags: list[str]) -> dict[str, float | None]:
    """The last logged value of each TensorBoard scalar ``tag`` of a run folder (None if never logged)."""
    scalars = read_scalars(run)
    return {t: scalars[t][-1][1] if t in scalars else None for t in tags}


def machine_text(machine: Mapping[str, Any] | None) -> str:
    """A run's ``summary.json`` ``machine`` entry in words: ``torch 2.14.1, cpu (AVX2 kernels), 1 thread``
    (``, bf16-mixed precision`` when it did not run in full precision).

    Float results depend on it: the same config and seed can end elsewhere on another CPU instruction set
    (torch picks its kernels by it), thread count, precision, GPU or torch release. Empty for a run that did
    not record it (written before ``machine`` was added).
    """
    if not machine:
        return ""
    where = str(machine.get("device", "?"))
    if machine.get("gpu"):
        where += f" ({machine['gpu']})"
    elif machine.get("cpu_kernels"):
        where += f" ({machine['cpu_kernels']} kernels)"
    threads = machine.get("threads")
    count = f", {threads} thread{'s' * (threads != 1)}" if isinstance(threads, int) else ""
    precision = machine.get("precision")  # named unless full precision, the default
    mixed = f", {precision} precision" if precision and precision not in ("32-true", "32") else ""
    return f"torch {machine.get('torch', '?')}, {where}{count}{mixed}"
