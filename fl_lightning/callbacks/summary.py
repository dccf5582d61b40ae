"""The end-of-run summary: rounds, best and final global metric, client spread, time, bytes.

Written when ``fit`` ends, and also when it is interrupted (an exception, Ctrl-C, SIGTERM) after at
least one round of the run: then ``summary.json`` covers the rounds done and says why it stopped.
The run's hyperparameters and its summary numbers also go to TensorBoard's HPARAMS tab.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.core.saving import save_hparams_to_yaml
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException

from fl_lightning.callbacks.results import (
    CLIENTS_FILE,
    CURVES_FILE,
    clients_table,
    curves,
    group_fields,
    outcome_fields,
    read_history,
    write_csv,
)
from fl_lightning.engine.record import RoundRecord, totals
from fl_lightning.engine.round import Engine
from fl_lightning.functional.outcomes import client_spread
from fl_lightning.runs import machine_text

log = logging.getLogger("fl_lightning")

#: Config fields that change how a run executes or where it writes, not what it trains: left out of
#: the HPARAMS tab (they would only add columns).
EXECUTION_FIELDS = frozenset(
    {
        "data.root",
        "data.download",
        "data.eval_batch_size",
        "model.eval_clients_every",
        "model.eval_fraction",
        "model.runtime",  # how the run executes (state store, threads, compile, vectorise)
    }
)


class FederatedSummary(Callback):
    """Logs a short end-of-run summary and writes it to ``<log_dir>/summary.json``.

    Reports rounds, best and final global accuracy (O-F1 for multilabel tasks, which have no
    accuracy), the spread of the same metric per client for the deployed (global or personalised)
    model, wall time and bytes communicated down and up. Keys: ``final_global_<m>``,
    ``best_global_<m>``, ``client_<m>`` with ``<m>`` = ``metric`` (``acc`` or ``o_f1``), the
    strategy's last reported scalars under their own keys (``privacy/epsilon``, ... with the
    :class:`~fl_lightning.strategies.DP` plug-in), how ``model.runtime.vectorize`` ran (``vectorize/batched``,
    ``vectorize/speedup``, ``vectorize/group_size``, ``vectorize/fused_sgd``: see
    :mod:`fl_lightning.engine.calibrate`), ``global_split``: the split the global
    numbers are on (``"validation"`` with ``data.val_fraction > 0``, else ``"test"``; evaluate a
    checkpoint on the test set with ``test``), and ``interrupted``.

    Which round each number reports is named: ``final_global_<m>``, ``best_val_global_<m>`` (with a
    validation split) or ``best_test_global_<m>`` with ``best_test_optimistic`` (the round chosen on the test
    numbers), ``last_k_mean_global_<m>`` (the last ``last_k`` evaluations); ``best_global_<m>`` and
    ``best_round`` stay for older readers. The per-client fields (``client_global_<m>``,
    ``client_personal_<m>``, the unseen clients and Yuan et al.'s gaps, ``group_global_<m>``) are
    :func:`~fl_lightning.callbacks.results.outcome_fields` and
    :func:`~fl_lightning.callbacks.results.group_fields`; ``curves.csv`` and ``clients.csv`` are written
    beside ``summary.json``.

    A run that stops early (an exception such as every client failing, Ctrl-C, SIGTERM) still
    writes ``summary.json`` for the rounds it completed, with ``"interrupted": true`` and the
    ``reason``; its per-client spread is left out (the final model is not evaluated on the way out).
    A resumed run's numbers cover every round since the run began (the checkpoint carries the
    history): ``rounds`` counts them all, ``rounds_this_run`` those of this invocation; ``wall_time_s`` is
    this invocation's wall time and ``run_wall_time_s`` the run's over all its starts (each start up to
    the checkpoint the next one resumed from). ``max_steps`` is the ``trainer.max_steps`` the run was
    given, so a reader (the sweep) can tell a run cut short from a run that ended where it was asked to.

    Every logger also receives ``log_hyperparams(hparams, metrics)``: the run's hyperparameters
    with its summary numbers as ``summary/<key>`` scalars (at step = rounds done), so
    TensorBoard's HPARAMS tab lists one row per run.

    Args:
        hparams: The run's hyperparameters, flat ``{name: value}`` (the CLI passes its config,
            see :func:`flatten_config`); None logs the module's ``hparams`` (Lightning's
            ``save_hyperparameters``), if any.
    """

    def __init__(self, hparams: Mapping[str, Any] | None = None) -> None:
        self._start: float | None = None
        self._before = 0.0  # wall time of the run's earlier starts, up to the checkpoint resumed from
        self.hparams = dict(hparams) if hparams is not None else None
        self.summary: dict[str, Any] = {}
        #: ``curves.csv`` and ``clients.csv`` (header, rows) of the last summary, written beside it.
        self.tables: dict[str, tuple[list[str], list[dict[str, Any]]]] = {}

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._start = time.perf_counter()

    def _elapsed(self) -> float:
        return time.perf_counter() - self._start if self._start is not None else 0.0

    def state_dict(self) -> dict[str, float]:
        """The run's wall time up to this checkpoint (its earlier starts included), for a resume to add to."""
        return {"run_wall_time_s": self._before + self._elapsed()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._before = float(state_dict.get("run_wall_time_s", 0.0))

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Evaluate the final model here, while it is still on the training device: before ``on_fit_end``
        # Lightning's teardown moves the module back to the CPU (the result is cached for on_fit_end).
        if hasattr(pl_module, "final_client_metrics"):
            pl_module.final_client_metrics()

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not hasattr(pl_module, "history"):
            return
        per_client = pl_module.final_client_metrics()
        self._finish(trainer, pl_module, per_client, None)
        self._report(trainer, pl_module, trainer.log_dir)  # a collective under DDP: read on every process

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        """Summarise the rounds done when ``fit`` stops early (nothing if this run completed no round)."""
        history = getattr(pl_module, "history", None)
        if trainer.state.fn != TrainerFn.FITTING or not history:
            return
        if not any(r.this_run for r in history):
            return  # a resumed run stopped before its first round: the run's summary.json stands
        self._finish(trainer, pl_module, {}, _reason(exception))
        self._report(trainer, pl_module, _local_log_dir(trainer))  # no collective on the way out

    def _finish(
        self, trainer: Trainer, pl_module: LightningModule, per_client: dict, reason: str | None
    ) -> None:
        engine = getattr(pl_module, "engine", None)  # a FederatedModule's (this callback sits below it)
        target = engine.config.round_policy.target_accuracy if isinstance(engine, Engine) else None
        dm = getattr(trainer, "datamodule", None)
        split = getattr(dm, "val_split", "test")
        self.summary = summarize(pl_module.history, per_client, self._elapsed(), target, split=split)
        self.summary["run_wall_time_s"] = self._before + self.summary["wall_time_s"]
        self.summary["max_steps"] = trainer.max_steps
        self.summary["global_split"] = split
        self._tables(pl_module, per_client)
        self.summary["interrupted"] = reason is not None
        self.summary["machine"] = machine_info(pl_module.device, trainer.precision)
        if reason is not None:
            self.summary["reason"] = reason

    def _tables(self, pl_module: LightningModule, per_client: dict) -> None:
        """The per-client fields of the summary and the run's ``curves.csv`` and ``clients.csv``."""
        rows = read_history(pl_module.history)
        metric = self.summary["metric"]
        self.summary.update(group_fields(rows, metric))
        self.tables: dict[str, tuple[list[str], list[dict[str, Any]]]] = {CURVES_FILE: curves(rows)}
        engine = getattr(pl_module, "engine", None)
        if engine is None or not engine.clients:
            return
        personalised = getattr(pl_module, "personalised", False)
        global_per = getattr(pl_module, "client_eval_global", None) or {} if per_client else {}
        personal_per = per_client if personalised else None
        if per_client:
            weights = pl_module.eval_weights()
            train = getattr(pl_module, "client_eval_train", {})
            self.summary.update(
                outcome_fields(metric, global_per, personal_per, train, engine.unseen, weights)
            )
        self.tables[CLIENTS_FILE] = clients_table(pl_module, rows, metric, global_per, personal_per)

    @rank_zero_only
    def _report(self, trainer: Trainer, pl_module: LightningModule, log_dir: str | None) -> None:
        s = self.summary
        m = s.get("metric", "acc")
        name = {"acc": "accuracy", "o_f1": "O-F1"}.get(m, m)
        title = "fl_lightning summary" + (f" (interrupted: {s['reason']})" if s.get("interrupted") else "")
        lines = [
            title,
            f"  rounds: {s['rounds']} (this run: {s['rounds_this_run']})",
            f"  global {name} ({s.get('global_split', 'test')} split): " + _rounds_text(s, m),
        ]
        groups = s.get(f"group_global_{m}")
        if groups:
            lines.append(
                f"  per group (global/{m} is their union): "
                + ", ".join(f"group {g} {_pct(v)}" for g, v in groups.items())
            )
        for key, what in ((f"client_global_{m}", "global model"), (f"client_personal_{m}", "personalised")):
            spread = s.get(key)
            if spread:
                lines.append(f"  per-client {name}, {what} ({spread['n']} clients): " + _spread_text(spread))
        if "unseen_clients" in s:
            lines.append("  " + _gaps_text(s, m))
        reported = sorted(k for k in s if "/" in k)  # the strategy's scalars (privacy/epsilon, ...)
        if reported:
            lines.append("  " + ", ".join(f"{k}: {s[k]:.4g}" for k in reported))
        wall = f"  wall time: {s['wall_time_s']:.1f} s ({s['mean_round_s']:.3f} s/round)"
        if s["rounds_this_run"] < s["rounds"]:  # a resumed run: its starts together
            wall += f"; {s['run_wall_time_s']:.1f} s over all the run's starts"
        lines.append(wall)
        if "sim_time_s" in s:
            sim = f"  simulated time: {s['sim_time_s']:.6g} s"
            if "sim_target" in s:
                reached = s.get("sim_time_to_target_s")
                sim += f" ({_pct(s['sim_target'])} {name} " + (
                    f"after {reached:.6g} s)" if reached is not None else "not reached)"
                )
            lines.append(sim)
            fates = ("late_clients", "partial_clients", "discarded_clients", "dropped_out")
            if any(s.get(k) for k in fates):  # the clients' fates over all rounds
                lines.append(
                    f"  clients late: {s['late_clients']}, partial: {s['partial_clients']}, "
                    f"discarded: {s['discarded_clients']}, dropped out: {s['dropped_out']}"
                )
        if s.get("machine"):
            lines.append(f"  machine: {machine_text(s['machine'])}")
        lines.append(
            f"  communicated: {_mb(s['bytes_down'])} down, {_mb(s['bytes_up'])} up, "
            f"{_mb(s['bytes_total'])} total"
        )
        if log_dir:
            path = Path(log_dir) / "summary.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(s, indent=2))
            for name, (header, rows) in self.tables.items():
                write_csv(path.parent / name, header, rows)
            lines.append(f"  written to {path} (and {', '.join(self.tables) or 'no tables'})")
        if s.get("interrupted"):
            last = _last_checkpoint(trainer)
            if last:
                lines.append(f"  resume: --ckpt_path {last} (with trainer.max_steps as before)")
        log.info("\n".join(lines))
        self._log_hyperparams(trainer, pl_module)

    def _log_hyperparams(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """The run's hyperparameters and its summary numbers, for TensorBoard's HPARAMS tab."""
        params = self.hparams
        if params is None:  # from Python: the module's and data module's arguments, as the CLI's config
            data = getattr(trainer.datamodule, "hparams", None) or {}
            model = dict(getattr(pl_module, "hparams", None) or {})
            params = flatten_config({"model": model, "data": dict(data)})
        metrics = hparam_metrics(self.summary)
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                log_hparams_tab(logger, params, metrics, self.summary["rounds"])
                # Lightning writes hparams.yaml only if there is none yet (a resumed run has one)
                save_hparams_to_yaml(Path(logger.log_dir) / logger.NAME_HPARAMS_FILE, logger.hparams)
            else:
                logger.log_hyperparams(params, metrics, step=self.summary["rounds"])


def machine_info(device: torch.device, precision: str | None = None) -> dict[str, Any]:
    """Where and how a run computed: torch's version, the device, its CPU kernels or GPU name, intra-op
    threads, and the precision that ran (``trainer.precision`` after Lightning resolved it: ``16-mixed``
    asked for on a CPU runs as ``bf16-mixed``).

    ``cpu_kernels`` is the instruction set torch dispatches its CPU kernels for
    (``torch.backends.cpu.get_cpu_capability()``: ``AVX512``, ``AVX2``, ...; ``ATEN_CPU_CAPABILITY``
    lowers it): runs of one config and seed agree bit for bit only on the same kernels, thread count and
    precision.
    """
    out: dict[str, Any] = {"torch": torch.__version__, "device": device.type}
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
    else:
        out["cpu_kernels"] = torch.backends.cpu.get_cpu_capability()
    out["threads"] = torch.get_num_threads()
    if precision is not None:
        out["precision"] = str(precision)
    return out


#: Hyperparameters TensorBoard's HPARAMS tab shows as columns before the others (it shows five at first,
#: the rest by name behind a checkbox): the strategy, then its arguments.
SHOWN_FIRST = ("model.strategy",)


def log_hparams_tab(
    logger: TensorBoardLogger, params: Mapping[str, Any], metrics: Mapping[str, float], step: int
) -> None:
    """``logger.log_hyperparams(params, metrics, step)``, with the strategy's columns shown by default.

    TensorBoard's HPARAMS tab shows the first five hyperparameters of a run, those marked as differing
    across runs first, then by name: ``data.batch_size``, ``data.dataset``, ... and not ``model.strategy``.
    The experiment record written here marks ``model.strategy`` and its arguments (``model.strategy.mu``)
    that way, so they are the columns shown; the others are one click away. Otherwise as Lightning's
    ``TensorBoardLogger.log_hyperparams`` (the metrics at ``step``, ``logger.hparams`` for hparams.yaml).
    """
    from tensorboard.plugins.hparams import plugin_data_pb2
    from torch.utils.tensorboard.summary import hparams as hparams_summaries

    logger.hparams.update(params)
    logger.log_metrics(dict(metrics), step)
    flat = {k: v if isinstance(v, (bool, int, float, str)) else str(v) for k, v in params.items()}
    experiment, start, end = hparams_summaries(flat, dict(metrics))
    value = experiment.value[0]
    data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
    for info in data.experiment.hparam_infos:
        info.differs = any(info.name == k or info.name.startswith(f"{k}.") for k in SHOWN_FIRST)
    value.metadata.plugin_data.content = data.SerializeToString()
    writer = logger.experiment._get_file_writer()  # as Lightning's log_hyperparams: no public writer API
    for summary in (experiment, start, end):
        writer.add_summary(summary, step)


def hparam_metrics(summary: Mapping[str, Any]) -> dict[str, float]:
    """The summary's numbers as ``summary/<key>`` scalars (the HPARAMS tab's metric columns)."""
    m = summary.get("metric", "acc")
    keys = (
        "rounds",
        f"final_global_{m}",
        f"best_global_{m}",
        "best_round",
        "bytes_total",
        "wall_time_s",
        "sim_time_s",
        "sim_time_to_target_s",
        f"last_k_mean_global_{m}",
        f"unseen_global_{m}",
        "participation_gap",
        "out_of_sample_gap",
    )
    out = {f"summary/{k}": float(summary[k]) for k in keys if summary.get(k) is not None}
    spread = summary.get(f"client_{m}")
    if spread:
        stats = ("mean", "std", "min", "bottom10", "p10")
        out.update({f"summary/client_{m}_{k}": float(spread[k]) for k in stats if k in spread})
    out["summary/interrupted"] = float(bool(summary.get("interrupted")))
    return out


def flatten_config(
    config: Mapping[str, Any], sections: tuple[str, ...] = ("seed_everything", "model", "data")
) -> dict[str, Any]:
    """A run config as flat ``{"model.client.lr": 0.1, ...}`` hyperparameters (the HPARAMS tab's columns).

    A class given as ``{class_path, init_args}`` becomes its class name under its own key
    (``"model.strategy": "FedProx"``) and its arguments under it (``"model.strategy.mu": 0.01``).
    Only the top-level ``sections`` are kept; :data:`EXECUTION_FIELDS` are left out; lists and other
    non-scalar values become strings.
    """
    out: dict[str, Any] = {}

    def visit(prefix: str, value: Any) -> None:
        if prefix in EXECUTION_FIELDS:
            return
        if isinstance(value, Mapping) and "class_path" in value:
            out[prefix] = str(value["class_path"]).rsplit(".", 1)[-1]
            value = value.get("init_args") or {}
        if isinstance(value, Mapping):
            for k, v in value.items():
                visit(f"{prefix}.{k}", v)
        elif value is None or isinstance(value, (bool, int, float, str)):
            out[prefix] = value
        else:
            out[prefix] = str(value)

    for section in sections:
        if section in config:
            visit(section, config[section])
    return out


def _reason(exception: BaseException) -> str:
    if isinstance(exception, SIGTERMException):
        return "SIGTERM"
    if isinstance(exception, KeyboardInterrupt):
        return "KeyboardInterrupt"
    text = " ".join(str(exception).split())
    return f"{type(exception).__name__}: {text}" if text else type(exception).__name__


def _local_log_dir(trainer: Trainer) -> str | None:
    """``trainer.log_dir`` without its broadcast (a collective the other processes may never reach)."""
    if not trainer.loggers:
        return trainer.default_root_dir
    logger = trainer.loggers[0]
    return logger.log_dir if isinstance(logger, (TensorBoardLogger, CSVLogger)) else logger.save_dir


def _last_checkpoint(trainer: Trainer) -> str | None:
    for cb in trainer.checkpoint_callbacks:
        path = getattr(cb, "last_model_path", "") if isinstance(cb, ModelCheckpoint) else ""
        if path and os.path.exists(path):
            return path
    return None


#: The evaluations ``last_k_mean_global_<m>`` averages (fewer when the run has fewer).
LAST_K = 5


def summarize(
    history: list[RoundRecord],
    per_client: dict[int, dict[str, float]],
    wall_time: float,
    target: float | None = None,
    split: str = "test",
) -> dict[str, Any]:
    """The summary numbers from the per-round history and the final per-client metrics.

    With a simulated clock (``model.system``, asynchronous strategies) also ``sim_time_s``, the simulated time
    of the whole run, and with a ``target`` (``model.round_policy.target_accuracy``) ``sim_target`` and
    ``sim_time_to_target_s``, the simulated time at the end of the first round whose global metric reached it
    (None: never).
    """
    labelled = any("global/o_f1" in r.metrics for r in history)
    metric = "o_f1" if labelled and not any("global/acc" in r.metrics for r in history) else "acc"
    key = f"global/{metric}"
    scores = [(r.round, r.metrics[key]) for r in history if key in r.metrics]
    out: dict[str, Any] = {"wall_time_s": wall_time, "metric": metric, **totals(history)}
    if scores:
        best_round, best = max(scores, key=lambda t: t[1])
        out[f"final_global_{metric}"] = scores[-1][1]
        out[f"best_global_{metric}"] = best
        out["best_round"] = best_round + 1
        kind = "val" if split == "validation" else "test"
        out[f"best_{kind}_global_{metric}"] = best
        out[f"best_{kind}_round"] = best_round + 1
        if kind == "test":  # the round chosen on the numbers it reports
            out["best_test_optimistic"] = True
        last = [v for _, v in scores[-LAST_K:]]
        out[f"last_k_mean_global_{metric}"] = sum(last) / len(last)
        out["last_k"] = len(last)
    if "sim_time_s" in out and target is not None:
        out["sim_target"] = target
        hit = next((r.sim for r in history if r.sim and r.metrics.get(key, -math.inf) >= target), None)
        out["sim_time_to_target_s"] = None if hit is None else hit.time_s
    reported = next((r.strategy for r in reversed(history) if r.strategy), {})
    if reported:  # the strategy's scalars after its last reporting round, e.g. privacy/epsilon
        out.update(reported)
    vectorize = next((r.vectorize for r in reversed(history) if r.vectorize), {})
    out.update(vectorize)  # how model.runtime.vectorize ran (vectorize/batched, vectorize/speedup, ...)
    vals = [m[metric] for m in per_client.values() if metric in m]
    if vals:
        spread = client_spread(vals)
        out[f"client_{metric}"] = dict(spread, n=len(vals))
    return out


def _rounds_text(s: Mapping[str, Any], m: str) -> str:
    """The global metric's final, best-round and last-k values, each named by the round it reports."""
    parts = [f"final {_pct(s.get(f'final_global_{m}'))}"]
    if f"best_val_global_{m}" in s:
        parts.append(
            f"best on validation {_pct(s[f'best_val_global_{m}'])} (round {s.get('best_val_round')})"
        )
    if f"best_test_global_{m}" in s:
        parts.append(
            f"best on test {_pct(s[f'best_test_global_{m}'])} (round {s.get('best_test_round')}; optimistic: "
            "chosen on the test split)"
        )
    if f"last_k_mean_global_{m}" in s:
        parts.append(f"mean of the last {s['last_k']} {_pct(s[f'last_k_mean_global_{m}'])}")
    return ", ".join(parts)


def _spread_text(spread: Mapping[str, Any]) -> str:
    text = f"mean {_pct(spread['mean'])}"
    if "weighted_mean" in spread:
        text += f" (by samples {_pct(spread['weighted_mean'])})"
    text += f", std {100 * spread['std']:.2f} pts, worst {_pct(spread['min'])}"
    if "bottom10" in spread:
        text += (
            f", bottom 10% {_pct(spread['bottom10'])}, p10/p50/p90 {_pct(spread['p10'])}/"
            f"{_pct(spread['p50'])}/{_pct(spread['p90'])}, top 10% {_pct(spread['top10'])}"
        )
    return text + f", best {_pct(spread['max'])}"


def _gaps_text(s: Mapping[str, Any], m: str) -> str:
    """Unseen clients and Yuan et al.'s gaps, in points (None: not known)."""

    def pts(v: float | None) -> str:
        return "n/a" if v is None else f"{100 * v:+.2f} pts"

    text = (
        f"unseen clients ({s['unseen_clients']}): global {_pct(s.get(f'unseen_global_{m}'))}; "
        f"participation gap {pts(s.get('participation_gap'))} (participating - unseen, test data), "
        f"out-of-sample gap {pts(s.get('out_of_sample_gap'))} (participating: train - test)"
    )
    if f"unseen_personal_{m}" in s:
        text += (
            f"; personalised: unseen {_pct(s.get(f'unseen_personal_{m}'))}, participation gap "
            f"{pts(s.get('participation_gap_personal'))}"
        )
    return text


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.2f}%"


def _mb(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"
