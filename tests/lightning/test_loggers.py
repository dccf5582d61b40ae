"""Run folders claimed atomically; evaluations at the checkpoint's round, without Lightning's ``epoch``."""

import os
from pathlib import Path

from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from fl_lightning.lightning import loggers
from fl_lightning.lightning.loggers import (
    RoundStepLogger,
    claim_version,
    claim_version_on_first_use,
    continue_version,
    folder_label,
    run_label,
)
from fl_lightning.runs import read_scalars


def test_claim_version_takes_the_next_free_number_and_skips_one_taken_meanwhile(tmp_path, monkeypatch):
    for name in ("version_0", "version_2-fedavg-iid", "other"):
        (tmp_path / name).mkdir()
    assert claim_version(tmp_path) == "version_3"
    mkdir = os.mkdir

    def taken_first(path, *args):  # another run creates version_4 between our listing and our mkdir
        if Path(path).name == "version_4" and not Path(path).exists():
            mkdir(path)
            raise FileExistsError(path)
        return mkdir(path, *args)

    monkeypatch.setattr(loggers.os, "mkdir", taken_first)
    assert claim_version(tmp_path, "fedbuff-devices") == "version_5-fedbuff-devices"
    assert {p.name for p in tmp_path.iterdir()} >= {"version_3", "version_4", "version_5-fedbuff-devices"}

    def renamed_meanwhile(path, *args):  # another run's claim of version_6, renamed to its label, appears
        mkdir(path, *args)
        if Path(path).name == "version_6":
            mkdir(Path(path).parent / "version_6-x")

    monkeypatch.setattr(loggers.os, "mkdir", renamed_meanwhile)
    assert claim_version(tmp_path, "my run/1") == "version_7-my-run-1"
    assert not (tmp_path / "version_6").exists()  # ours given up


def test_a_runs_label_names_its_strategy_split_transform_and_system():
    from fl_lightning.data import FederatedDataModule, Rotation
    from fl_lightning.lightning.module import FederatedModule
    from fl_lightning.strategies import FedBuff
    from fl_lightning.system import Devices

    assert run_label(FederatedModule(), FederatedDataModule()) == "fedavg-dirichlet"
    module = FederatedModule(strategy=FedBuff(), system=Devices())
    assert run_label(module, FederatedDataModule(client_transform=Rotation(k=2))) == (
        "fedbuff-dirichlet-rotation-devices"
    )


def test_a_runs_name_asks_for_a_label_and_an_empty_one_for_a_bare_folder():
    assert [folder_label(n) for n in ("auto", "my run", "None", "", " ", "null", None)] == [
        "auto",
        "my run",
        None,
        None,
        None,
        None,
        None,
    ]


def test_a_logger_without_a_version_claims_its_folder_when_first_used(tmp_path):
    claimed = []
    first, second = (TensorBoardLogger(str(tmp_path), name="lightning_logs") for _ in range(2))
    for logger in (first, second):
        claim_version_on_first_use(logger, claimed.append)
    assert not (tmp_path / "lightning_logs").exists()  # nothing until a logger needs its folder
    assert Path(second.log_dir).name == "version_0" and Path(first.log_dir).name == "version_1"
    assert claimed == [tmp_path.resolve() / "lightning_logs" / f"version_{n}" for n in (0, 1)]
    pinned = CSVLogger(str(tmp_path), name="csv", version="mine")
    claim_version_on_first_use(pinned, claimed.append)  # a version given is kept
    assert Path(pinned.log_dir).name == "mine" and len(claimed) == 2


def test_a_resumed_run_continues_in_its_folder_when_the_logger_writes_there(tmp_path):
    run = tmp_path / "lightning_logs" / "version_3-fedavg-iid"
    run.mkdir(parents=True)
    same, other = TensorBoardLogger(str(tmp_path)), TensorBoardLogger(str(tmp_path), name="other")
    assert continue_version(same, run.resolve()) and Path(same.log_dir) == run
    assert not continue_version(other, run.resolve())


def test_an_evaluation_logs_at_the_checkpoints_round_without_lightnings_epoch_scalar(tmp_path):
    logger = RoundStepLogger(save_dir=str(tmp_path), name="", version="test")
    logger.log_metrics({"epoch": 0.0, "train/loss": 1.0}, step=0)  # before the round is known: as given
    logger.round_step = 12
    logger.log_metrics({"test/acc": 0.5, "epoch": 0.0}, step=0)  # what Lightning passes in `test`
    logger.finalize("success")
    scalars = read_scalars(tmp_path / "test")
    assert scalars["test/acc"] == [(12, 0.5)] and scalars["epoch"] == [(0, 0.0)]
