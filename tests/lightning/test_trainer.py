"""``federated_trainer``: the Trainer whose step is a round, from Python as from the command line."""

import inspect
import json

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint, TQDMProgressBar

from fl_lightning.callbacks import FederatedProgressBar, FederatedSummary
from fl_lightning.errors import ConfigError
from fl_lightning.lightning import ROUND_DEFAULTS, federated_trainer
from fl_lightning.lightning.checkpoint import AtomicCheckpointIO, LastRoundCheckpoint
from fl_lightning.lightning.trainer import FederatedTrainer, round_trainer
from fl_lightning.runs import read_scalars, read_summary

from conftest import make_data, make_module, run_folder

FAST = {"enable_progress_bar": False, "accelerator": "cpu", "devices": 1}


def _fit(trainer: Trainer, **module_kw):
    module = make_module(**module_kw)
    trainer.fit(module, datamodule=make_data())
    return module


def test_the_defaults_make_a_round_a_step_and_add_what_a_run_writes(tmp_path):
    trainer = federated_trainer(max_steps=3, default_root_dir=tmp_path, accelerator="cpu")
    assert trainer.max_steps == 3 and trainer.val_check_interval == ROUND_DEFAULTS["val_check_interval"]
    assert trainer.check_val_every_n_epoch is None and trainer.num_sanity_val_steps == 0
    assert trainer.log_every_n_steps == 1
    kinds = [type(c) for c in trainer.callbacks]
    assert {FederatedProgressBar, LastRoundCheckpoint, FederatedSummary} <= set(kinds)
    assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    assert not (tmp_path / "lightning_logs").exists()  # the run folder comes with the run's first log


def test_monitored_callbacks_see_every_round_and_the_run_writes_last_ckpt_and_its_summary(tmp_path):
    best = ModelCheckpoint(monitor="global/acc", mode="max", save_top_k=-1)
    stop = EarlyStopping(monitor="global/acc", mode="max", patience=100)
    trainer = federated_trainer(max_steps=3, default_root_dir=tmp_path, callbacks=[best, stop], **FAST)
    module = _fit(trainer)
    run = tmp_path / "lightning_logs" / "version_0-fedavg-dirichlet"  # labelled by default, as the CLI's
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "last.ckpt",
        "round=1.ckpt",
        "round=2.ckpt",
        "round=3.ckpt",
    ]
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 3
    accuracy = read_scalars(run)["global/acc"]
    assert [s for s, _ in accuracy] == [1, 2, 3] and len(module.history) == 3
    assert float(stop.best_score) == pytest.approx(max(v for _, v in accuracy))  # it saw every round
    summary = read_summary(run)
    assert summary["rounds"] == 3 and summary["max_steps"] == 3


def test_a_plain_trainer_with_epoch_validation_is_one_line_naming_federated_trainer(tmp_path):
    """Lightning's epoch defaults would validate once in a 3-round run and write no last.ckpt or summary."""
    plain = Trainer(max_steps=3, default_root_dir=tmp_path, logger=False, enable_checkpointing=False, **FAST)
    with pytest.raises(ConfigError, match=r"federated_trainer\(max_steps=") as err:
        _fit(plain)
    assert "\n" not in str(err.value) and not (tmp_path / "lightning_logs").exists()


def test_a_plain_trainer_made_to_validate_every_round_or_never_is_taken_as_chosen(tmp_path):
    per_round = Trainer(
        max_steps=2,
        default_root_dir=tmp_path,
        logger=False,
        enable_checkpointing=False,
        **ROUND_DEFAULTS,
        **FAST,
    )
    assert [r.round for r in _fit(per_round).history if "global/acc" in r.metrics] == [0, 1]
    never = Trainer(
        max_steps=2,
        default_root_dir=tmp_path,
        logger=False,
        enable_checkpointing=False,
        limit_val_batches=0,
        **FAST,
    )
    assert len(_fit(never).history) == 2


def test_federated_trainer_shows_no_command_line_internals():
    assert {"hparams", "on_new_run_folder"}.isdisjoint(inspect.signature(federated_trainer).parameters)
    assert isinstance(federated_trainer(max_steps=1, logger=False, **FAST), FederatedTrainer)


def test_what_is_given_is_kept(tmp_path):
    mine = FederatedSummary()
    bar = TQDMProgressBar()
    trainer = round_trainer(
        max_steps=2,
        default_root_dir=tmp_path,
        callbacks=[mine, bar],
        hparams={"model.strategy": "FedAvg"},
        enable_checkpointing=False,
        val_check_interval=2,
        accelerator="cpu",
    )
    assert trainer.val_check_interval == 2
    assert not any(isinstance(c, (FederatedProgressBar, LastRoundCheckpoint)) for c in trainer.callbacks)
    assert [c for c in trainer.callbacks if isinstance(c, FederatedSummary)] == [mine]
    assert mine.hparams == {"model.strategy": "FedAvg"}


def test_runs_built_in_one_folder_get_their_own_run_folders(tmp_path):
    claimed = []
    trainers = [
        round_trainer(max_steps=1, default_root_dir=tmp_path, on_new_run_folder=claimed.append, **FAST)
        for _ in range(2)
    ]
    # whichever asks first gets version_0; asked before fit, the folder has no module to be labelled by
    dirs = [t.log_dir for t in reversed(trainers)]
    assert [d.rsplit("/", 1)[1] for d in dirs] == ["version_0", "version_1"]
    assert [p.name for p in claimed] == ["version_0", "version_1"]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"val_check_interval": 0}, "trainer.val_check_interval"), ({}, "trainer.default_root_dir")],
)
def test_bad_arguments_are_one_line(tmp_path, kwargs, field):
    root = tmp_path / "a_file"
    root.write_text("")
    with pytest.raises(ConfigError) as err:
        federated_trainer(default_root_dir=root if not kwargs else tmp_path, **kwargs)
    assert str(err.value).startswith(field) and "\n" not in str(err.value)


def test_the_hparams_given_are_the_summarys_hparams_row(tmp_path):
    trainer = round_trainer(
        max_steps=1, default_root_dir=tmp_path, hparams={"model.strategy": "FedAvg", "x": 1}, **FAST
    )
    _fit(trainer)
    run = run_folder(tmp_path)
    assert "model.strategy: FedAvg" in (run / "hparams.yaml").read_text()
    assert json.loads((run / "summary.json").read_text())["rounds"] == 1


def test_without_given_hparams_the_hparams_row_is_the_modules_and_data_modules_arguments(tmp_path):
    trainer = federated_trainer(max_steps=1, default_root_dir=tmp_path, **FAST)
    _fit(trainer, local_steps=1)
    saved = (run_folder(tmp_path) / "hparams.yaml").read_text()
    assert "model.strategy: FedAvg" in saved and "model.local_steps: 1" in saved
    assert "data.num_clients: 4" in saved and "model.client.net: SmallCNN" in saved


def test_a_fit_resumed_from_a_runs_last_checkpoint_continues_in_its_folder(tmp_path):
    first = federated_trainer(max_steps=1, default_root_dir=tmp_path, **FAST)
    _fit(first)
    last = tmp_path / "lightning_logs" / "version_0-fedavg-dirichlet" / "checkpoints" / "last.ckpt"
    resumed = federated_trainer(max_steps=2, default_root_dir=tmp_path, **FAST)
    resumed.fit(make_module(), datamodule=make_data(), ckpt_path=str(last))
    assert resumed.log_dir == first.log_dir and [p.name for p in (tmp_path / "lightning_logs").iterdir()] == [
        "version_0-fedavg-dirichlet"
    ]
    assert [s for s, _ in read_scalars(first.log_dir)["global/acc"]] == [1, 2]  # one TensorBoard run
    assert read_summary(first.log_dir)["rounds"] == 2
    elsewhere = federated_trainer(max_steps=3, default_root_dir=tmp_path / "other", **FAST)
    elsewhere.fit(make_module(), datamodule=make_data(), ckpt_path=str(last))  # another folder: a new run
    assert elsewhere.log_dir == str(tmp_path / "other" / "lightning_logs" / "version_0-fedavg-dirichlet")


def test_from_python_the_progress_and_summary_print_without_console(tmp_path, capsys):
    trainer = federated_trainer(max_steps=1, default_root_dir=tmp_path, **FAST)
    _fit(trainer)
    captured = capsys.readouterr()
    assert "fl_lightning summary" in captured.out
    assert "GPU available" not in captured.out + captured.err  # Lightning's status lines left out


def test_a_named_run_folder_carries_its_label_and_auto_names_strategy_split_and_system(tmp_path):
    from fl_lightning.strategies import FedProx

    named = federated_trainer(max_steps=1, default_root_dir=tmp_path, name="my run", **FAST)
    _fit(named)
    auto = federated_trainer(max_steps=1, default_root_dir=tmp_path, **FAST)  # name="auto", the default
    _fit(auto, strategy=FedProx(mu=0.1))
    for bare in (None, "", "none"):
        _fit(federated_trainer(max_steps=1, default_root_dir=tmp_path, name=bare, **FAST))
    assert sorted(p.name for p in (tmp_path / "lightning_logs").iterdir()) == [
        "version_0-my-run",
        "version_1-fedprox-dirichlet",
        "version_2",
        "version_3",
        "version_4",
    ]
    assert read_summary(auto.log_dir)["rounds"] == 1
