"""What the sweep tests share: a stand-in for ``fit``, crafted run folders, sweep files, tables, and the
fixtures (each test module loads them with ``pytest_plugins``: a ``conftest.py`` here would shadow the
suite's own, which other test modules import as ``conftest``)."""

from __future__ import annotations

import csv
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from torch.utils.tensorboard import SummaryWriter

from fl_lightning.sweep import Expected, command, config_digest, runner

from programs import run_program

ROOT = Path(__file__).resolve().parents[2]


def fake_config(argv: list[str]) -> dict:
    """What the stand-ins resolve ``fit`` arguments to (the sweep's view, and the ``config.yaml`` the fake
    ``fit`` writes): the seed, ``trainer.max_steps`` (default 3) and the ``--model.*`` options; config
    files, folders and threads are left out, as :data:`fl_lightning.sweep.NOT_DIGESTED` leaves them out."""
    opts = dict(str(a)[2:].split("=", 1) for a in argv if str(a).startswith("--") and "=" in str(a))
    model = {
        k[6:]: v
        for k, v in opts.items()
        if k.startswith("model.") and k != "model.runtime.threads_per_process"
    }
    steps = int(opts.get("trainer.max_steps", 3))
    seed = int(opts.get("seed_everything", 0))
    return {"seed_everything": seed, "trainer": {"max_steps": steps}, "model": model}


#: Stands in for ``python -m fl_lightning fit``: writes ``version_N-<--name>/{config.yaml,summary.json}`` with
#: ``final_global_acc = --model.acc + seed / 100``, or fails (``--model.fail``), or waits (``--model.wait``).
FAKE_FIT = (
    inspect.getsource(fake_config)
    + r"""
import json, os, sys, time
opts = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
if "model.wait" in opts:
    try:
        open(os.path.join(opts["trainer.default_root_dir"], "waiting"), "w").close()  # for the test's signal
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
run = os.path.join(root, f"version_{n}" + (f"-{opts['name']}" if opts.get("name") else ""))
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
REAL_RESOLVER = runner.resolver


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


def craft_run(
    folder: Path,
    summary: dict,
    max_steps: int = 3,
    acc_curve: list[float] | None = None,
    version: int = 0,
    model: dict | None = None,
    label: str | None = None,
) -> Path:
    """A run folder as ``fit`` leaves it, ``version_<version>[-<label>]``: config.yaml (as :func:`fake_config`
    resolves the run's arguments: its seed from the folder's name, ``model``'s options), summary.json and
    TensorBoard scalars."""
    run = folder / "lightning_logs" / (f"version_{version}" + (f"-{label}" if label else ""))
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


def expected(max_steps: int = 3, model: dict | None = None, seed: int = 0) -> Expected:
    """What a run resolves to, as :func:`fake_config` gives it (``craft_run`` writes the same)."""
    config = {"seed_everything": seed, "trainer": {"max_steps": max_steps}, "model": model or {}}
    return Expected(config_digest(config), max_steps, config)


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
    """``python -m fl_lightning sweep *args`` in ``folder``, forked, and so are the ``python -m fl_lightning
    fit`` processes it starts (:mod:`programs`)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return run_program(["sweep", *args], cwd=folder, env=env, timeout=900, fork_programs=True)


@pytest.fixture
def in_tmp_with_fake_resolver(tmp_path, monkeypatch):
    """Every test starts in ``tmp_path`` (a sweep's default ``out`` is under the current folder), and
    the sweep resolves run arguments with :func:`fake_config` (tests of the real parser restore it)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(runner, "resolver", lambda root: lambda args, check: fake_config(args))


@pytest.fixture
def fake_fit(tmp_path, monkeypatch):
    """Every process the sweep launches runs :data:`FAKE_FIT` with the sweep's ``fit`` arguments."""
    script = tmp_path / "fake_fit.py"
    script.write_text(FAKE_FIT)
    real = subprocess.Popen

    def popen(cmd, **kw):
        assert cmd[1:4] == ["-m", "fl_lightning", "fit"]
        return real([sys.executable, str(script), *cmd[4:]], **kw)

    monkeypatch.setattr(runner.subprocess, "Popen", popen)
    monkeypatch.setattr(command, "machine_cores", lambda: 4)
