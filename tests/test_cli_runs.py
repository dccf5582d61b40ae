"""``fit``'s run folder: one per run (claimed atomically), a resume continues its own, an interrupted run
keeps its summary, TensorBoard's HPARAMS tab, checkpoints named by round, quiet output by default."""

import json
import logging
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.fabric.utilities.rank_zero import LightningDeprecationWarning
from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer
from tensorboard.plugins.hparams import metadata
from torch.utils.tensorboard import SummaryWriter

from fl_lightning.callbacks import FederatedSummary
from fl_lightning.cli import FederatedCLI, main
from fl_lightning.runs import read_scalars, read_summary

from conftest import run_folder
from programs import start_program

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "--trainer.enable_progress_bar=false",
    "--data.num_clients=4",
    "--model.local_steps=1",
]
#: A ModelCheckpoint keeping every round, whose "best" is the first round (the loss only falls).
EVERY_ROUND = [
    "--trainer.callbacks=lightning.pytorch.callbacks.ModelCheckpoint",
    "--trainer.callbacks.monitor=global/loss",
    "--trainer.callbacks.mode=max",
    "--trainer.callbacks.save_top_k=-1",
]


def run_cli(root: Path, *args: str) -> None:
    main([*args, f"--trainer.default_root_dir={root}"])


# ------------------------------------------------------------------------------------ one run, one folder
#: Run first by each ``fit`` process (:func:`programs.start_program`'s prelude, as ``python -c`` before
#: ``main``): its trainer (and run folder) is made only once both runs got there (``READY``: this run's file
#: beside the other's).
TOGETHER = """
import time
from pathlib import Path
from fl_lightning import cli
build = cli.FederatedCLI._instantiate_trainer
def together(self, config, callbacks):
    ready = Path(READY)
    ready.touch()
    waited = 0.0
    while len(list(ready.parent.glob("*.ready"))) < 2 and waited < 300:
        time.sleep(0.01)
        waited += 0.01
    return build(self, config, callbacks)
cli.FederatedCLI._instantiate_trainer = together
"""


@pytest.mark.slow
def test_two_fits_started_together_get_their_own_folders(tmp_path):
    """Both runs choose their folder at the same moment (a barrier before the Trainer is made), each in its
    own process (forked from the tests' preloaded server, :mod:`programs`: a new Python each cost 14 s of
    CPU here importing torch, Lightning and fl_lightning; the folder's claim is the same)."""
    (tmp_path / "barrier").mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = [
        start_program(
            ["fit", "--trainer.max_steps=2", *TINY, f"--seed_everything={s}"],
            cwd=tmp_path,
            env=env,
            prelude=f"READY = {str(tmp_path / 'barrier' / f'{s}.ready')!r}\n{TOGETHER}",
        )
        for s in (1, 2)
    ]
    done = [p.finish(timeout=600) for p in procs]
    assert [d.returncode for d in done] == [0, 0], [d.stderr[-3000:] for d in done]
    runs = sorted((tmp_path / "lightning_logs").iterdir())
    assert [r.name for r in runs] == ["version_0-fedavg-dirichlet", "version_1-fedavg-dirichlet"]
    seeds = set()
    for run in runs:
        assert read_summary(run)["rounds"] == 2
        assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 2
        assert len(list(run.glob("events.out.tfevents.*"))) == 1
        seeds |= {
            line for line in (run / "config.yaml").read_text().splitlines() if "seed_everything" in line
        }
    assert seeds == {"seed_everything: 1", "seed_everything: 2"}


def test_a_trainer_lightning_refuses_leaves_no_run_folder(tmp_path):
    with pytest.raises((SystemExit, MisconfigurationException)):  # the CLI may turn it into an error line
        run_cli(tmp_path, "fit", "--trainer.devices=0", "--trainer.accelerator=cpu")
    assert not (tmp_path / "lightning_logs").exists()


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """A 2-round run resumed to 3 rounds from its last.ckpt, then branched from round 1 (2 rounds)."""
    root = tmp_path_factory.mktemp("resumed")
    run_cli(root, "fit", "--trainer.max_steps=2", *TINY, *EVERY_ROUND)
    run = run_folder(root)
    stray = SummaryWriter(str(run))  # what a run killed in round 3 logged before its last.ckpt (round 2)
    stray.add_scalar("round/clients", 999.0, 3)
    stray.close()
    # the run's wall time as the checkpoint resumed from holds it (round=2.ckpt's is read a moment earlier)
    saved = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["callbacks"]
    (earlier,) = [v["run_wall_time_s"] for k, v in saved.items() if k.startswith("FederatedSummary")]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        args = ["fit", "--trainer.max_steps=3", *TINY, *EVERY_ROUND]
        resume = FederatedCLI(args=[*args, f"--ckpt_path={run / 'checkpoints' / 'last.ckpt'}"])
    branch = [f"--ckpt_path={run / 'checkpoints' / 'round=1.ckpt'}", f"--trainer.default_root_dir={root}"]
    run_cli(root, "fit", "--trainer.max_steps=2", *TINY, *EVERY_ROUND, *branch)
    return {
        "root": root,
        "run": run,
        "trainer": resume.trainer,
        "warnings": [str(w.message) for w in caught],
        "earlier_wall_time_s": earlier,
    }


def test_a_resumed_run_continues_in_its_own_folder_with_its_steps_going_on(resumed):
    run = resumed["run"]
    assert len(list(run.glob("events.out.tfevents.*"))) == 3  # one TensorBoard run, appended to
    scalars = read_scalars(run)
    assert [step for step, _ in scalars["global/acc"]] == [1, 2, 3]
    assert scalars["round/clients"] == [(1, 4.0), (2, 4.0), (3, 4.0)]  # the stray round 3 is dropped
    summary = read_summary(run)
    assert (summary["rounds"], summary["rounds_this_run"], summary["interrupted"]) == (3, 1, False)
    assert summary["max_steps"] == 3  # what this start was given: a sweep tells it from a shorter run
    # the run's wall time: this start's plus the first start's, up to the checkpoint resumed from
    assert summary["run_wall_time_s"] > summary["wall_time_s"] > 0
    earlier = resumed["earlier_wall_time_s"]
    assert summary["run_wall_time_s"] == pytest.approx(earlier + summary["wall_time_s"], abs=1e-6)
    assert summary["machine"]["torch"] == torch.__version__ and summary["machine"]["device"] == "cpu"
    assert summary["machine"]["cpu_kernels"] == torch.backends.cpu.get_cpu_capability()
    best = max(scalars["global/acc"], key=lambda p: p[1])
    assert summary["best_global_acc"] == pytest.approx(best[1]) and summary["best_round"] == best[0]
    assert not any("dirpath has changed" in w or "is not empty" in w for w in resumed["warnings"])


def test_a_resumed_run_keeps_model_checkpoint_best_tracking(resumed):
    (monitored,) = [c for c in resumed["trainer"].checkpoint_callbacks if c.monitor == "global/loss"]
    assert Path(monitored.best_model_path) == resumed["run"] / "checkpoints" / "round=1.ckpt"
    first_loss = read_scalars(resumed["run"])["global/loss"][0][1]
    assert float(monitored.best_model_score) == pytest.approx(first_loss)


def test_checkpoints_are_named_by_round(resumed):
    names = sorted(p.name for p in (resumed["run"] / "checkpoints").iterdir())
    assert names == ["last.ckpt", "round=1.ckpt", "round=2.ckpt", "round=3.ckpt"]
    assert torch.load(resumed["run"] / "checkpoints" / "round=2.ckpt", weights_only=True)["global_step"] == 2


def test_resuming_from_an_older_round_of_a_run_starts_a_new_folder(resumed):
    run, branch = resumed["run"], run_folder(resumed["root"], 1)
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 3  # kept
    assert torch.load(branch / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 2
    assert read_summary(branch)["rounds"] == 2 and read_summary(branch)["rounds_this_run"] == 1


def test_a_refused_resume_leaves_its_run_folder_as_it_was(tmp_path, capsys):
    run_cli(tmp_path, "fit", "--trainer.max_steps=1", *TINY)
    run = run_folder(tmp_path)
    before = sorted(p.name for p in run.iterdir())
    other = ["--trainer.max_steps=2", "--trainer.enable_progress_bar=false", "--data.num_clients=5"]
    with pytest.raises(SystemExit):
        run_cli(tmp_path, "fit", *other, f"--ckpt_path={run / 'checkpoints' / 'last.ckpt'}")
    assert "comes from a different config: data.num_clients" in capsys.readouterr().err
    assert sorted(p.name for p in run.iterdir()) == before
    assert [p.name for p in (tmp_path / "lightning_logs").iterdir()] == [run.name]


# ------------------------------------------------------------------------------------ interrupted runs
@pytest.mark.parametrize(
    ("how", "status", "rounds", "reason"),
    [
        ("fail", 1, 1, "RunError: round 1: every sampled client failed"),
        ("interrupt", 1, 1, "KeyboardInterrupt"),
        ("sigterm", 128 + signal.SIGTERM, 2, "SIGTERM"),
    ],
)
def test_an_interrupted_run_writes_its_summary_for_the_rounds_done(
    tmp_path, capsys, how, status, rounds, reason
):
    sigint = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit) as exit_info:
            run_cli(
                tmp_path,
                "fit",
                "--trainer.max_steps=4",
                *TINY,
                "--model.max_failed_rounds=1",
                "--model.strategy=fl_test_strategies.StopAt",
                "--model.strategy.round=1",
                f"--model.strategy.how={how}",
            )
    finally:
        signal.signal(signal.SIGINT, sigint)  # Lightning ignores further Ctrl-C after the first
    assert exit_info.value.code == status
    run = run_folder(tmp_path)
    summary = read_summary(run)
    assert summary["rounds"] == rounds and summary["interrupted"] is True
    assert summary["reason"].startswith(reason)
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == rounds
    out = capsys.readouterr().out
    assert (
        "fl_lightning summary (interrupted: " in out
        and f"--ckpt_path {run / 'checkpoints' / 'last.ckpt'}" in out
    )
    assert read_scalars(run)["summary/interrupted"] == [(rounds, 1.0)]


# ---------------------------------------------------------------------------------- TensorBoard's HPARAMS tab
def _hparams_plugin(run: Path) -> tuple[dict, list[str], list[str]]:
    """The hyperparameters, metric tags and the hyperparameter columns shown at first that TensorBoard's
    HPARAMS tab reads from a run folder.

    TensorBoard (2.21: ``backend_context._sort_and_reduce_to_hparams_limit`` and the tab's "display the
    first five") orders the experiment's hyperparameters by ``differs`` first, then by name, and shows the
    first five; the others are behind a checkbox each.
    """
    events = EventMultiplexer()
    events.AddRunsFromDirectory(str(run))
    events.Reload()
    (content,) = events.PluginRunToTagToContent(metadata.PLUGIN_NAME).values()
    start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
    experiment = metadata.parse_experiment_plugin_data(content[metadata.EXPERIMENT_TAG])
    params = {
        k: v.number_value if v.HasField("number_value") else v.string_value for k, v in start.hparams.items()
    }
    ordered = sorted(experiment.hparam_infos, key=lambda info: (not info.differs, info.name))
    return params, [m.name.tag for m in experiment.metric_infos], [info.name for info in ordered[:5]]


def test_the_hparams_tab_shows_the_config_and_the_summary_numbers(tmp_path):
    run_cli(
        tmp_path,
        "fit",
        "--trainer.max_steps=2",
        *TINY,
        "--model.strategy=FedProx",
        "--model.strategy.mu=0.25",
        "--model.participation=0.5",
        "--data.partition=IID",
    )
    run = run_folder(tmp_path)
    params, metric_tags, shown = _hparams_plugin(run)
    assert params["model.strategy"] == "FedProx" and params["model.strategy.mu"] == 0.25
    assert shown[:3] == ["model.strategy", "model.strategy.mu", "model.strategy.server_lr"]  # not hidden
    assert params["model.participation"] == 0.5 and params["model.local_steps"] == 1
    assert params["model.client.lr"] == pytest.approx(0.1) and params["data.partition"] == "IID"
    assert params["data.num_clients"] == 4 and params["seed_everything"] == 0
    assert "data.root" not in params  # where the data lives is not a hyperparameter
    summary = read_summary(run)
    assert {"summary/final_global_acc", "summary/best_global_acc", "summary/client_acc_mean"} <= set(
        metric_tags
    )
    scalars = read_scalars(run)
    assert scalars["summary/best_global_acc"] == [(2, pytest.approx(summary["best_global_acc"]))]
    assert scalars["summary/client_acc_mean"] == [(2, pytest.approx(summary["client_acc"]["mean"]))]
    hparams_yaml = (run / "hparams.yaml").read_text()
    assert "model.strategy.mu: 0.25" in hparams_yaml


# ------------------------------------------------------------------------------------ quiet by default
#: What Lightning prints in a default run that says nothing a federated run needs (hidden unless --verbose).
HIDDEN = [
    "Seed set to",
    "GPU available:",
    "TPU available:",
    "💡 Tip",
    "val_check_interval=1",
    "`Trainer.fit` stopped",
    "Epoch 0",
    "Validation",
    "v_num",
]
HIDDEN_ON_VALIDATE = [
    "Restoring states from the checkpoint",
    "Loaded model weights",
    "The dirpath has changed",
]


@pytest.fixture
def console(capfd, monkeypatch):
    """``read()``: ``(stdout, stderr and every warning issued)`` since the last read.

    Lightning's log handlers are pointed at the captured stderr (they hold the ``sys.stderr`` of the
    moment Lightning was imported), and the warnings a user would see are recorded however often they
    were issued before.
    """
    monkeypatch.setattr(sys, "argv", ["fl_lightning"])  # not pytest's (LightningCLI warns about both)
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        for handler in logging.getLogger(name).handlers:
            if type(handler) is logging.StreamHandler:
                monkeypatch.setattr(handler, "stream", sys.stderr)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # every warning a user sees, however often it was issued before
        warnings.filterwarnings("ignore", category=DeprecationWarning)  # hidden by Python's defaults...
        warnings.filterwarnings("always", category=LightningDeprecationWarning)  # ...Lightning's shown

        def read() -> tuple[str, str]:
            out, err = capfd.readouterr()
            issued = "\n".join(str(w.message) for w in caught)
            caught.clear()
            return out, err + issued

        yield read


def test_a_run_without_a_terminal_prints_a_line_per_tenth_and_the_summary(tmp_path, console):
    run_cli(tmp_path, "fit", "--trainer.max_steps=20", "--data.num_clients=4", "--model.local_steps=1")
    out, err = console()
    lines = out.splitlines()
    rounds = [line for line in lines if line.startswith("round ")]
    assert [line.split(":")[0] for line in rounds] == [f"round {r}/20" for r in range(2, 21, 2)]
    assert "global/acc" in rounds[-1] and "clients" not in rounds[-1]
    assert len(lines) == len(rounds) + 8 and err == ""  # and the summary's eight lines (machine too)
    assert [m for m in HIDDEN if m in out + err] == []
    run = run_folder(tmp_path)
    run_cli(tmp_path, "validate", f"--ckpt_path={run / 'checkpoints' / 'last.ckpt'}", "--data.num_clients=4")
    out, err = console()
    assert [m for m in HIDDEN_ON_VALIDATE if m in out + err] == [] and "global/acc" in out


def test_evaluating_a_run_from_the_command_line_gives_no_cli_warning(tmp_path, console, monkeypatch):
    """``validate`` of a run's checkpoint reads the run's config into the arguments it parses, while
    ``sys.argv`` holds the command: LightningCLI warned about "args" and "sys.argv" both given."""
    run_cli(tmp_path, "fit", "--trainer.max_steps=1", *TINY)
    ckpt = run_folder(tmp_path) / "checkpoints" / "last.ckpt"
    console()
    root = f"--trainer.default_root_dir={tmp_path}"
    argv = ["validate", f"--ckpt_path={ckpt}", "--data.num_clients=4", root]
    monkeypatch.setattr(sys, "argv", ["fl_lightning", *argv])
    main()
    out, err = console()
    assert "global/acc" in out and "args parameter" not in err and err == ""


def test_verbose_brings_back_lightnings_messages_and_a_line_per_round(tmp_path, console):
    run_cli(
        tmp_path, "fit", "--verbose", "--trainer.max_steps=3", "--data.num_clients=4", "--model.local_steps=1"
    )
    out, err = console()
    expected = [m for m in HIDDEN if m not in ("Epoch 0", "Validation", "v_num")]
    assert [m for m in expected if m not in out + err] == []
    rounds = [line.split(":")[0] for line in out.splitlines() if line.startswith("round ")]
    assert rounds == ["round 1/3", "round 2/3", "round 3/3"]
    run = run_folder(tmp_path)
    ckpt = f"--ckpt_path={run / 'checkpoints' / 'last.ckpt'}"
    run_cli(tmp_path, "validate", "--verbose", ckpt, "--data.num_clients=4")
    out, err = console()
    assert [m for m in HIDDEN_ON_VALIDATE if m not in out + err] == []


@pytest.mark.slow
def test_the_zero_config_run_without_a_terminal_prints_a_few_lines(tmp_path):
    """The real program (a new Python) with no option and no terminal: its progress lines and summary, no
    Lightning tips, notices or warnings (on stdout or stderr), and no line on stderr. The one run of ``fit``
    as a program in the suite (``tests/test_cli.py``'s programs stop at an error line)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "fl_lightning", "fit"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    lines = (proc.stdout + proc.stderr).splitlines()
    assert len(lines) <= 20, lines  # ten progress lines and the summary
    assert [m for m in HIDDEN if m in proc.stdout + proc.stderr] == []
    noise = ("Tip:", "TPU available", "GPU available", "val_check_interval=1", "deprecated", "Warning")
    assert [m for m in noise if m in proc.stdout + proc.stderr] == []
    assert lines[-8] == "fl_lightning summary" and proc.stderr == ""
    assert json.loads((run_folder(tmp_path) / "summary.json").read_text())["rounds"] == 40


def test_a_summary_callback_in_the_config_replaces_the_default_one(tmp_path):
    args = ["--trainer.max_steps=1", "--trainer.callbacks=fl_lightning.callbacks.FederatedSummary"]
    args.append(f"--trainer.default_root_dir={tmp_path}")
    cli_ = FederatedCLI(args=[*args, "--model.strategy=FedProx"], run=False)
    (summary,) = [c for c in cli_.trainer.callbacks if isinstance(c, FederatedSummary)]  # printed once
    assert summary.hparams["model.strategy"] == "FedProx"
