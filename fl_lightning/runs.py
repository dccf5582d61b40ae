"""Reading finished ``fit`` runs from disk (for recipes and benchmarks): newest run, summary, scalars."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def latest_run(root: str | Path, with_summary: bool = False) -> Path:
    """The newest ``<root>/lightning_logs/version_<n>`` folder (the highest ``n``).

    With ``with_summary`` only runs that finished (wrote ``summary.json``) count.
    """
    runs = [
        v
        for v in Path(root, "lightning_logs").glob("version_*")
        if not with_summary or (v / "summary.json").exists()
    ]
    if not runs:
        raise FileNotFoundError(f"no {'finished ' if with_summary else ''}run under {root}/lightning_logs")
    return max(runs, key=lambda p: int(p.name.split("_")[1]))


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


def last_scalars(run: str | Path, tags: list[str]) -> dict[str, float | None]:
    """The last logged value of each TensorBoard scalar ``tag`` of a run folder (None if never logged)."""
    scalars = read_scalars(run)
    return {t: scalars[t][-1][1] if t in scalars else None for t in tags}
