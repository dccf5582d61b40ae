"""``federated_trainer``: the Trainer whose step is a round, from Python as from the command line."""

import json

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint, TQDMProgressBar

from fl_lightning.callbacks import FederatedProgressBar, FederatedSummary
from fl_lightning.errors import ConfigError
from fl_lightning.lightning import ROUND_DEFAULTS, federated_trainer
from fl_lightning.lightning.checkpoint import AtomicCheckpointIO, LastRoundCheckpoint
from fl_lightning.runs import read_scalars, read_summary

from conftest import make_data, make_module

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
    run = tmp_path / "lightning_logs" / "version_0"
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


def test_a_plain_trainer_validates_once_after_the_last_round(tmp_path):
    """What the builder is for: Lightning's epoch defaults see one validation in a 3-round run."""
    plain = Trainer(max_steps=3, default_root_dir=tmp_path, logger=False, enable_checkpointing=False, **FAST)
    module = _fit(plain)
    assert [r.round for r in module.history if "global/acc" in r.metrics] == [2]


def test_what_is_given_is_kept(tmp_path):
    mine = FederatedSummary()
    bar = TQDMProgressBar()
    trainer = federated_trainer(
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
        federated_trainer(max_steps=1, default_root_dir=tmp_path, on_new_run_folder=claimed.append, **FAST)
        for _ in range(2)
    ]
    dirs = [t.log_dir for t in reversed(trainers)]  # whichever asks first gets version_0
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
    trainer = federated_trainer(
        max_steps=1, default_root_dir=tmp_path, hparams={"model.strategy": "FedAvg", "x": 1}, **FAST
    )
    _fit(trainer)
    run = tmp_path / "lightning_logs" / "version_0"
    assert "model.strategy: FedAvg" in (run / "hparams.yaml").read_text()
    assert json.loads((run / "summary.json").read_text())["rounds"] == 1
