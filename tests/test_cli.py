"""``python -m fl_lightning``: LightningCLI subcommands, overrides, configs and one-line errors."""

import errno
import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from fl_lightning.cli import FederatedCLI, main
from fl_lightning.lightning.checkpoint import AtomicCheckpointIO, LastRoundCheckpoint
from fl_lightning.lightning.module import FederatedModule
from fl_lightning.runs import read_scalars

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


def test_model_attack_is_off_by_default_and_printed_with_its_fields(tmp_path, capsys):
    with pytest.raises(SystemExit):
        run_cli(tmp_path, "fit", "--print_config")
    assert "\n  attack: null\n" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        run_cli(tmp_path, "fit", "--print_config", "--model.attack.kind=scale", "--model.attack.scale=5")
    printed = capsys.readouterr().out
    assert "attack:\n    kind: scale\n    fraction: 0.2\n    scale: 5.0\n" in printed
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    assert "Simulated malicious clients" in capsys.readouterr().out


def test_print_config_shows_the_default_network_and_client_defaults(tmp_path, capsys):
    with pytest.raises(SystemExit):
        run_cli(tmp_path, "fit", "--print_config")
    printed = capsys.readouterr().out
    model = printed[printed.index("\nmodel:") :]
    client = model[: model.index("\n  strategy:")]
    assert "class_path: fl_lightning.models.SmallCNN" in client and "net: null" not in client
    assert "lr: 0.1" in client and "momentum: 0.9" in client


def _cli(*args: str) -> FederatedCLI:
    return FederatedCLI(args=[*args, "--trainer.logger=false"], run=False)


def test_seed_everything_is_the_one_seed_and_data_seed_can_pin_the_split():
    cli = _cli("--seed_everything=3")
    assert (cli.model.seed, cli.datamodule.seed) == (3, 3)
    pinned = _cli("--seed_everything=3", "--data.seed=1")
    assert (pinned.model.seed, pinned.datamodule.seed) == (3, 1)
    assert pinned.config["data.seed"] == 1 and cli.config["data.seed"] is None  # config.yaml keeps null
    drawn = _cli("--seed_everything=true")
    assert drawn.model.seed == drawn.datamodule.seed == drawn.config["seed_everything"]


def test_a_config_file_model_seed_must_equal_seed_everything(tmp_path, capsys):
    old = tmp_path / "old.yaml"  # configs and run config.yaml files written before the link
    old.write_text("seed_everything: 4\nmodel:\n  seed: 4\ndata:\n  seed: 4\n")
    cli = _cli(f"--config={old}")
    assert (cli.model.seed, cli.datamodule.seed) == (4, 4)
    other = tmp_path / "other.yaml"
    other.write_text("seed_everything: 0\nmodel:\n  seed: 5\n")
    with pytest.raises(SystemExit) as exit_info:
        run_cli(tmp_path, "fit", f"--config={other}", "--trainer.max_steps=1")
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert lines == [
        f"error: model.seed=5 in {other}: model.seed is seed_everything (linked); "
        "set seed_everything: 5 and remove model.seed"
    ]


def test_validate_and_test_subcommands_from_a_checkpoint(tmp_path, capsys):
    run_cli(tmp_path, "fit", *FAST, "--model.local_steps=2")
    ckpt = next((tmp_path / "lightning_logs" / "version_0" / "checkpoints").glob("*.ckpt"))
    run_cli(tmp_path, "validate", "--data.num_clients=4", f"--ckpt_path={ckpt}")
    run_cli(tmp_path, "test", "--data.num_clients=4", f"--ckpt_path={ckpt}")
    out = capsys.readouterr().out
    assert "global/acc" in out and "test/acc" in out
    # no new version_N: each evaluation is a sub-run of the checkpoint's run, at step = its rounds
    assert [p.name for p in (tmp_path / "lightning_logs").iterdir()] == ["version_0"]
    for sub, tag in (("validate", "global/acc"), ("test", "test/acc")):
        assert [step for step, _ in read_scalars(tmp_path / "lightning_logs" / "version_0" / sub)[tag]] == [2]
    elsewhere = tmp_path / "elsewhere.ckpt"
    shutil.copy(ckpt, elsewhere)
    run_cli(tmp_path, "test", "--data.num_clients=4", f"--ckpt_path={elsewhere}")
    assert sorted(p.name for p in (tmp_path / "lightning_logs" / "version_0").iterdir() if p.is_dir()) == [
        "checkpoints",
        "test",
        "validate",
    ]
    assert "test/acc" in capsys.readouterr().out and not (tmp_path / "config.yaml").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model.participation=1.5"], "error: model.participation=1.5 must be in (0, 1]"),
        (["--data.partition.alpha=-1"], "error: data.partition.alpha=-1.0 must be > 0"),
        (["--data.dataset=foo"], "error: data.dataset='foo' is unknown"),
        (["--data.num_clients=5000"], "error: data.num_clients=5000 exceeds the 1437 training samples"),
        (["--model.strategy=FedFoo"], "error: model.strategy: 'FedFoo' is not a known strategy"),
        (["--model.clients_per_round=20"], "error: model.clients_per_round=20 must be between 1 and"),
        (["--model.seed=3"], 'error: Linked "model.seed" must be given via "seed_everything"'),
        (
            ["--trainer.gradient_clip_val=1"],
            "error: trainer.gradient_clip_val=1",
        ),
        (["--trainer.accumulate_grad_batches=4"], "error: trainer.accumulate_grad_batches=4 does not apply"),
        (
            ["--trainer.max_epochs=5"],
            "error: trainer.max_epochs=5: one epoch holds all rounds; set trainer.max_steps",
        ),
    ],
)
def test_bad_input_is_a_one_line_error_naming_the_field(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        run_cli(tmp_path, "fit", "--trainer.max_steps=1", "--trainer.enable_progress_bar=false", *args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith(message), err
    assert not list(tmp_path.glob("lightning_logs/version_*")), "a failed run left a run folder"


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
        (["--data.seed=-1"], "error: data.seed=-1 must be >= 0"),
        (["--data.eval_batch_size=0"], "error: data.eval_batch_size=0 must be >= 1"),
        (["--seed_everything=-1"], "error: seed_everything=-1 must be in [0, 4294967295]"),
        (
            ["--model.strategy=FedProx", "--model.strategy.mu=.nan"],
            "error: model.strategy.mu=nan must be a finite",
        ),
        (["--model.attack.fraction=1.5"], "error: model.attack.fraction=1.5 must be in [0, 1]"),
        (["--model.attack.scale=0"], "error: model.attack.scale=0.0 must be > 0"),
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
    assert _one_error_line(capsys) == "error: model.client.lr=nan must be a finite number > 0; e.g. 0.1"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model.client.init_args.lr=abc"], "error: model.client.lr: Expected a <class 'float'>"),
        (["--model.strategy=FedProx", "--model.strategy.mu=abc"], "error: model.strategy.mu: Expected a"),
        (["--nope=1"], "error: unrecognized arguments: --nope=1"),
        (
            ["--model.attack.kind=noise"],
            "error: model.attack.kind: Expected a typing.Literal['sign_flip', 'scale']",
        ),
        (["--model.attack={kind: scale, ratio: 1}"], "error: model.attack: Option 'ratio' is not accepted"),
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


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A 2-round zero-config run (FAST): its log folder."""
    root = tmp_path_factory.mktemp("run")
    run_cli(root, "fit", *FAST, "--model.local_steps=1")
    return root / "lightning_logs" / "version_0"


def test_zero_config_run_writes_last_ckpt_for_resume(finished_run, tmp_path):
    last = finished_run / "checkpoints" / "last.ckpt"
    assert [p.name for p in last.parent.iterdir()] == ["last.ckpt"]
    assert torch.load(last, weights_only=True)["global_step"] == 2
    run = shutil.copytree(finished_run, tmp_path / "copy" / "version_0")  # the fixture's run stays as it is
    ckpt = run / "checkpoints" / "last.ckpt"
    run_cli(
        tmp_path, "fit", *FAST[1:], "--model.local_steps=1", "--trainer.max_steps=3", f"--ckpt_path={ckpt}"
    )
    assert torch.load(ckpt, weights_only=True)["global_step"] == 3  # the run goes on in its own folder
    assert not (tmp_path / "lightning_logs").exists()


def test_last_ckpt_is_the_last_round_with_a_monitored_save_last_checkpoint(tmp_path, caplog):
    # round/clients is constant: a monitored ModelCheckpoint saves round 1 only, and Lightning 2.6
    # rewrites its last.ckpt only when it saves; the CLI writes last.ckpt after every round instead
    run_cli(
        tmp_path,
        "fit",
        *FAST[1:],
        "--trainer.max_steps=3",
        "--model.local_steps=1",
        "--trainer.callbacks=lightning.pytorch.callbacks.ModelCheckpoint",
        "--trainer.callbacks.monitor=round/clients",
        "--trainer.callbacks.mode=max",
        "--trainer.callbacks.save_last=true",
    )
    folder = tmp_path / "lightning_logs" / "version_0" / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt", "round=1.ckpt"]
    assert torch.load(folder / "last.ckpt", weights_only=True)["global_step"] == 3
    assert "ModelCheckpoint(save_last=True) would rewrite last.ckpt only" in caplog.text


def test_the_cli_installs_atomic_checkpoint_io_and_last_round_checkpoint():
    cli = FederatedCLI(args=["--trainer.max_steps=1"], run=False)
    assert isinstance(cli.trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    assert sum(isinstance(c, LastRoundCheckpoint) for c in cli.trainer.callbacks) == 1
    cli = FederatedCLI(args=["--trainer.enable_checkpointing=false"], run=False)
    assert not [c for c in cli.trainer.callbacks if isinstance(c, ModelCheckpoint)]


class NotAllowed:
    """A class torch's weights_only unpickler refuses."""


@pytest.mark.parametrize("subcommand", ["fit", "validate"])
@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("missing", None),
        ("empty", b""),
        ("truncated", "truncated"),
        ("random", bytes(range(256)) * 20),
        ("tensor", torch.zeros(3)),
        ("object", {"state_dict": {}, "x": NotAllowed()}),
        ("yaml", "config"),
        ("folder", "folder"),
    ],
)
def test_a_bad_ckpt_path_is_one_line_naming_the_file(
    finished_run, tmp_path, capsys, subcommand, name, content
):
    path = tmp_path / f"{name}.ckpt"
    if content == "truncated":
        path.write_bytes((finished_run / "checkpoints" / "last.ckpt").read_bytes()[:5000])
    elif content == "config":
        path = finished_run / "config.yaml"
    elif content == "folder":
        path = finished_run
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        torch.save(content, path)
    with pytest.raises(SystemExit) as exit_info:
        run_cli(tmp_path, subcommand, *FAST, f"--ckpt_path={path}")
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert line.startswith(f"error: ckpt_path: {path} ") and "Traceback" not in err
    assert "weights_only=False" not in err
    assert not (tmp_path / "lightning_logs").exists()


def test_a_refused_resume_leaves_the_reused_log_folder_config_unchanged(tmp_path, capsys):
    logger = [
        "--trainer.logger=lightning.pytorch.loggers.TensorBoardLogger",
        f"--trainer.logger.save_dir={tmp_path}",
        "--trainer.logger.version=0",
    ]
    run_cli(tmp_path, "fit", *FAST, "--model.local_steps=1", *logger)
    folder = tmp_path / "lightning_logs" / "version_0"
    config = (folder / "config.yaml").read_bytes()
    for refused in (["--data.num_clients=5"], ["--trainer.max_steps=2", "--data.num_clients=4"]):
        with pytest.raises(SystemExit) as exit_info:
            run_cli(
                tmp_path,
                "fit",
                "--trainer.max_steps=3",
                "--trainer.enable_progress_bar=false",
                "--model.local_steps=1",
                *refused,
                *logger,
                f"--ckpt_path={folder / 'checkpoints' / 'last.ckpt'}",
            )
        assert exit_info.value.code == 2
        assert (folder / "config.yaml").read_bytes() == config
    err = capsys.readouterr().err
    assert "error: ckpt_path: the checkpoint comes from a different config: data.num_clients" in err
    assert "error: trainer.max_steps=2 but the checkpoint has already done 2 rounds" in err


@pytest.mark.slow
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


def test_a_run_prints_no_tips_or_deprecation_noise(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "fl_lightning", "fit", *FAST, "--model.local_steps=1"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    output = proc.stdout + proc.stderr
    for noise in ("Tip:", "TPU available", "GPU available", "val_check_interval=1", "deprecated", "Warning"):
        assert noise not in output, noise
    assert "fl_lightning summary" in output


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


@pytest.mark.slow
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


@pytest.mark.slow
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


def test_list_prints_the_names_each_config_field_takes(tmp_path, capsys):
    main(["list"])
    out = capsys.readouterr().out
    for section, name in [
        ("strategies (--model.strategy=NAME)", "FastSlow"),
        ("models (model.client.init_args.net", "SmallCNN"),
        ("datasets (--data.dataset=NAME)", "digits"),
        ("partitions (--data.partition=NAME)", "DirichletWithReplacement"),
    ]:
        assert section in out and name in out, section
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "python -m fl_lightning list" in capsys.readouterr().out
    main(["list", "strategies"])
    assert capsys.readouterr().out.splitlines()[0] == "strategies (--model.strategy=NAME):"
    with pytest.raises(SystemExit) as exit_info:
        main(["list", "optimizers"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == "error: list: 'optimizers' is not one of " + (
        "strategies, models, datasets, partitions\n"
    )
    # a listed name the old listing spelled differently (fast_slow) is taken by the CLI
    with pytest.raises(SystemExit):
        run_cli(tmp_path, "fit", "--print_config", "--model.strategy=PFedMe")
    assert "class_path: fl_lightning.strategies.PFedMe" in capsys.readouterr().out
