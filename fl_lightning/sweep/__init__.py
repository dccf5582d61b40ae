"""``python -m fl_lightning sweep <sweep.yaml>``: a grid of ``fit`` runs over seeds, N at a time, one table.

Every run of a sweep is an ordinary ``python -m fl_lightning fit`` process in its own folder,
``<out>/<row>/seed<k>/`` (its TensorBoard run, ``config.yaml``, checkpoints and ``summary.json`` under
``lightning_logs/version_N-<row>-seed<k>/``, a row ``fedprox/dir0.1`` labelling it ``fedprox-dir0.1-seed1``:
folders and TensorBoard runs read as the table's rows; its output in ``fit.log`` / ``fit.err``). ``--jobs N``
runs N at a time (default: the machine's cores), each with ``cores // N`` intra-op threads (at least 1; as
``--model.runtime.threads_per_process`` and ``OMP_NUM_THREADS``): N processes of several threads each on N
cores oversubscribe them. Before any run starts, every row's arguments are parsed as ``fit`` parses them (a
row ``fit`` would refuse stops the sweep with ``fit``'s line). Started again, a sweep skips a run only when it
is the run it would start now (the same resolved config, its summary covering ``trainer.max_steps``), resumes
one of the same config that did fewer rounds from its ``last.ckpt`` (``--ckpt_path``), and runs one of another
config again beside it (:func:`inspect_run`); a failed run is tried again. At the end it writes
``<out>/results.md`` and ``<out>/results.csv`` (mean ± std over seeds per row) and prints the table. A failed
run does not stop the others; the exit status is then 1 and the table marks the row.

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
``kib_down_per_round``, ``kib_up_per_round``, ``best_val``, ``best_test`` (optimistic), ``last_k_mean``, the
per-client spread (``client_<stat>``, ``client_global_<stat>``: ``weighted_mean``, ``std``, ``worst``,
``bottom10``, ``top10``, ``p10``, ``p50``, ``p90``), ``unseen``, ``participation_gap``,
``participation_gap_personal``, ``out_of_sample_gap``, clock columns from each run's curves.csv
(``acc@sim=100s``, ``acc@bytes=10MB``, ``acc@round=50``, ``sim_to@0.8``, ``bytes_to@0.8``, ``round_to@0.8``:
:func:`~fl_lightning.sweep.columns.clock_column`); or ``{label: eps, summary: privacy/epsilon}`` /
``{label: C-F1 (%), scalar: global/c_f1, scale: 100, digits: 2}``: any summary.json number or last
TensorBoard scalar. Default: final, best, client (when the runs have it), rounds_to_target (with a
``target``), wall_s, mib. The std is the sample standard deviation over seeds (n - 1).

A run counts as finished when a ``version_N[-<label>]`` of its folder has the config the run resolves to now
(a digest of its ``config.yaml``, :func:`config_digest`) and a ``summary.json`` that covers the sweep's
``trainer.max_steps`` (or ``fit`` stopped it early, e.g. ``EarlyStopping``). Options:
``--rows PATTERN...`` (shell patterns on row names), ``--seeds``, ``--out``, ``--report`` (only collect the
table), ``--print-commands`` (one ``fit`` command per run still to do, for a SLURM array or GNU parallel,
with ``--ckpt_path`` where one can resume), ``--check`` (re-run the rows into a fresh folder and compare
them with the stored table, ``check.table``, default ``<sweep file>.csv`` beside it: match if equal to the
printed precision or within ``check.tolerance``; exit 1 on a mismatch), and after ``--`` more ``fit``
arguments for every run. Bad sweep files stop with one ``error:`` line.

The package, one reason to change per module: :mod:`~fl_lightning.sweep.spec` (the file's schema, rows and
runs), :mod:`~fl_lightning.sweep.columns` (what a column reads), :mod:`~fl_lightning.sweep.folders` (a run
folder against the run the sweep would start now), :mod:`~fl_lightning.sweep.runner` (resolving and
launching ``fit`` processes), :mod:`~fl_lightning.sweep.report` (the table), :mod:`~fl_lightning.sweep.check`
(``--check``) and :mod:`~fl_lightning.sweep.command` (the options and the order of things).

"""

from fl_lightning.sweep.check import compare
from fl_lightning.sweep.columns import COLUMNS, Column, RunData
from fl_lightning.sweep.command import main, run_sweep
from fl_lightning.sweep.folders import RunState, config_changes, config_digest, inspect_run
from fl_lightning.sweep.report import RowResult, collect, markdown, write_tables
from fl_lightning.sweep.runner import execute, expect, fit_command
from fl_lightning.sweep.spec import Expected, Row, Run, Sweep, load_sweep, runs_of

__all__ = [
    "COLUMNS",
    "Column",
    "Expected",
    "Row",
    "RowResult",
    "Run",
    "RunData",
    "RunState",
    "Sweep",
    "collect",
    "compare",
    "config_changes",
    "config_digest",
    "execute",
    "expect",
    "fit_command",
    "inspect_run",
    "load_sweep",
    "main",
    "markdown",
    "run_sweep",
    "runs_of",
    "write_tables",
]
