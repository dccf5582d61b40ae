"""The end-of-run summary: rounds, best and final global metric, client spread, time, bytes."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_only

log = logging.getLogger("fl_lightning")


class FederatedSummary(Callback):
    """Logs a short end-of-run summary and writes it to ``<log_dir>/summary.json``.

    Reports rounds, best and final global accuracy (O-F1 for multilabel tasks, which have no
    accuracy), the spread of the same metric per client for the deployed (global or personalised)
    model, wall time and bytes communicated down and up. Keys: ``final_global_<m>``,
    ``best_global_<m>``, ``client_<m>`` with ``<m>`` = ``metric`` (``acc`` or ``o_f1``), the
    strategy's last reported scalars under their own keys (``privacy/epsilon``, ... with the
    :class:`~fl_lightning.strategies.DP` plug-in), and ``global_split``: the split the global
    numbers are on (``"validation"`` with ``data.val_fraction > 0``, else ``"test"``; evaluate a
    checkpoint on the test set with ``test``).
    """

    def __init__(self) -> None:
        self._start: float | None = None
        self.summary: dict[str, Any] = {}

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._start = time.perf_counter()

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Evaluate the final model here, while it is still on the training device: before ``on_fit_end``
        # Lightning's teardown moves the module back to the CPU (the result is cached for on_fit_end).
        if hasattr(pl_module, "final_client_metrics"):
            pl_module.final_client_metrics()

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not hasattr(pl_module, "history"):
            return
        per_client = pl_module.final_client_metrics()
        self.summary = summarize(pl_module.history, per_client, time.perf_counter() - (self._start or 0.0))
        dm = getattr(trainer, "datamodule", None)
        self.summary["global_split"] = getattr(dm, "val_split", "test")
        self._report(trainer.log_dir)  # log_dir is a collective under DDP: read it on every process

    @rank_zero_only
    def _report(self, log_dir: str | None) -> None:
        s = self.summary
        m = s.get("metric", "acc")
        name = {"acc": "accuracy", "o_f1": "O-F1"}.get(m, m)
        lines = [
            "fl_lightning summary",
            f"  rounds: {s['rounds']} (this run: {s['rounds_this_run']})",
            f"  global {name} ({s.get('global_split', 'test')} split): "
            f"final {_pct(s.get(f'final_global_{m}'))}, "
            f"best {_pct(s.get(f'best_global_{m}'))}"
            f" (round {s.get('best_round')})",
        ]
        spread = s.get(f"client_{m}")
        if spread:
            lines.append(
                f"  per-client {name} ({spread['n']} clients): mean {_pct(spread['mean'])}, "
                f"std {100 * spread['std']:.2f} pts, min {_pct(spread['min'])}, max {_pct(spread['max'])}"
            )
        reported = sorted(k for k in s if "/" in k)  # the strategy's scalars (privacy/epsilon, ...)
        if reported:
            lines.append("  " + ", ".join(f"{k}: {s[k]:.4g}" for k in reported))
        lines.append(f"  wall time: {s['wall_time_s']:.1f} s ({s['mean_round_s']:.3f} s/round)")
        lines.append(
            f"  communicated: {_mb(s['bytes_down'])} down, {_mb(s['bytes_up'])} up, "
            f"{_mb(s['bytes_total'])} total"
        )
        if log_dir:
            path = Path(log_dir) / "summary.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(s, indent=2))
            lines.append(f"  written to {path}")
        log.info("\n".join(lines))


def summarize(
    history: list[dict], per_client: dict[int, dict[str, float]], wall_time: float
) -> dict[str, Any]:
    """The summary numbers from the per-round history and the final per-client metrics."""
    labelled = any("global/o_f1" in r for r in history) and not any("global/acc" in r for r in history)
    metric = "o_f1" if labelled else "acc"
    scores = [(r["round"], r[f"global/{metric}"]) for r in history if f"global/{metric}" in r]
    out: dict[str, Any] = {
        "rounds": len(history),
        "rounds_this_run": sum(1 for r in history if r.get("this_run", True)),
        "wall_time_s": wall_time,
        "mean_round_s": (sum(r["time_s"] for r in history) / len(history)) if history else 0.0,
        "bytes_down": sum(r["bytes_down"] for r in history),
        "bytes_up": sum(r["bytes_up"] for r in history),
        "metric": metric,
    }
    out["bytes_total"] = out["bytes_down"] + out["bytes_up"]
    if scores:
        best_round, best = max(scores, key=lambda t: t[1])
        out[f"final_global_{metric}"] = scores[-1][1]
        out[f"best_global_{metric}"] = best
        out["best_round"] = best_round + 1
    reported = next((r["strategy"] for r in reversed(history) if r.get("strategy")), {})
    if reported:  # the strategy's scalars after its last reporting round, e.g. privacy/epsilon
        out.update(reported)
    vals = [m[metric] for m in per_client.values() if metric in m]
    if vals:
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals))
        out[f"client_{metric}"] = {
            "n": len(vals),
            "mean": mean,
            "std": std,
            "min": min(vals),
            "max": max(vals),
        }
    return out


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.2f}%"


def _mb(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"
