"""``python -m fl_lightning``: LightningCLI subcommands, overrides, configs and one-line errors."""

import errno
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fl_lightning.cli import FederatedCLI, main
from fl_lightning.server import FederatedModule

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").rglob("*.yaml"))
FAST = ["--trainer.max_steps=2", "--trainer.enable_progress_bar=false", "--data.num_clients=4"]


def run_cli(tmp_path, *args: str) -> None:
    main([*args, f"--trainer.default_root_dir={tmp_path}"])


def test_fit_writes_tensorboard_logs_config_and_summary(tmp_path, capsys):
    run_cli(
        tmp_path, "fit", *FAST, "--model.local_steps=2", "--model.strategy=FedProx", "--model.strategy.mu=0.1"
    )
    version = tmp_path / "lightning_logs" / "version_0"
    assert list(version.glob("events.out.tfevents.*"))
    config = (version / "config.yaml").read_text()
    assert "FedProx" in config and "mu: 0.1" in config
    summary = json.loads((version / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["bytes_up"] > 0
    out = capsys.readouterr().out
    assert "fl_lightning summary" in out and "per-client accuracy (4 clients)" in out


def test_print_config_and_help_document_every_knob(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_cli(tmp_path, "fit", "--print_config")
    assert exit_info.value.code == 0
    printed = capsys.readouterr().out
    for key in (
        "participation:",
        "clients_per_round:",
        "lr_decay:",
        "class_path: fl_lightning.strategies.FedAvg",
        "class_path: fl_lightning.data.Dirichlet",
        "max_steps: 40",
    ):
        assert key in printed, key
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    helptext = capsys.readouterr().out
    assert "Fraction of clients sampled per round" in helptext and "--data.partition" in helptext


def test_validate_and_test_subcommands_from_a_checkpoint(tmp_path, capsys):
    run_cli(tmp_path, "fit", *FAST, "--model.local_steps=2")
    ckpt = next((tmp_path / "lightning_logs" / "version_0" / "checkpoints").glob("*.ckpt"))
    run_cli(tmp_path, "validate", "--data.num_clients=4", f"--ckpt_path={ckpt}")
    run_cli(tmp_path, "test", "--data.num_clients=4", f"--ckpt_path={ckpt}")
    out = capsys.readouterr().out
    assert "global/acc" in out and "test/acc" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model.participation=1.5"], "error: model.participation=1.5 must be in (0, 1]"),
        (["--data.partition.alpha=-1"], "error: data.partition.alpha=-1.0 must be > 0"),
        (["--data.dataset=foo"], "error: data.dataset='foo' is unknown"),
        (["--data.num_clients=5000"], "error: data.num_clients=5000 exceeds the 1437 training samples"),
        (["--model.strategy=FedFoo"], "error: model.strategy: 'FedFoo' is not a known strategy"),
        (["--model.clients_per_round=20"], "error: model.clients_per_round=20 must be between 1 and"),
    ],
)
def test_bad_input_is_a_one_line_error_naming_the_field(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        run_cli(tmp_path, "fit", "--trainer.max_steps=1", "--trainer.enable_progress_bar=false", *args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith(message), err


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert "Traceback" not in err and "usage:" not in err and "tip:" not in err, err
    assert [line for line in lines if line.startswith("error:")] == lines[-1:], err
    return lines[-1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model.client.init_args.momentum=-1"], "error: model.client.momentum=-1.0 must be in [0, 1)"),
        (["--model.client.init_args.weight_decay=-1"], "error: model.client.weight_decay=-1.0 must be >= 0"),
        (["--model.grad_clip_norm=-1"], "error: model.grad_clip_norm=-1.0 must be > 0"),
        (["--model.seed=-1"], "error: model.seed=-1 must be >= 0"),
        (["--data.seed=-1"], "error: data.seed=-1 must be >= 0"),
        (["--data.eval_batch_size=0"], "error: data.eval_batch_size=0 must be >= 1"),
        (["--seed_everything=-1"], "error: seed_everything=-1 must be in [0, 4294967295]"),
        (
            ["--model.strategy=FedProx", "--model.strategy.mu=.nan"],
            "error: model.strategy.mu=nan must be a finite",
        ),
    ],
)
def test_bad_numbers_are_one_line_errors(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        run_cli(tmp_path, "fit", "--trainer.max_steps=1", "--trainer.enable_progress_bar=false", *args)
    assert exit_info.value.code == 2
    assert _one_error_line(capsys).startswith(message)


def test_nan_lr_in_a_yaml_config_is_one_line(tmp_path, capsys):
    config = tmp_path / "nan.yaml"
    config.write_text("model:\n  client:\n    init_args:\n      lr: .nan\n")
    with pytest.raises(SystemExit) as exit_info:
        run_cli(tmp_path, "fit", f"--config={config}", "--trainer.max_steps=1")
    assert exit_info.value.code == 2
    assert _one_error_line(capsys) == "error: model.client.lr=nan must be a finite number > 0; e.g. 0.05"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model.client.init_args.lr=abc"], "error: model.client.lr: Expected a <class 'float'>"),
        (["--model.strategy=FedProx", "--model.strategy.mu=abc"], "error: model.strategy.mu: Expected a"),
        (["--nope=1"], "error: unrecognized arguments: --nope=1"),
    ],
)
def test_parse_errors_are_one_line_without_usage(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        run_cli(tmp_path, "fit", *args)
    assert exit_info.value.code == 2
    assert _one_error_line(capsys).startswith(message)


def test_a_yaml_syntax_error_names_the_file_and_line(tmp_path, capsys):
    config = tmp_path / "bad.yaml"
    config.write_text("model:\n  client:\n    init_args:\n      lr: [1\n  foo: : bar\n")
    with pytest.raises(SystemExit) as exit_info:
        run_cli(tmp_path, "fit", "--config", str(config))
    assert exit_info.value.code == 2
    assert _one_error_line(capsys).startswith(f"error: {config}: YAML syntax error at line 5, column 6:")


@pytest.mark.parametrize("where", ["file", "under_file", "proc"])
def test_an_unwritable_log_folder_is_one_line(tmp_path, capsys, where):
    afile = tmp_path / "afile"
    afile.write_text("")
    root = {"file": afile, "under_file": afile / "sub", "proc": Path("/proc/fl_lightning_x")}[where]
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--trainer.max_steps=1", f"--trainer.default_root_dir={root}"])
    assert exit_info.value.code == 2
    line = _one_error_line(capsys)
    assert line.startswith(f"error: trainer.default_root_dir={root}") and "choose a writable folder" in line


def test_a_full_disk_is_one_line(tmp_path, capsys, monkeypatch):
    def full(self, batch, batch_idx):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "events.out"))

    monkeypatch.setattr(FederatedModule, "training_step", full)
    with pytest.raises(SystemExit) as exit_info:
        run_cli(tmp_path, "fit", *FAST)
    assert exit_info.value.code == 1
    line = _one_error_line(capsys)
    assert line.startswith(f"error: no space left on the device writing {tmp_path / 'events.out'}")


def test_clients_failing_every_round_stop_the_cli_with_one_line(tmp_path, capsys, monkeypatch):
    # main() binds its log handler to this test's captured stdout, not an earlier test's (closed) one
    monkeypatch.setattr(logging.getLogger("fl_lightning"), "handlers", [])
    with pytest.raises(SystemExit) as exit_info:
        run_cli(
            tmp_path,
            "fit",
            *FAST,
            "--trainer.max_steps=5",
            "--model.local_steps=1",
            "--model.max_failed_rounds=2",
            "--model.strategy=fl_test_strategies.FailOn",
            "--model.strategy.raise_on=[0,1,2,3]",
        )
    assert exit_info.value.code == 1
    line = _one_error_line(capsys)
    assert line.startswith("error: round 1: every sampled client failed for 2 consecutive rounds")
    assert "RuntimeError: deliberate failure" in line


def test_predict_returns_the_global_models_predictions(tmp_path):
    cli = FederatedCLI(
        args=[
            "predict",
            "--data.num_clients=4",
            "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={tmp_path}",
        ],
    )
    module, dm = cli.model, cli.datamodule
    batches = cli.trainer.predict_loop.predictions
    preds = torch.cat([b["predictions"] for b in batches])
    assert preds.shape == dm.splits.test_y.shape
    with torch.no_grad():
        assert torch.equal(preds, module.client(dm.splits.test_x).argmax(dim=1))


def test_resume_with_a_different_config_is_refused(tmp_path, capsys):
    run_cli(tmp_path, "fit", *FAST, "--model.local_steps=1")
    ckpt = next((tmp_path / "lightning_logs" / "version_0" / "checkpoints").glob("*.ckpt"))
    with pytest.raises(SystemExit):
        run_cli(tmp_path, "fit", "--trainer.max_steps=3", "--data.num_clients=5", f"--ckpt_path={ckpt}")
    assert (
        "error: ckpt_path: the checkpoint comes from a different config: data.num_clients"
        in capsys.readouterr().err
    )


def test_module_entry_point_runs_as_a_program(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "fl_lightning", "fit", "--model.participation=0"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: model.participation=0.0 must be in (0, 1]")


def _complete(path: Path) -> bool:
    return "\ntrainer:" in "\n" + path.read_text()


def _base_for(piece: Path) -> list[str]:
    """A piece (no trainer: section) is parsed on top of a complete config of its paper's folder."""
    if _complete(piece):
        return []
    for folder in (piece.parent, piece.parent.parent):
        complete = sorted(c for c in folder.glob("*_cpu.yaml") if _complete(c))
        if complete:
            return [f"--config={complete[0]}"]
    return []


@pytest.mark.parametrize("config", CONFIGS, ids=[str(c.relative_to(ROOT)) for c in CONFIGS])
def test_every_config_parses(config, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_cli(tmp_path, "fit", *_base_for(config), f"--config={config}", "--print_config")
    assert exit_info.value.code == 0


# Complete CPU-size configs (pieces meant to be composed with another --config have no trainer: section).
CPU_CONFIGS = [
    c
    for c in CONFIGS
    if (c.stem.endswith("_cpu") or c.stem.endswith("_digits"))
    and _complete(c)
    # FLAIR configs read the HDF5 file recipes/fedcog/prepare_flair.py writes (tests/data/test_flair.py
    # covers the loader on a tiny file in the same layout)
    and "dataset: flair" not in c.read_text()
]


@pytest.mark.parametrize("config", CPU_CONFIGS, ids=[str(c.relative_to(ROOT)) for c in CPU_CONFIGS])
def test_every_cpu_config_runs_a_round(config, tmp_path):
    run_cli(
        tmp_path,
        "fit",
        f"--config={config}",
        "--trainer.max_steps=1",
        "--trainer.enable_progress_bar=false",
        "--model.eval_clients_every=0",
    )
    assert list((tmp_path / "lightning_logs").rglob("summary.json"))
