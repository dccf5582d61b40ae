"""Running a sweep: folders, seeds, threads, progress lines, Ctrl-C, the commands to do, real runs.

The quick tests launch a stand-in for ``fit`` (a few lines of Python that write a run folder as ``fit``
does, or fail, or wait); the slow ones run real ``fit`` processes on the embedded digits.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
import yaml
from sweep_helpers import (
    REAL_RESOLVER,
    TINY,
    checkpoint,
    craft_run,
    read_csv,
    summary,
    sweep_cli,
    write_sweep,
)

from fl_lightning.sweep import (
    collect,
    execute,
    expect,
    inspect_run,
    load_sweep,
    main,
    run_sweep,
    runner,
    runs_of,
)

from conftest import run_folder

pytest_plugins = ["sweep_helpers"]  # its fixtures (a plugin: not autouse, it would apply to every test)
pytestmark = pytest.mark.usefixtures("in_tmp_with_fake_resolver")  # each test in its own folder


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
    assert "done    good/m seed 1: final acc 81.00% (best on test 81.00%)" in out
    sweeps = tmp_path / "lightning_logs" / "sweeps" / "s"
    s = json.loads(
        (
            sweeps / "good" / "m" / "seed1" / "lightning_logs" / "version_0-good-m-seed1" / "summary.json"
        ).read_text()
    )
    assert s["argv"] == [
        "--config=base.yaml",
        "--config=base.yaml",
        "--name=good-m-seed1",  # the run folder and TensorBoard run read as the row
        "--trainer.enable_progress_bar=false",
        "--model.acc=0.5",
        "--model.acc=0.8",
        "--model.runtime.threads_per_process=2",  # 4 cores // 2 jobs
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


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_an_interrupted_sweep_stops_its_runs_and_says_how_to_resume(tmp_path, fake_fit, capsys, sigint):
    """Also from a process that ignores Ctrl-C (``sweep ... &`` in a script, ``nohup``; Lightning too after a
    fit's first Ctrl-C): the runs it starts take SIGINT as fit's graceful stop, as from a terminal."""
    path = write_sweep(
        tmp_path, {"base": "base.yaml", "args": ["--model.wait=60"], "seeds": [0, 1], "rows": [{"name": "r"}]}
    )
    sweep = load_sweep(path)
    runs = expect(sweep, runs_of(sweep), [])
    for run in runs:  # both failed on an earlier start
        run.folder.mkdir(parents=True)
        (run.folder / "sweep.json").write_text(json.dumps({"returncode": 2, "error": "error: old"}))
    previous = signal.getsignal(signal.SIGTERM)

    def stop_once_both_wait() -> None:  # SIGTERM once both runs wait (a fixed delay raced a slow start)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all((r.folder / "waiting").exists() for r in runs):
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    timer = threading.Thread(target=stop_once_both_wait, daemon=True)
    timer.start()
    before = signal.signal(
        signal.SIGINT, signal.SIG_IGN if sigint == "ignored" else signal.default_int_handler
    )
    try:
        outcome, interrupted = execute(sweep, runs, jobs=2, threads=1, extra=[])
    finally:
        signal.signal(signal.SIGINT, before)
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
    base = "--trainer.enable_progress_bar=false --model.runtime.threads_per_process=2 "
    assert lines == [
        cd + "--name=r-seed1 " + base + f"--seed_everything=1 --trainer.default_root_dir={out}/seed1 "
        f"--ckpt_path={out}/seed1/lightning_logs/version_0/checkpoints/last.ckpt",
        cd + "--name=r-seed2 " + base + f"--seed_everything=2 --trainer.default_root_dir={out}/seed2",
    ]
    assert "# 2 of 3 runs to do" in captured.err
    assert not (out / "seed2").exists()  # nothing ran


def test_a_sweep_without_base_runs_the_zero_config_fit(tmp_path, fake_fit, capsys):
    path = write_sweep(tmp_path, {"rows": [{"name": "default"}, {"name": "prox", "args": ["--model.mu=1"]}]})
    assert [r.configs for r in load_sweep(path).rows] == [(), ()]
    assert run_sweep([str(path)]) == 0
    assert capsys.readouterr().out.count(" done    ") == 2


def test_row_arguments_fit_would_refuse_stop_the_sweep_before_any_run(
    tmp_path, fake_fit, capsys, monkeypatch
):
    monkeypatch.setattr(runner, "resolver", REAL_RESOLVER)
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


def test_a_row_and_a_run_folder_with_the_runtime_as_spelled_before_are_the_sweeps_runs(tmp_path, monkeypatch):
    """A row that sets ``--model.vectorize=4`` (the runtime's knob before ``model.runtime``) is the run of
    ``--model.runtime.vectorize=4``, and a run folder whose config.yaml has the knobs at the model's level
    (written before) is that run, finished: a sweep started again finds what it did before."""
    monkeypatch.setattr(runner, "resolver", REAL_RESOLVER)
    rows = [
        {"name": "new", "args": ["--model.runtime.vectorize=4", "--model.runtime.vectorize_cpu=batched"]},
        {"name": "old", "args": ["--model.vectorize=4", "--model.vectorize_cpu=batched"]},
    ]
    sweep = load_sweep(write_sweep(tmp_path, {"args": ["--trainer.max_steps=3"], "rows": rows}))
    new, old = expect(sweep, runs_of(sweep), [], build=False)
    assert old.expected.digest == new.expected.digest
    assert new.expected.config["model"]["runtime"]["vectorize"] == 4
    config = new.expected.config
    former = {**config, "model": {**config["model"], **config["model"]["runtime"]}}
    del former["model"]["runtime"]  # the config.yaml of a run done before model.runtime
    version = old.folder / "lightning_logs" / "version_0"
    version.mkdir(parents=True)
    (version / "config.yaml").write_text(yaml.safe_dump(former))
    (version / "summary.json").write_text(json.dumps(summary(0.9, 0.9)))
    state = inspect_run(old.folder, old.expected)
    assert (state.kind, state.version) == ("finished", version)
    former["model"]["vectorize"] = 2
    (version / "config.yaml").write_text(yaml.safe_dump(former))
    state = inspect_run(old.folder, old.expected)
    assert state.kind == "rerun" and state.why == "its config differs: model.runtime.vectorize: 2 -> 4"


@pytest.mark.slow
def test_a_2x1_grid_over_2_seeds_of_real_runs_then_a_second_start_runs_nothing(tmp_path):
    """Real ``fit`` processes (4: each costs seconds of imports; the grid's product and names are checked
    with the stand-in above): rows from two axes, seeds, the table's mean and spread, the arguments each
    run got, then nothing to do."""
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
    lr0.05: {args: [--model.client.init_args.lr=0.05]}
"""
    )
    first = sweep_cli(tmp_path, "s.yaml", "--jobs", "2")
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.stdout.count(" done    ") == 4
    out = tmp_path / "lightning_logs" / "sweeps" / "s"
    folders = {str(p.parent.relative_to(out)) for p in out.glob("*/*/seed*/lightning_logs")}
    assert folders == {f"{m}/lr0.05/seed{s}" for m in ("fedavg", "fedprox") for s in (0, 1)}
    table = read_csv(out / "results.csv")
    assert set(table) == {"fedavg/lr0.05", "fedprox/lr0.05"}
    for name, row in table.items():
        label = name.replace("/", "-")  # each run's folder carries its row's name and seed
        folders = [out / name / f"seed{s}" / "lightning_logs" / f"version_0-{label}-seed{s}" for s in (0, 1)]
        runs = [json.loads((f / "summary.json").read_text()) for f in folders]
        finals = [100 * r["final_global_acc"] for r in runs]
        assert float(row["final_mean"]) == pytest.approx(sum(finals) / 2)
        assert float(row["final_std"]) == pytest.approx(abs(finals[0] - finals[1]) / 2**0.5)
    run = out / "fedprox/lr0.05/seed1/lightning_logs/version_0-fedprox-lr0.05-seed1"
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["name"] == "fedprox-lr0.05-seed1"
    assert config["seed_everything"] == 1 and config["model"]["client"]["init_args"]["lr"] == 0.05
    assert config["model"]["strategy"]["init_args"]["mu"] == 0.1
    assert config["model"]["runtime"]["threads_per_process"] == max(1, runner.machine_cores() // 2)

    second = sweep_cli(tmp_path, "s.yaml", "--jobs", "2")
    assert second.returncode == 0 and second.stdout.count(" skipped ") == 4 and " start " not in second.stdout
    assert not list(out.glob("*/*/seed*/lightning_logs/version_1*"))


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
    first = run_folder(run)  # labelled by its strategy and split (fit's default), not by the sweep
    (first / "summary.json").unlink()

    proc = sweep_cli(tmp_path, "s.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"resume  r seed 0 from lightning_logs/{first.name}/checkpoints/last.ckpt (1 of 2" in proc.stdout
    assert (
        f"--ckpt_path=lightning_logs/sweeps/s/r/seed0/lightning_logs/{first.name}/checkpoints/last.ckpt"
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
    (tmp_path / "s.yaml").write_text("base: tiny.yaml\nseeds: [0, 1]\nrows: [{name: a}]\n")  # 5 real fits
    smoke = sweep_cli(tmp_path, "s.yaml", "--rows", "a", "--seeds", "0", "--", "--trainer.max_steps=1")
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr
    full = sweep_cli(tmp_path, "s.yaml")
    assert full.returncode == 0, full.stdout + full.stderr
    assert "resume  a seed 0 from lightning_logs/version_0-a-seed0/checkpoints/last.ckpt (1 of 2 rounds" in (
        full.stdout
    )
    assert full.stdout.count(" start   ") == 1 and " skipped " not in full.stdout  # seed 1
    run = (
        tmp_path / "lightning_logs" / "sweeps" / "s" / "a" / "seed0" / "lightning_logs" / "version_0-a-seed0"
    )
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["rounds"], summary["max_steps"], summary["rounds_this_run"]) == (2, 2, 1)
    assert summary["run_wall_time_s"] > summary["wall_time_s"]  # the smoke start counts too

    changed = sweep_cli(tmp_path, "s.yaml", "--rows", "a", "--", "--model.client.init_args.lr=0.05")
    assert changed.returncode == 0, changed.stdout + changed.stderr
    assert changed.stdout.count("its config differs: model.client.init_args.lr: 0.1 -> 0.05") == 2
    again = sweep_cli(tmp_path, "s.yaml", "--report")
    table = read_csv(tmp_path / "lightning_logs" / "sweeps" / "s" / "results.csv")
    assert again.returncode == 0 and table["a"]["seeds"] == "2"  # the lr=0.1 runs, still there
