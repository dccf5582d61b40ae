"""``python -m fl_lightning report <run folder | sweep output> [--out DIR]``: figures and one offline page.

Reads only what runs wrote (``summary.json``, ``curves.csv``, ``clients.csv``; ``config.yaml`` and a sweep's
``results.csv`` for the page's text) and never recomputes a number: a curve's point is a ``curves.csv``
cell, or the mean and sample std over seeds of the cells at the same round (on the simulated clock: of
each seed's last value at that time). Draws with matplotlib's Agg backend (``pip install -e ".[report]"``).

For a sweep output (``<out>/<row>/seed<N>/lightning_logs/version_N``): the global metric against rounds
and, where a clock ran, against simulated time, mean ± std over seeds, one line per row; each row's final
per-client accuracy (box plot over the participating clients of every seed, the worst decile marked);
each transform group's global curve; time- and bytes-to-target bars (``--target``). For one run: its curves
and its per-client scatter (accuracy against samples, group or noise, device speed). PNG and SVG files and
``index.html`` (the figures embedded, the tables, each row's config) in ``--out`` (default:
``<folder>/report``). Bad input (no runs, a failed run, runs of different metrics, simulated time asked
without a clock) is one line each; the figures that can be drawn are drawn.
"""

from fl_lightning.report.command import main, report
from fl_lightning.report.discover import Collection, RunFiles, discover

__all__ = ["Collection", "RunFiles", "discover", "main", "report"]
