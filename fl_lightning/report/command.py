"""The ``report`` subcommand: figures and ``index.html`` from a run folder or a sweep output."""

from __future__ import annotations

import argparse
import base64
import csv
import fnmatch
import html
import logging
import re
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from fl_lightning.report import figures
from fl_lightning.report.discover import Collection, RunFiles, discover

log = logging.getLogger("fl_lightning")

#: summary.json fields of the page's table: (key, header, is a fraction shown in %).
TABLE = (
    ("final_global_{m}", "final {m} (%)", True),
    ("best_val_global_{m}", "best-on-val {m} (%)", True),
    ("best_test_global_{m}", "best-on-test {m} (%, optimistic)", True),
    ("last_k_mean_global_{m}", "last-k mean {m} (%)", True),
    ("client_{m}.mean", "client mean (%)", True),
    ("client_{m}.bottom10", "client worst 10% (%)", True),
    ("client_{m}.p10", "client p10 (%)", True),
    ("unseen_global_{m}", "unseen {m} (%)", True),
    ("participation_gap", "participation gap (pts)", True),
    ("out_of_sample_gap", "out-of-sample gap (pts)", True),
    ("sim_time_s", "sim time (s)", False),
    ("bytes_total", "MiB", False),
)


#: What each figure shows, under it on the page.
CAPTIONS = {
    "curve_rounds": "The global model on the split global/* evaluates, per row: the mean over seeds of "
    "each round's curves.csv cell, the band ± the sample std (at the rounds every seed evaluated).",
    "curve_sim": "The same against the simulated clock: at each time a seed evaluated, the mean ± std "
    "of every seed's last value at or before it, up to the shortest seed's end.",
    "curve_personal": "Every client's deployed model on its local test split, merged over clients "
    "(personal/*).",
    "clients_final": "Final per-client metric of the deployed model (clients.csv), the participating "
    "clients of every seed pooled; the triangle is the mean of the worst 10%.",
    "groups": "Each client-transform group's global curve; the dashed line is global/*, their union.",
    "to_target": "Simulated time and MiB (down + up) until global/* first reached the target, mean ± std "
    "over the seeds that reached it (their count above each bar).",
    "clients_scatter": "Each client's final metric against its heterogeneity (clients.csv); open "
    "circles: unseen clients.",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m fl_lightning report",
        description="Figures (PNG, SVG) and one offline index.html from a run folder or a sweep output.",
    )
    p.add_argument("folder", type=Path, help="a run folder (summary.json), a fit root, or a sweep output")
    p.add_argument("--out", type=Path, default=None, help="where the files go (default: <folder>/report)")
    p.add_argument(
        "--clock",
        choices=("auto", "round", "sim"),
        default="auto",
        help="x-axis of the curves: rounds and, where a clock ran, simulated time (auto); or only one",
    )
    p.add_argument("--target", type=float, default=None, help="e.g. 0.8: time/bytes-to-target bars")
    p.add_argument(
        "--curve",
        nargs="+",
        default=[],
        metavar="TAG",
        help="also draw these curves.csv columns, e.g. global_train/loss (a loss as it is, accuracy in %%)",
    )
    p.add_argument(
        "--rows", nargs="+", default=None, metavar="PATTERN", help="only the rows matching, e.g. 't300/*'"
    )
    p.add_argument(
        "--facet",
        action="store_true",
        help="one panel per first segment of the row names (s0/fedavg, s50/fedavg: panels s0, s50)",
    )
    return p


def _caption(stem: str) -> str:
    """A figure's caption (a ``--curve`` column's: what its lines and bands are)."""
    if stem in CAPTIONS:
        return CAPTIONS[stem]
    clock = "simulated time" if stem.endswith("_sim") else "rounds"
    return (
        f"A curves.csv column (--curve) against {clock}, per row: the mean over seeds, the band ± the "
        "sample std."
    )


def _slug(tag: str) -> str:
    """A curves.csv column as a file name part (``global_train/loss``: ``global_train_loss``)."""
    return re.sub(r"[^A-Za-z0-9]+", "_", tag).strip("_")


def _summary_value(s: dict, key: str) -> float | None:
    value: object = s
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _cell(values: list[float], pct: bool, key: str) -> str:
    if not values:
        return "-"
    scale = 100.0 if pct else (1 / 2**20 if key == "bytes_total" else 1.0)
    m, s = figures.mean_std([scale * v for v in values])
    return f"{m:.2f} ± {s:.2f}" if len(values) > 1 else f"{m:.2f}"


def table_html(rows: dict[str, list[RunFiles]], metric: str) -> str:
    """The rows' summary numbers (mean ± sample std over seeds), columns that some row has."""
    shown = []
    for key, head, pct in TABLE:
        k = key.format(m=metric)
        if any(_summary_value(r.summary, k) is not None for runs in rows.values() for r in runs):
            shown.append((k, head.format(m=metric), pct))
    head = "".join(f"<th>{html.escape(h)}</th>" for _, h, _ in shown)
    body = []
    for row, runs in rows.items():
        cells = "".join(
            f"<td>{_cell([v for r in runs if (v := _summary_value(r.summary, k)) is not None], pct, k)}</td>"
            for k, _, pct in shown
        )
        body.append(f"<tr><th>{html.escape(row)}</th><td>{len(runs)}</td>{cells}</tr>")
    return f"<table><tr><th>row</th><th>seeds</th>{head}</tr>{''.join(body)}</table>"


def _csv_html(path: Path, patterns: Sequence[str] | None = None) -> str:
    """The CSV as a table; with ``patterns``, only the rows whose first cell (the row name) matches one."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        return ""
    if patterns:
        rows = rows[:1] + [r for r in rows[1:] if r and any(fnmatch.fnmatch(r[0], p) for p in patterns)]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in rows[0])
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_short(c))}</td>" for c in r) + "</tr>" for r in rows[1:]
    )
    return f"<div style='overflow-x:auto'><table class='wide'><tr>{head}</tr>{body}</table></div>"


def _short(text: str) -> str:
    """A number with 4 significant digits (text as it is)."""
    try:
        return f"{float(text):.4g}"
    except ValueError:
        return text


def page(
    col: Collection,
    metric: str,
    pngs: list[Path],
    problems: list[str],
    patterns: Sequence[str] | None = None,
) -> str:
    """The self-contained page: figures as data URIs, the tables, each row's config, the problems."""
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>fl_lightning report: {html.escape(col.title)}</title><style>"
        "body{font-family:sans-serif;margin:24px;max-width:1300px}img{max-width:100%;border:1px solid #ddd;"
        "margin:6px 0}table{border-collapse:collapse;font-size:13px;margin:8px 0}td,th{border:1px solid #ccc;"
        "padding:3px 7px;text-align:right}th{background:#f4f4f4}pre{background:#f7f7f7;padding:8px;"
        "font-size:12px;overflow:auto}.problem{color:#a00}.wide td{white-space:nowrap}</style></head><body>",
        f"<h1>fl_lightning report: {html.escape(col.title)}</h1>",
        f"<p>{'Sweep' if col.sweep else 'Run'} at <code>{html.escape(str(col.root))}</code>: "
        f"{len(col.rows)} row(s), {len(col.runs)} finished run(s); metric {html.escape(metric)}. "
        "Every number is read from the runs' summary.json, curves.csv and clients.csv.</p>",
    ]
    if problems:
        parts.append("<h2>Left out</h2><ul>")
        parts += [f"<li class='problem'>{html.escape(p)}</li>" for p in problems]
        parts.append("</ul>")
    parts.append("<h2>Summary</h2>" + table_html(col.rows, metric))
    results = col.root / "results.csv"
    if col.sweep and results.is_file():
        parts.append("<h3>The sweep's table (results.csv)</h3>" + _csv_html(results, patterns))
    parts.append("<h2>Figures</h2>")
    for png in pngs:
        data = base64.b64encode(png.read_bytes()).decode()
        parts.append(
            f"<figure><img alt='{html.escape(png.stem)}' src='data:image/png;base64,{data}'>"
            f"<figcaption>{html.escape(_caption(png.stem))} <i>{html.escape(png.name)}, "
            f"{html.escape(png.with_suffix('.svg').name)}</i>"
            "</figcaption></figure>"
        )
    parts.append("<h2>Configs</h2>")
    for row, runs in col.rows.items():
        text = runs[0].config_text()
        seeds = ", ".join(str(r.seed) for r in runs if r.seed is not None)
        parts.append(
            f"<details><summary>{html.escape(row)}{f' (seeds {seeds})' if seeds else ''}: "
            f"{html.escape(str(runs[0].folder))}</summary><pre>{html.escape(text or '(no config.yaml)')}"
            "</pre></details>"
        )
    parts.append("</body></html>")
    return "\n".join(parts)


def report(
    folder: Path,
    out: Path | None = None,
    clock: str = "auto",
    target: float | None = None,
    curves: Sequence[str] = (),
    rows: Sequence[str] | None = None,
    facet: bool = False,
) -> list[str]:
    """Draw the figures of ``folder`` into ``out`` and write ``index.html``; return the problems (one line
    each). ``curves``: more curves.csv columns to draw; ``rows``: only the rows matching these patterns;
    ``facet``: a panel per first row segment. Raises ``FileNotFoundError`` (one line) when there is no
    finished run."""
    col = discover(folder)
    problems = list(col.problems)
    patterns = list(rows or [])
    if rows:
        col.rows = {r: runs for r, runs in col.rows.items() if any(fnmatch.fnmatch(r, p) for p in rows)}
        if not col.rows:
            raise FileNotFoundError(f"report: no row of {folder} matches --rows {' '.join(rows)}")
    if not col.runs:
        raise FileNotFoundError(
            f"report: no finished run under {folder} (a run folder has summary.json; a sweep output has "
            "<row>/seed<N>/lightning_logs/version_N)" + (f"; {problems[0]}" if problems else "")
        )
    metrics = Counter(r.metric for r in col.runs)
    metric = metrics.most_common(1)[0][0]
    if len(metrics) > 1:
        other = sorted({r.row for r in col.runs if r.metric != metric})
        problems.append(
            f"runs of different metrics ({', '.join(f'{m}: {n}' for m, n in metrics.items())}): the figures "
            f"show {metric}; rows {', '.join(other)} are left out (report them on their own)"
        )
    rows = {
        name: kept for name, runs in col.rows.items() if (kept := [r for r in runs if r.metric == metric])
    }
    clocked = {name: runs for name, runs in rows.items() if any(r.clocked for r in runs)}
    if clock == "sim" and not clocked:
        problems.append(
            "simulated time asked (--clock sim) but no run has a clock (model.system or an asynchronous "
            "strategy); the curves are drawn against rounds"
        )
    elif clock != "round" and clocked and len(clocked) < len(rows):
        problems.append(
            f"rows without a simulated clock left out of the simulated-time figure: "
            f"{', '.join(sorted(set(rows) - set(clocked)))}"
        )
    out = out if out is not None else (folder / "report")
    out.mkdir(parents=True, exist_ok=True)
    name = figures.METRIC_NAMES.get(metric, metric)
    tag = f"global/{metric}"
    files: list[Path] = []
    for extra, title in [(tag, f"Global {name}"), *((c, c) for c in curves)]:
        stem = "curve" if extra == tag else f"curve_{_slug(extra)}"
        if not any(extra in c for r in col.runs for c in r.curves):
            problems.append(f"--curve {extra}: no run's curves.csv has this column; not drawn")
            continue
        if clock != "sim" or not clocked:
            files += figures.curves_figure(
                rows, extra, "round", out, f"{stem}_rounds", f"{title} against rounds", facet
            )
        if clock != "round" and clocked:
            files += figures.curves_figure(
                clocked, extra, "sim_time_s", out, f"{stem}_sim", f"{title} against simulated time", facet
            )
    if any(f"personal/{metric}" in c for r in col.runs for c in r.curves):
        files += figures.curves_figure(
            rows,
            f"personal/{metric}",
            "round",
            out,
            "curve_personal",
            f"Deployed models' {name} (personal/*)",
            facet,
        )
    files += figures.clients_figure(rows, metric, out)
    files += figures.groups_figure(rows, metric, out)
    if target is not None:
        files += figures.target_figure(rows, metric, target, out)
    if not col.sweep:
        files += figures.scatter_figure(col.runs[0], metric, out)
    pngs = [p for p in files if p.suffix == ".png"]
    (out / "index.html").write_text(page(col, metric, pngs, problems, patterns))
    return problems


def main(argv: list[str]) -> None:
    """Entry point of ``python -m fl_lightning report``; exits 1 when nothing could be drawn."""
    args = _parser().parse_args(argv)
    try:
        problems = report(args.folder, args.out, args.clock, args.target, args.curve, args.rows, args.facet)
    except FileNotFoundError as err:
        sys.stderr.write(f"error: {err}\n")
        sys.exit(1)
    except ImportError as err:
        sys.stderr.write(f'error: report needs matplotlib ({err}); pip install -e ".[report]"\n')
        sys.exit(1)
    for line in problems:
        sys.stderr.write(f"warning: {line}\n")
    out = args.out if args.out is not None else args.folder / "report"
    sys.stdout.write(f"report written to {out / 'index.html'}\n")
