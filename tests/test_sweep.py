"""``python -m fl_lightning sweep``: the sweep file, run folders, the runner, the table and ``--check``.

The quick tests launch a stand-in for ``fit`` (a few lines of Python that write a run folder as ``fit``
does, or fail, or wait); the slow ones run real ``fit`` processes on the embedded digits.
"""

from __future__ import annotations

import ast
import csv
import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
import torch
import yaml
from torch.utils.tensorboard import SummaryWriter

import fl_lightning.sweep as sweep_module
from fl_lightning.errors import ConfigError
from fl_lightning.sweep import (
    Expected,
    collect,
    config_changes,
    config_digest,
    execute,
    expect,
    inspect_run,
    load_sweep,
    main,
    run_sweep,
    runs_of,
)

ROOT = Path(__file__).resolve().parents[1]


def fake_config(argv: list[str]) -> dict:
    """What the stand-ins resolve ``fit`` arguments to (the sweep's view, and the ``config.yaml`` the fake
    ``fit`` writes): the seed, ``trainer.max_steps`` (default 3) and the ``--model.*`` options; config
    files, folders and threads are left out, as :data:`fl_lightning.sweep.NOT_DIGESTED` leaves them out."""
    opts = dict(str(a)[2:].split("=", 1) for a in argv if str(a).startswith("--") and "=" in str(a))
    model = {k[6:]: v for k, v in opts.items() if k.startswith("model.") and k != "model.threads_per_process"}
    steps = int(opts.get("trainer.max_steps", 3))
    seed = int(opts.get("seed_everything", 0))
    return {"seed_everything": seed, "trainer": {"max_steps": steps}, "model": model}


#: Stands in for ``python -m fl_lightning fit``: writes ``version_N/{config.yaml,summary.json}`` with
#: ``final_global_acc = --model.acc + seed / 100``, or fails (``--model.fail``), or waits (``--model.wait``).
FAKE_FIT = (
    inspect.getsource(fake_config)
    + r"""
import json, os, sys, time
opts = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
if "model.wait" in opts:
    try:
        time.sleep(float(opts["model.wait"]))
    except KeyboardInterrupt:  # Ctrl-C: stop as fit does, leaving a mark
        open(os.path.join(opts["trainer.default_root_dir"], "interrupted"), "w").close()
        sys.exit(1)
if "model.fail" in opts:
    sys.stderr.write("Traceback (most recent call last):\n  ...\n")
    sys.stderr.write("error: model.fail: " + opts["model.fail"] + "\n")
    sys.stderr.write("[W] a warning printed at exit\n")  # the error line need not be the last one
    sys.exit(2)
root = os.path.join(opts["trainer.default_root_dir"], "lightning_logs")
n = len(os.listdir(root)) if os.path.isdir(root) else 0
run = os.path.join(root, f"version_{n}")
os.makedirs(run)
acc = float(opts.get("model.acc", 0.5)) + int(opts["seed_everything"]) / 100
config = fake_config(sys.argv[1:])
with open(os.path.join(run, "config.yaml"), "w") as f:
    json.dump(config, f)
steps = config["trainer"]["max_steps"]
summary = {"rounds": steps, "max_steps": steps, "metric": "acc", "final_global_acc": acc,
           "best_global_acc": acc, "wall_time_s": 1.0, "run_wall_time_s": 1.0,
           "mean_round_s": 0.5, "bytes_down": 1024, "bytes_up": 1024, "bytes_total": 2048,
           "argv": sys.argv[1:], "threads_env": os.environ.get("OMP_NUM_THREADS"),
           "machine": {"torch": "9.9", "device": "cpu", "cpu_kernels": "AVX2", "threads": 1}}
with open(os.path.join(run, "summary.json"), "w") as f:
    json.dump(summary, f)
"""
)

#: The real ``fit`` parser's resolver (the quick tests resolve with :func:`fake_config` instead).
REAL_RESOLVER = sweep_module.resolver


@pytest.fixture(autouse=True)
def in_tmp_with_fake_resolver(tmp_path, monkeypatch):
    """Every test starts in ``tmp_path`` (a sweep's default ``out`` is under the current folder), and
    the sweep resolves run arguments with :func:`fake_config` (tests of the real parser restore it)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sweep_module, "resolver", lambda root: lambda args, check: fake_config(args))


@pytest.fixture
def fake_fit(tmp_path, monkeypatch):
    """Every process the sweep launches runs :data:`FAKE_FIT` with the sweep's ``fit`` arguments."""
    script = tmp_path / "fake_fit.py"
    script.write_text(FAKE_FIT)
    real = subprocess.Popen

    def popen(cmd, **kw):
        assert cmd[1:4] == ["-m", "fl_lightning", "fit"]
        return real([sys.executable, str(script), *cmd[4:]], **kw)

    monkeypatch.setattr(sweep_module.subprocess, "Popen", popen)
    monkeypatch.setattr(sweep_module, "machine_cores", lambda: 4)


def write_sweep(folder: Path, content: dict, name: str = "s.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "base.yaml").write_text("trainer:\n  max_steps: 3\n")
    path = folder / name
    path.write_text(yaml.safe_dump(content, sort_keys=False))
    return path


def write_csv(path: Path, rows: list[dict[str, str]]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def read_csv(path: Path) -> dict[str, dict[str, str]]:
    with open(path, newline="") as f:
        return {r["row"]: r for r in csv.DictReader(f)}


# ------------------------------------------------------------------------------------------- the table


def craft_run(
    folder: Path,
    summary: dict,
    max_steps: int = 3,
    acc_curve: list[float] | None = None,
    version: int = 0,
    model: dict | None = None,
) -> Path:
    """A run folder as ``fit`` leaves it: config.yaml (as :func:`fake_config` resolves the run's arguments:
    its seed from the folder's name, ``model``'s options), summary.json and TensorBoard scalars."""
    run = folder / "lightning_logs" / f"version_{version}"
    run.mkdir(parents=True)
    seed = int(folder.name[4:]) if folder.name.startswith("seed") else 0
    config = {"seed_everything": seed, "trainer": {"max_steps": max_steps}, "model": model or {}}
    (run / "config.yaml").write_text(json.dumps(config))
    (run / "summary.json").write_text(json.dumps(summary))
    if acc_curve is not None:
        writer = SummaryWriter(str(run))
        for step, acc in enumerate(acc_curve, 1):
            writer.add_scalar("global/acc", acc, step)
            writer.add_scalar("round/bytes_down", 2**20, step)
            writer.add_scalar("round/bytes_up", 2**19, step)
        writer.close()
    return run


def checkpoint(run: Path, rounds: int) -> Path:
    """A ``last.ckpt`` of ``rounds`` rounds in a run's version folder (what the sweep reads of it)."""
    path = run / "checkpoints" / "last.ckpt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": {}, "global_step": rounds}, path)
    return path


def summary(
    final: float, best: float, client: float | None = None, wall: float = 10.0, kernels: str | None = None
) -> dict:
    s: dict = {
        "rounds": 3,
        "max_steps": 3,
        "metric": "acc",
        "final_global_acc": final,
        "best_global_acc": best,
        "wall_time_s": wall,
        "mean_round_s": wall / 3,
        "bytes_down": 3 * 2**20,
        "bytes_up": 2**20,
        "bytes_total": 4 * 2**20,
    }
    if client is not None:
        s["client_acc"] = {"n": 4, "mean": client, "std": 0.1, "min": 0.0, "max": 1.0}
    if kernels is not None:  # a run that recorded its machine
        s["machine"] = {"torch": "2.14.1", "device": "cpu", "cpu_kernels": kernels, "threads": 1}
    return s


def test_the_table_is_the_mean_and_sample_std_over_seeds_of_each_column(tmp_path, capsys):
    path = write_sweep(
        tmp_path,
        {
            "base": "base.yaml",
            "seeds": [0, 1, 2],
            "target": 0.8,
            "columns": ["final", "best", "client", "rounds_to_target", "mib_to_target", "wall_s", "mib"],
            "rows": [{"name": "a", "paper": 76.0}, {"name": "b", "paper": {"Dir 0.1": "n/a"}}],
        },
    )
    out = tmp_path / "lightning_logs" / "sweeps" / "s"
    craft_run(out / "a" / "seed0", summary(0.90, 0.95, 0.80, 10, "AVX2"), acc_curve=[0.5, 0.85, 0.9])
    craft_run(out / "a" / "seed1", summary(0.92, 0.95, 0.90, 20, "AVX2"), acc_curve=[0.5, 0.7, 0.7, 0.81])
    craft_run(out / "a" / "seed2", summary(0.94, 0.98, 0.85, 30, "AVX512"), acc_curve=[0.5, 0.6, 0.7])
    craft_run(out / "b" / "seed0", summary(0.50, 0.60))
    (out / "b" / "seed1").mkdir(parents=True)  # failed on an earlier start
    (out / "b" / "seed1" / "sweep.json").write_text(json.dumps({"returncode": 2, "error": "error: boom"}))
    assert run_sweep([str(path), "--report"]) == 1  # b has a failed and a missing run

    table = read_csv(out / "results.csv")
    a, b = table["a"], table["b"]
    assert float(a["final_mean"]) == pytest.approx(92.0) and float(a["final_std"]) == pytest.approx(2.0)
    assert float(a["best_mean"]) == pytest.approx(96.0) and float(a["best_std"]) == pytest.approx(3**0.5)
    assert float(a["client_mean"]) == pytest.approx(85.0) and float(a["client_std"]) == pytest.approx(5.0)
    # the target 0.8 is first reached in rounds 2 and 4; seed 2 never reaches it
    assert (a["rounds_to_target_mean"], a["rounds_to_target_n"]) == ("3.0", "2")
    assert float(a["rounds_to_target_std"]) == pytest.approx(2**0.5)
    assert float(a["mib_to_target_mean"]) == pytest.approx((2 * 1.5 + 4 * 1.5) / 2)  # MiB sent until then
    assert float(a["wall_s_mean"]) == pytest.approx(20.0) and float(a["wall_s_std"]) == pytest.approx(10.0)
    assert (a["seeds"], a["failed"], a["missing"], a["paper"]) == ("3", "0", "0", "76.0")
    assert (b["seeds"], b["failed"], b["missing"], b["final_mean"], b["final_std"]) == (
        "1",
        "1",
        "1",
        "50.0",
        "",
    )
    assert b["client_n"] == "0" and b["client_mean"] == ""
    machines = "torch 2.14.1, cpu (AVX2 kernels), 1 thread; torch 2.14.1, cpu (AVX512 kernels), 1 thread"
    assert (a["machine"], b["machine"]) == (machines, "")  # b's run did not record one

    md = (out / "results.md").read_text()
    assert md in capsys.readouterr().out  # printed as written
    assert "| row | seeds | final acc (%) | best acc (%) | client acc (%) | rounds to 0.8 |" in md
    assert (
        "| a | 3 | 92.00 ± 2.00 | 96.00 ± 1.73 | 85.00 ± 5.00 | 3.0 ± 1.4 (2 of 3) | 4.50 ± 2.12 (2 of 3) "
        in md
    )
    assert "| 20.0 ± 10.0 | 4.00 ± 0.00 | 76.00 | - |" in md
    assert "| b | 1 (1 failed, 1 missing) | 50.00 | 60.00 | - | - | - | 10.0 | 4.00 | - | n/a |" in md
    assert "- b seed 1: error: boom" in md
    assert f"over seeds [0, 1, 2]. Computed with {machines}.\n" in md


def test_multilabel_runs_report_o_f1_and_the_client_column_only_when_runs_have_it(tmp_path):
    path = write_sweep(tmp_path, {"base": "base.yaml", "rows": [{"name": "flair"}]})
    out = tmp_path / "lightning_logs" / "sweeps" / "s"
    s = summary(0.0, 0.0)
    del s["final_global_acc"], s["best_global_acc"]
    s.update(metric="o_f1", final_global_o_f1=0.4, best_global_o_f1=0.5)
    craft_run(out / "flair" / "seed0", s)
    assert run_sweep([str(path), "--report"]) == 0
    md = (out / "results.md").read_text()
    assert "| row | seeds | final O-F1 (%) | best O-F1 (%) | wall (s) | MiB |" in md
    assert "| flair | 1 | 40.00 | 50.00 | 10.0 | 4.00 |" in md


def test_custom_columns_read_a_summary_key_or_a_scalar(tmp_path):
    path = write_sweep(
        tmp_path,
        {
            "base": "base.yaml",
            "columns": [
                {"label": "eps", "summary": "privacy/epsilon", "scale": 10, "digits": 3},
                {"label": "C-F1 (%)", "scalar": "global/acc", "scale": 100, "digits": 1},
                "kib_up_per_round",
            ],
            "rows": [{"name": "dp"}],
        },
    )
    out = tmp_path / "lightning_logs" / "sweeps" / "s"
    craft_run(out / "dp" / "seed0", {**summary(0.9, 0.9), "privacy/epsilon": 2.34567}, acc_curve=[0.25, 0.5])
    assert run_sweep([str(path), "--report"]) == 0
    assert "| dp | 1 | 23.457 | 50.0 | 341.3 |" in (out / "results.md").read_text()  # 1 MiB up / 3 rounds


# ------------------------------------------------------------------------------------------- run folders


def expected(max_steps: int = 3, model: dict | None = None, seed: int = 0) -> Expected:
    """What a run resolves to, as :func:`fake_config` gives it (``craft_run`` writes the same)."""
    config = {"seed_everything": seed, "trainer": {"max_steps": max_steps}, "model": model or {}}
    return Expected(config_digest(config), max_steps, config)


def test_a_run_is_finished_only_when_it_is_the_run_the_sweep_would_start_now(tmp_path):
    assert inspect_run(tmp_path / "nothing", expected()).kind == "new"
    run = tmp_path / "run"
    craft_run(run, summary(0.9, 0.9), max_steps=3)
    state = inspect_run(run, expected(3))
    assert (state.kind, state.version) == ("finished", run / "lightning_logs" / "version_0")

    # a shorter smoke run of the same config is not finished: it resumes to the sweep's rounds
    smoke = tmp_path / "smoke"
    v0 = craft_run(smoke, summary(0.1, 0.1) | {"rounds": 2, "max_steps": 2}, max_steps=2)
    assert inspect_run(smoke, expected(10)).kind == "rerun"  # no checkpoint to resume from
    ckpt = checkpoint(v0, 2)
    state = inspect_run(smoke, expected(10))
    assert (state.kind, state.ckpt, state.why) == ("resume", ckpt, "2 of 10 rounds done")
    assert inspect_run(smoke, expected(2)).kind == "finished"  # what it was run for
    # resumed to 10 and killed at round 7: config.yaml says 10, the summary is still the smoke run's
    (v0 / "config.yaml").write_text(json.dumps(expected(10).config))
    checkpoint(v0, 7)
    state = inspect_run(smoke, expected(10))
    assert (state.kind, state.why) == ("resume", "7 of 10 rounds done")
    # a run that went further than the sweep's rounds is not its run either
    state = inspect_run(smoke, expected(5))
    assert state.kind == "rerun" and "it ran 7 rounds; the sweep's trainer.max_steps is 5" in state.why

    # another config (a changed default or row argument): run again beside it, saying what changed
    state = inspect_run(run, expected(3, model={"client.lr": 0.05}))
    assert state.kind == "rerun" and state.why == "its config differs: model.client.lr: <unset> -> 0.05"
    # ... which, once run, is finished, and the older version still counts for the older config
    craft_run(run, summary(0.8, 0.8), model={"client.lr": 0.05}, version=1)
    assert inspect_run(run, expected(3, model={"client.lr": 0.05})).version.name == "version_1"
    assert inspect_run(run, expected(3)).version.name == "version_0"

    # an interrupted start's summary: resume from its checkpoint
    cut = tmp_path / "cut"
    v0 = craft_run(cut, summary(0.5, 0.5) | {"rounds": 1, "max_steps": 3, "interrupted": True})
    checkpoint(v0, 1)
    assert inspect_run(cut, expected(3)).kind == "resume"
    (v0 / "summary.json").write_text('{"rounds": 3')  # cut short while written
    assert inspect_run(cut, expected(3)).kind == "resume"

    # a summary written before summaries recorded max_steps: its rounds must be the sweep's, or the
    # sweep saw its fit exit 0 (stopped early by EarlyStopping)
    old = tmp_path / "old"
    v0 = craft_run(old, {k: v for k, v in summary(0.9, 0.9).items() if k != "max_steps"} | {"rounds": 2})
    checkpoint(v0, 2)
    assert inspect_run(old, expected(3)).kind == "resume"
    (old / "sweep.json").write_text(json.dumps({"returncode": 0, "version": "version_0"}))
    assert inspect_run(old, expected(3)).kind == "finished"

    failed = tmp_path / "failed"
    failed.mkdir()
    (failed / "sweep.json").write_text(json.dumps({"returncode": 2, "error": "error: x"}))
    state = inspect_run(failed, expected())
    assert (state.kind, state.error) == ("failed", "error: x")


def test_config_digest_leaves_out_where_a_run_writes_and_how_the_sweep_runs_it():
    config = {
        "seed_everything": 1,
        "trainer": {"max_steps": 5, "default_root_dir": "a", "enable_progress_bar": False},
        "model": {"threads_per_process": 1, "client": {"init_args": {"lr": 0.1}}},
        "data": {"root": "x", "download": False, "num_clients": 4},
        "ckpt_path": None,
    }
    same = json.loads(json.dumps(config))
    same["trainer"].update(max_steps=50, default_root_dir="b", enable_progress_bar=True)
    same["model"]["threads_per_process"] = 2
    same["data"].update(root="y", download=True)
    same["ckpt_path"] = "last.ckpt"
    assert config_digest(same) == config_digest(config)
    for field in ("seed_everything", "model.client.init_args.lr", "data.num_clients"):
        other = json.loads(json.dumps(config))
        *parents, leaf = field.split(".")
        node = other
        for key in parents:
            node = node[key]
        node[leaf] = 7
        assert config_digest(other) != config_digest(config), field
        assert config_changes(config, other) == f"{field}: {_get(config, field)} -> 7"


def _get(config: dict, field: str):
    for key in field.split("."):
        config = config[key]
    return config


def test_the_table_reads_the_scalars_of_the_finished_run_only(tmp_path):
    path = write_sweep(tmp_path, {"base": "base.yaml", "target": 0.6, "rows": [{"name": "r"}]})
    folder = tmp_path / "lightning_logs" / "sweeps" / "s" / "r" / "seed0"
    # version_0: the run of another config, which reached the target at once; version_1: the sweep's run
    craft_run(folder, summary(0.9, 0.9), acc_curve=[0.7, 0.8, 0.9], model={"lr": 1})
    craft_run(folder, summary(0.7, 0.7), acc_curve=[0.1, 0.65, 0.7], version=1)
    assert run_sweep([str(path), "--report"]) == 0
    row = read_csv(folder.parents[1] / "results.csv")["r"]
    assert (row["final_mean"], row["rounds_to_target_mean"]) == ("70.0", "2.0")


def test_the_wall_column_is_the_runs_wall_time_over_all_its_starts(tmp_path):
    path = write_sweep(tmp_path, {"base": "base.yaml", "columns": ["wall_s"], "rows": [{"name": "r"}]})
    out = tmp_path / "lightning_logs" / "sweeps" / "s"
    craft_run(out / "r" / "seed0", summary(0.9, 0.9, wall=5.0) | {"run_wall_time_s": 12.5})
    assert run_sweep([str(path), "--report"]) == 0
    assert read_csv(out / "results.csv")["r"]["wall_s_mean"] == "12.5"


# ------------------------------------------------------------------------------------------- the runner


def test_runs_get_their_folders_seeds_threads_and_progress_lines_and_a_failure_does_not_stop_the_sweep(
    tmp_path, fake_fit, capsys
):
    path = write_sweep(
        tmp_path,
        {
            "base": "base.yaml",
            "args": ["--model.acc=0.5"],
            "seeds": [0, 1],
            "grid": {
                "method": {"good": {"args": ["--model.acc=0.8"]}, "bad": {"args": ["--model.fail=boom"]}},
                "size": {"s": None, "m": {"config": "base.yaml"}},
            },
        },
    )
    assert run_sweep([str(path), "--jobs", "2"]) == 1
    out = capsys.readouterr().out
    assert "4 rows x 2 seeds = 8 runs" in out and "2 at a time, 2 thread(s) each on 4 cores" in out
    assert out.count(" start   ") == 8 and out.count(" done    ") == 4 and out.count(" failed  ") == 4
    assert (
        "failed  bad/s seed 1: error: model.fail: boom (log: lightning_logs/sweeps/s/bad/s/seed1/fit.err)"
        in out
    )
    assert "done    good/m seed 1: final acc 81.00% (best 81.00%)" in out
    sweeps = tmp_path / "lightning_logs" / "sweeps" / "s"
    s = json.loads(
        (sweeps / "good" / "m" / "seed1" / "lightning_logs" / "version_0" / "summary.json").read_text()
    )
    assert s["argv"] == [
        "--config=base.yaml",
        "--config=base.yaml",
        "--trainer.enable_progress_bar=false",
        "--model.acc=0.5",
        "--model.acc=0.8",
        "--model.threads_per_process=2",  # 4 cores // 2 jobs
        "--seed_everything=1",
        "--trainer.default_root_dir=lightning_logs/sweeps/s/good/m/seed1",
    ]
    assert s["threads_env"] == "2"
    table = read_csv(sweeps / "results.csv")
    assert float(table["good/s"]["final_mean"]) == pytest.approx(80.5) and table["bad/m"]["failed"] == "2"
    assert "| bad | m | 0 (2 failed) | - |" in (sweeps / "results.md").read_text()

    assert run_sweep([str(path), "--jobs", "1", "--rows", "good/*"]) == 0  # started again: nothing to run
    out = capsys.readouterr().out
    assert out.count(" skipped ") == 4 and " start " not in out
    assert "1 at a time, 4 thread(s) each" in out


def test_sweep_file_seeds_and_jobs_and_extra_fit_arguments(tmp_path, fake_fit, capsys):
    path = write_sweep(
        tmp_path, {"base": "base.yaml", "seeds": [3], "jobs": 3, "threads": 1, "rows": [{"name": "r"}]}
    )
    assert run_sweep([str(path), "--seeds", "5", "--", "--model.acc=0.25"]) == 0
    out = capsys.readouterr().out
    assert "3 at a time, 1 thread(s) each on 4 cores" in out
    assert "done    r seed 5: final acc 30.00%" in out


def test_an_interrupted_sweep_stops_its_runs_and_says_how_to_resume(tmp_path, fake_fit, capsys):
    path = write_sweep(
        tmp_path, {"base": "base.yaml", "args": ["--model.wait=60"], "seeds": [0, 1], "rows": [{"name": "r"}]}
    )
    sweep = load_sweep(path)
    runs = expect(sweep, runs_of(sweep), [])
    for run in runs:  # both failed on an earlier start
        run.folder.mkdir(parents=True)
        (run.folder / "sweep.json").write_text(json.dumps({"returncode": 2, "error": "error: old"}))
    previous = signal.getsignal(signal.SIGTERM)
    timer = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    outcome, interrupted = execute(sweep, runs, jobs=2, threads=1, extra=[])
    assert interrupted and outcome == {}
    assert "interrupted: 2 run(s) stopped; start the sweep again" in capsys.readouterr().out
    for run in runs:  # each run got SIGINT (Lightning's graceful stop), not a kill
        assert (run.folder / "interrupted").exists()
    (row,) = collect(sweep, runs, outcome)
    assert (row.failed, row.missing) == ([], [0, 1])  # to resume, no longer failed with the old error
    assert signal.getsignal(signal.SIGTERM) == previous


def test_print_commands_lists_the_runs_to_do_with_resume_checkpoints(tmp_path, capsys):
    """Started from a folder other than the sweep's root: the runs go under that folder (absolute paths in
    the commands), the commands run in the root (configs are relative to it)."""
    path = write_sweep(tmp_path / "exp", {"base": "base.yaml", "seeds": [0, 1, 2], "rows": [{"name": "r"}]})
    out = tmp_path / "lightning_logs" / "sweeps" / "s" / "r"
    craft_run(out / "seed0", summary(0.9, 0.9))
    checkpoint(craft_run(out / "seed1", summary(0.2, 0.2) | {"rounds": 1, "interrupted": True}), 1)
    assert run_sweep([str(path), "--print-commands", "--threads", "2"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    cd = f"cd {tmp_path / 'exp'} && OMP_NUM_THREADS=2 python -m fl_lightning fit --config=base.yaml "
    base = cd + "--trainer.enable_progress_bar=false --model.threads_per_process=2 "
    assert lines == [
        base + f"--seed_everything=1 --trainer.default_root_dir={out}/seed1 "
        f"--ckpt_path={out}/seed1/lightning_logs/version_0/checkpoints/last.ckpt",
        base + f"--seed_everything=2 --trainer.default_root_dir={out}/seed2",
    ]
    assert "# 2 of 3 runs to do" in captured.err
    assert not (out / "seed2").exists()  # nothing ran


# ------------------------------------------------------------------------------------------- --check


def test_check_reruns_the_rows_and_compares_them_with_the_stored_table(
    tmp_path, fake_fit, capsys, monkeypatch
):
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # --check's fresh folders
    content = {
        "base": "base.yaml",
        "seeds": [0, 1],
        "rows": [{"name": "a"}, {"name": "b", "args": ["--model.acc=0.7"]}],
    }
    path = write_sweep(tmp_path, content)
    assert run_sweep([str(path)]) == 0
    shutil.copy(tmp_path / "lightning_logs" / "sweeps" / "s" / "results.csv", tmp_path / "s.csv")
    capsys.readouterr()
    assert run_sweep([str(path), "--check"]) == 0
    out = capsys.readouterr().out
    assert "match    a" in out and "match    b" in out and "2 of 2 rows match" in out
    assert out.count(" start   ") == 4  # re-run, not reused

    with open(tmp_path / "s.csv", newline="") as f:
        stored = list(csv.DictReader(f))
    stored[1]["final_mean"] = str(float(stored[1]["final_mean"]) + 0.3)  # a table gone stale
    write_csv(tmp_path / "s.csv", stored)
    assert run_sweep([str(path), "--check"]) == 1
    out = capsys.readouterr().out
    assert "match    a" in out and "MISMATCH b: final mean 70.50 (stored 70.80)" in out
    assert "run on" not in out  # the same machine: no excuse

    for row in stored:  # the stored table came from another CPU's kernels
        row["machine"] = "torch 9.9, cpu (AVX512 kernels), 1 thread"
    write_csv(tmp_path / "s.csv", stored)
    assert run_sweep([str(path), "--check"]) == 1
    out = capsys.readouterr().out
    assert "match    a\n" in out  # equal numbers match whatever the machine
    assert (
        "MISMATCH b: final mean 70.50 (stored 70.80); stored on torch 9.9, cpu (AVX512 kernels), 1 thread, "
        "run on torch 9.9, cpu (AVX2 kernels), 1 thread: float results differ across machines"
    ) in out

    path = write_sweep(tmp_path, {**content, "check": {"tolerance": 0.5}})
    assert run_sweep([str(path), "--check", "--rows", "b"]) == 0
    out = capsys.readouterr().out
    assert "match    b" in out and "1 of 1 rows match" in out


def test_check_matches_a_row_whose_stored_runs_failed_only_if_they_fail_again(
    tmp_path, fake_fit, capsys, monkeypatch
):
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    rows = [{"name": "a"}, {"name": "diverges", "args": ["--model.fail=nan"]}]
    path = write_sweep(tmp_path, {"base": "base.yaml", "seeds": [0, 1], "rows": rows})
    assert run_sweep([str(path)]) == 1  # a failed row
    shutil.copy(tmp_path / "lightning_logs" / "sweeps" / "s" / "results.csv", tmp_path / "s.csv")
    capsys.readouterr()
    assert run_sweep([str(path), "--check"]) == 0  # it fails again: the table is reproduced
    out = capsys.readouterr().out
    assert "match    a\n" in out and "match    diverges\n" in out and "2 of 2 rows match" in out

    path = write_sweep(tmp_path, {"base": "base.yaml", "seeds": [0, 1], "rows": [{"name": "diverges"}]})
    assert run_sweep([str(path), "--check"]) == 1  # now it trains: not the stored result
    out = capsys.readouterr().out
    assert "MISMATCH diverges: runs 2 (stored 0, 2 failed)" in out


def test_check_without_a_stored_table_is_one_line(tmp_path, capsys):
    path = write_sweep(tmp_path, {"base": "base.yaml", "rows": [{"name": "a"}]})
    with pytest.raises(SystemExit) as exit_info:
        main([str(path), "--check"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no stored table" in err and "s.csv" in err


# ------------------------------------------------------------------------------------------- bad files


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            {"base": "base.yaml", "rows": [{"name": "a"}], "sede": [1]},
            "unknown key 'sede'; did you mean 'seeds'?",
        ),
        ({"base": "missing.yaml", "rows": [{"name": "a"}]}, "base: config file missing.yaml not found"),
        ({"rows": [{"name": "a", "config": "nope.yaml"}]}, "rows[0]: config file nope.yaml not found"),
        ({"base": "base.yaml"}, "give either grid: (named axes) or rows: (a list)"),
        ({"base": "base.yaml", "rows": [{"name": "a"}], "grid": {"m": {"x": {}}}}, "give either grid:"),
        ({"base": "base.yaml", "grid": {"m": {"x": {"conf": "a"}}}}, "grid.m.x: unknown key 'conf'; did you"),
        ({"base": "base.yaml", "grid": {"m": {"x y": {}}}}, "grid.m: 'x y' is not a folder-safe name"),
        (
            {"base": "base.yaml", "grid": {"m": {"x": {}}}, "paper": {"z": 1}},
            "paper.z: no such row in the grid",
        ),
        ({"base": "base.yaml", "grid": [{"m": {"x": {}}}, {"n": {"x": {}}}]}, "grid[1]: axes n differ"),
        ({"base": "base.yaml", "rows": [{"name": "a"}, {"name": "a"}]}, "row 'a' appears twice"),
        ({"base": "base.yaml", "rows": [{"name": "a", "args": ["--seed_everything=1"]}]}, "set by the sweep"),
        (
            {"base": "base.yaml", "args": "--x=1", "rows": [{"name": "a"}]},
            "args must be a list of fit arguments",
        ),
        ({"base": "base.yaml", "seeds": [0, 0], "rows": [{"name": "a"}]}, "seeds=[0, 0] repeats a seed"),
        ({"base": "base.yaml", "seeds": [-1], "rows": [{"name": "a"}]}, "must be a list of integers >= 0"),
        ({"base": "base.yaml", "columns": ["fnal"], "rows": [{"name": "a"}]}, "did you mean 'final'?"),
        (
            {"base": "base.yaml", "columns": ["final", "final"], "rows": [{"name": "a"}]},
            "a column is listed twice",
        ),
        ({"base": "base.yaml", "columns": ["rounds_to_target"], "rows": [{"name": "a"}]}, "needs a target:"),
        ({"base": "base.yaml", "target": "high", "rows": [{"name": "a"}]}, "target='high' must be a number"),
        ({"base": "base.yaml", "jobs": 0, "rows": [{"name": "a"}]}, "jobs=0 must be an integer >= 1"),
        ({"base": "base.yaml", "check": {"tol": 1}, "rows": [{"name": "a"}]}, "check: unknown key 'tol'"),
        ({"base": "base.yaml", "root": "nowhere", "rows": [{"name": "a"}]}, "is not a folder"),
    ],
)
def test_a_bad_sweep_file_is_one_line_naming_the_key(tmp_path, capsys, content, message):
    path = write_sweep(tmp_path, content)
    with pytest.raises(SystemExit) as exit_info:
        main([str(path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: ") and err.count("\n") == 1, err
    assert message in err
    assert not (tmp_path / "lightning_logs").exists()


@pytest.mark.parametrize(
    ("text", "args", "message"),
    [
        ("rows: [\n", [], "YAML syntax error at line 2"),
        ("- a\n", [], "a sweep file is a mapping"),
        (None, [], "no such sweep file"),
        ("base: base.yaml\nrows: [{name: a}]\n", ["--rows", "b*"], "--rows b*: matches no row (rows: a)"),
        ("base: base.yaml\nrows: [{name: a}]\n", ["--jobs", "0"], "--jobs=0 must be >= 1"),
        (
            "base: base.yaml\nrows: [{name: a}]\n",
            ["--jobs", "two"],
            "sweep: argument --jobs: invalid int value",
        ),
        ("base: base.yaml\nrows: [{name: a}]\n", ["--", "--ckpt_path=x"], "--ckpt_path is set by the sweep"),
    ],
)
def test_unreadable_files_and_bad_options_are_one_line(tmp_path, capsys, text, args, message):
    (tmp_path / "base.yaml").write_text("")
    path = tmp_path / "s.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(SystemExit) as exit_info:
        main([str(path), *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err


def test_no_sweep_file_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        "error: sweep: the following arguments are required: sweep (python -m fl_lightning sweep --help)\n"
    )


def test_grid_blocks_paper_values_and_paths_relative_to_root(tmp_path):
    (tmp_path / "configs").mkdir()
    for name in ("c10.yaml", "c100.yaml", "a.yaml", "b.yaml"):
        (tmp_path / "configs" / name).write_text("")
    path = tmp_path / "recipes" / "x" / "s_cpu.yaml"
    path.parent.mkdir(parents=True)
    methods = {"a": {"config": "configs/a.yaml"}, "b": {"config": "configs/b.yaml", "args": ["--model.x=1"]}}
    path.write_text(
        yaml.safe_dump(
            {
                "root": "../..",
                "grid": [
                    {"data": {"c10": {"config": "configs/c10.yaml"}}, "method": methods},
                    {"data": {"c100": {"config": "configs/c100.yaml"}}, "method": {"a": None}},
                ],
                "paper": {"c10": {"a": 1.5, "b": {"final": 2, "best": 3}}},
            }
        )
    )
    sweep = load_sweep(path)
    assert sweep.root == tmp_path and sweep.name == "s_cpu"
    assert sweep.out == tmp_path / "lightning_logs" / "sweeps" / "s_cpu"
    assert sweep.check_table == path.with_suffix(".csv")
    assert sweep.axes == ("data", "method")
    assert [(r.name, r.configs, r.args, r.paper) for r in sweep.rows] == [
        ("c10/a", ("configs/c10.yaml", "configs/a.yaml"), (), {"": 1.5}),
        ("c10/b", ("configs/c10.yaml", "configs/b.yaml"), ("--model.x=1",), {"final": 2, "best": 3}),
        ("c100/a", ("configs/c100.yaml",), (), {}),
    ]


def test_the_sweep_module_launches_the_cli_and_imports_nothing_of_the_engine():
    tree = ast.parse(Path(sweep_module.__file__).read_text())
    imported = {
        node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    } | {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
    assert {m for m in imported if m.startswith("fl_lightning")} == {
        "fl_lightning.cli",  # fit's parser: what a run's arguments resolve to
        "fl_lightning.errors",
        "fl_lightning.lightning.checkpoint",  # the rounds a last.ckpt holds
        "fl_lightning.runs",
    }


def test_a_sweep_without_base_runs_the_zero_config_fit(tmp_path, fake_fit, capsys):
    path = write_sweep(tmp_path, {"rows": [{"name": "default"}, {"name": "prox", "args": ["--model.mu=1"]}]})
    assert [r.configs for r in load_sweep(path).rows] == [(), ()]
    assert run_sweep([str(path)]) == 0
    assert capsys.readouterr().out.count(" done    ") == 2


def test_row_arguments_fit_would_refuse_stop_the_sweep_before_any_run(
    tmp_path, fake_fit, capsys, monkeypatch
):
    monkeypatch.setattr(sweep_module, "resolver", REAL_RESOLVER)
    rows = [{"name": "ok"}, {"name": "typo", "args": ["--model.lr=0.1"]}]
    path = write_sweep(tmp_path, {"args": ["--trainer.max_steps=2"], "rows": rows})
    (tmp_path / "base.yaml").unlink()
    with pytest.raises(SystemExit) as exit_info:
        main([str(path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: {path}: row typo (seed 0): --model.lr is not an option; did you mean --model.lr_decay or "
        "--model.client.lr?\n"
    )
    assert not (tmp_path / "lightning_logs").exists()  # nothing started
    path = write_sweep(tmp_path, {"rows": [{"name": "half", "args": ["--model.participation=1.5"]}]})
    with pytest.raises(SystemExit):
        main([str(path)])
    assert "row half (seed 0): model.participation=1.5 must be in (0, 1]" in capsys.readouterr().err


RECIPE_SWEEPS = sorted(p for p in (ROOT / "recipes").glob("*/*.yaml") if p.parent.name != "flower")


@pytest.mark.parametrize("path", RECIPE_SWEEPS, ids=[str(p.relative_to(ROOT)) for p in RECIPE_SWEEPS])
def test_every_recipe_sweep_file_loads_and_pins_threads_or_runs_one_at_a_time(path):
    sweep = load_sweep(path)  # config files exist, keys and columns are known
    assert sweep.root == ROOT and sweep.rows
    assert sweep.out == Path.cwd() / "lightning_logs" / "sweeps" / sweep.name  # where the user starts it
    # CPU tables: one thread per run, reproducible (--check) whatever the machine; full size: one at a time
    assert sweep.threads == 1 or (sweep.jobs == 1 and not path.stem.endswith("_cpu"))


@pytest.mark.slow
@pytest.mark.parametrize("path", RECIPE_SWEEPS, ids=[str(p.relative_to(ROOT)) for p in RECIPE_SWEEPS])
def test_every_recipe_sweep_row_resolves_with_fits_parser(path, monkeypatch):
    """Every run of every recipe sweep parses as fit parses it (nothing is built: no pretrained download)."""
    monkeypatch.setattr(sweep_module, "resolver", REAL_RESOLVER)
    sweep = load_sweep(path)
    runs = expect(sweep, runs_of(sweep), [], build=False)
    assert all(r.expected is not None and r.expected.max_steps >= 1 for r in runs)


STORED_TABLES = sorted(p for p in RECIPE_SWEEPS if p.with_suffix(".csv").is_file())


@pytest.mark.parametrize("path", STORED_TABLES, ids=[str(p.relative_to(ROOT)) for p in STORED_TABLES])
def test_every_stored_recipe_table_fits_its_sweep_file_for_check(path):
    """A recipe's ``<sweep>.csv`` (what ``--check`` compares with): its rows are rows of the sweep file, over
    all of the file's seeds, with every checked column and the machine the runs computed on."""
    sweep = load_sweep(path)
    stored = read_csv(sweep.check_table)
    assert stored and set(stored) <= {r.name for r in sweep.rows}
    checked = sweep.check_columns or [c.key for c in sweep.columns if c.checked]
    for name, row in stored.items():
        runs = int(row["seeds"]) + int(row["failed"])  # a reproducible divergence counts as failed
        assert (runs, row["missing"]) == (len(sweep.seeds), "0"), name
        if int(row["seeds"]):  # a row whose every run diverged has no values, only its failures
            # final/best always have values; a summary column may not (no noise: no epsilon)
            assert all(row.get(f"{key}_mean") for key in checked if key in ("final", "best")), name
            assert all(f"{key}_mean" in row for key in checked), name
        assert row["machine"].startswith("torch "), name


def test_the_readme_example_sweep_file_loads(tmp_path):
    text = (ROOT / "README.md").read_text()
    block = text[text.index("```yaml\nname: methods_x_splits") + len("```yaml\n") :]
    content = yaml.safe_load(block[: block.index("```")])
    (tmp_path / "configs").mkdir()
    shutil.copy(ROOT / "configs" / "fedavg_digits.yaml", tmp_path / "configs")
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(content))
    sweep = load_sweep(tmp_path / "s.yaml")
    assert [r.name for r in sweep.rows] == [
        "fedavg/dir0.1",
        "fedavg/path2",
        "fedprox/dir0.1",
        "fedprox/path2",
    ]
    assert sweep.rows[0].paper == {"": 76.0} and sweep.target == (None, 0.9)


def test_load_sweep_errors_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such sweep file"):
        load_sweep(tmp_path / "none.yaml")


# ------------------------------------------------------------------------------------------- real runs

TINY = """\
trainer:
  max_steps: 2
model:
  client:
    class_path: fl_lightning.ClientModule
    init_args:
      net:
        class_path: fl_lightning.models.MLP
        init_args: {in_features: 64, hidden: [16]}
  local_steps: 2
data:
  num_clients: 4
"""


def sweep_cli(folder: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "fl_lightning", "sweep", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.mark.slow
def test_a_2x2_grid_over_2_seeds_of_real_runs_then_a_second_start_runs_nothing(tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY)
    (tmp_path / "s.yaml").write_text(
        """\
base: tiny.yaml
seeds: [0, 1]
target: 0.2
grid:
  strategy:
    fedavg: {}
    fedprox: {args: [--model.strategy=FedProx, --model.strategy.mu=0.1]}
  lr:
    lr0.1: {}
    lr0.05: {args: [--model.client.init_args.lr=0.05]}
"""
    )
    first = sweep_cli(tmp_path, "s.yaml", "--jobs", "2")
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.stdout.count(" done    ") == 8
    out = tmp_path / "lightning_logs" / "sweeps" / "s"
    folders = {str(p.parent.relative_to(out)) for p in out.glob("*/*/seed*/lightning_logs")}
    assert folders == {
        f"{m}/{lr}/seed{s}" for m in ("fedavg", "fedprox") for lr in ("lr0.1", "lr0.05") for s in (0, 1)
    }
    table = read_csv(out / "results.csv")
    assert set(table) == {"fedavg/lr0.1", "fedavg/lr0.05", "fedprox/lr0.1", "fedprox/lr0.05"}
    for name, row in table.items():
        runs = [
            json.loads(p.read_text()) for p in out.glob(f"{name}/seed*/lightning_logs/version_0/summary.json")
        ]
        finals = [100 * r["final_global_acc"] for r in runs]
        assert float(row["final_mean"]) == pytest.approx(sum(finals) / 2)
        assert float(row["final_std"]) == pytest.approx(abs(finals[0] - finals[1]) / 2**0.5)
    config = yaml.safe_load((out / "fedprox/lr0.05/seed1/lightning_logs/version_0/config.yaml").read_text())
    assert config["seed_everything"] == 1 and config["model"]["client"]["init_args"]["lr"] == 0.05
    assert config["model"]["strategy"]["init_args"]["mu"] == 0.1
    assert config["model"]["threads_per_process"] == max(1, sweep_module.machine_cores() // 2)

    second = sweep_cli(tmp_path, "s.yaml", "--jobs", "2")
    assert second.returncode == 0 and second.stdout.count(" skipped ") == 8 and " start " not in second.stdout
    assert not list(out.glob("*/*/seed*/lightning_logs/version_1"))


@pytest.mark.slow
def test_an_interrupted_run_is_resumed_from_its_last_checkpoint(tmp_path):
    from fl_lightning.cli import main as cli_main

    (tmp_path / "tiny.yaml").write_text(TINY)
    (tmp_path / "s.yaml").write_text("base: tiny.yaml\ntarget: 0.0\nrows: [{name: r}]\n")
    run = tmp_path / "lightning_logs" / "sweeps" / "s" / "r" / "seed0"
    # a run interrupted after round 1: its last.ckpt, no summary
    cli_main(
        [
            "fit",
            f"--config={tmp_path / 'tiny.yaml'}",
            "--trainer.max_steps=1",
            "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={run}",
        ]
    )
    (run / "lightning_logs" / "version_0" / "summary.json").unlink()

    proc = sweep_cli(tmp_path, "s.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "resume  r seed 0 from lightning_logs/version_0/checkpoints/last.ckpt (1 of 2" in proc.stdout
    assert (
        "--ckpt_path=lightning_logs/sweeps/s/r/seed0/lightning_logs/version_0/checkpoints/last.ckpt"
        in (run / "fit.log").read_text()
    )
    summaries = sorted(run.glob("lightning_logs/version_*/summary.json"))
    assert len(summaries) == 1
    resumed = json.loads(summaries[0].read_text())
    assert (resumed["rounds"], resumed["rounds_this_run"]) == (2, 1)
    row = read_csv(run.parents[1] / "results.csv")["r"]
    assert row["rounds_to_target_mean"] == "1.0"  # round 1 is in the first version's scalars


@pytest.mark.slow
def test_a_smoke_run_of_a_row_is_resumed_to_the_sweeps_own_rounds_not_reported(tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY)
    (tmp_path / "s.yaml").write_text("base: tiny.yaml\nseeds: [0, 1]\nrows: [{name: a}, {name: b}]\n")
    smoke = sweep_cli(tmp_path, "s.yaml", "--rows", "a", "--seeds", "0", "--", "--trainer.max_steps=1")
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr
    full = sweep_cli(tmp_path, "s.yaml")
    assert full.returncode == 0, full.stdout + full.stderr
    assert "resume  a seed 0 from lightning_logs/version_0/checkpoints/last.ckpt (1 of 2 rounds done)" in (
        full.stdout
    )
    assert full.stdout.count(" start   ") == 3 and " skipped " not in full.stdout
    run = tmp_path / "lightning_logs" / "sweeps" / "s" / "a" / "seed0" / "lightning_logs" / "version_0"
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["rounds"], summary["max_steps"], summary["rounds_this_run"]) == (2, 2, 1)
    assert summary["run_wall_time_s"] > summary["wall_time_s"]  # the smoke start counts too

    changed = sweep_cli(tmp_path, "s.yaml", "--rows", "b", "--", "--model.client.init_args.lr=0.05")
    assert changed.returncode == 0, changed.stdout + changed.stderr
    assert changed.stdout.count("its config differs: model.client.init_args.lr: 0.1 -> 0.05") == 2
    again = sweep_cli(tmp_path, "s.yaml", "--report")
    table = read_csv(tmp_path / "lightning_logs" / "sweeps" / "s" / "results.csv")
    assert again.returncode == 0 and table["b"]["seeds"] == "2"  # the lr=0.1 runs, still there
