"""curves.csv and clients.csv of a run: the same values as its summary and TensorBoard; unseen clients."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from lightning.pytorch.loggers import TensorBoardLogger

from fl_lightning.callbacks.results import cluster_text, ledger, read_history
from fl_lightning.callbacks.summary import FederatedSummary
from fl_lightning.engine.system import Devices
from fl_lightning.runs import read_scalars, read_texts
from fl_lightning.strategies import FedPer

from conftest import make_data, make_module, make_trainer


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _fit(tmp_path, module, rounds: int = 3, **data):
    logger = TensorBoardLogger(tmp_path, name="lightning_logs")
    summary = FederatedSummary()
    trainer = make_trainer(tmp_path, rounds=rounds, logger=logger, callbacks=[summary])
    trainer.fit(module, datamodule=make_data(**data))
    return Path(logger.log_dir), summary.summary


def test_curves_and_clients_equal_the_summary_and_tensorboard_and_unseen_clients_never_train(tmp_path):
    module = make_module(clients_per_round=2, system=Devices(speed_sigma=0.5))
    folder, s = _fit(tmp_path, module, num_clients=6, unseen_clients=0.34)
    unseen = sorted(module.engine.unseen)
    assert len(unseen) == 2 and s["unseen_clients"] == 2
    assert all(not set(r.sampled) & set(unseen) for r in module.history)  # never sampled
    curves = _rows(folder / "curves.csv")
    scalars = read_scalars(folder)
    assert [int(r["round"]) for r in curves] == [1, 2, 3]
    for tag in ("global/acc", "personal/acc", "sim/time_s", "clients/global_acc_p10"):
        col = "sim_time_s" if tag == "sim/time_s" else tag
        assert [float(r[col]) for r in curves] == pytest.approx([v for _, v in scalars[tag]]), tag
    assert float(curves[-1]["global/acc"]) == pytest.approx(s["final_global_acc"])
    assert int(curves[-1]["bytes_total"]) == s["bytes_total"]
    clients = _rows(folder / "clients.csv")
    assert [int(c["unseen"]) for c in clients] == [int(c in unseen) for c in range(6)]
    assert all(int(c["sampled"]) == 0 for c in clients if int(c["unseen"]))
    assert sum(int(c["sampled"]) for c in clients) == sum(len(r.sampled) for r in module.history)
    assert all(float(c["speed"]) > 0 for c in clients)
    assert [c["cluster"] for c in clients] == [""] * 6  # FedAvg has no clusters: the column stays empty
    assert "cluster/assignment" not in read_texts(folder)
    seen = [float(c["global_acc"]) for c in clients if not int(c["unseen"])]
    hidden = [float(c["global_acc"]) for c in clients if int(c["unseen"])]
    spread = s["client_global_acc"]
    assert spread["n"] == 4 and spread["min"] == pytest.approx(min(seen))
    assert s["unseen_global_acc"] == pytest.approx(sum(hidden) / 2)
    assert s["participation_gap"] == pytest.approx(sum(seen) / 4 - sum(hidden) / 2)
    assert s["out_of_sample_gap"] == pytest.approx(s["participating_train_acc"] - s["participating_test_acc"])
    assert json.loads((folder / "summary.json").read_text())["participation_gap"] == s["participation_gap"]
    assert s["best_test_optimistic"] and s["last_k"] == 3 and "best_val_global_acc" not in s


def test_a_personalised_strategy_reports_the_global_and_the_deployed_model_per_client(tmp_path):
    module = make_module(FedPer(), clients_per_round=2)
    folder, s = _fit(tmp_path, module, rounds=2, val_fraction=0.1)
    clients = _rows(folder / "clients.csv")
    personal = [float(c["personal_acc"]) for c in clients]
    glob = [float(c["global_acc"]) for c in clients]
    assert s["client_personal_acc"]["mean"] == pytest.approx(sum(personal) / 4)
    assert s["client_global_acc"]["mean"] == pytest.approx(sum(glob) / 4)
    assert s["client_acc"] == s["client_personal_acc"]  # the deployed model's
    assert "best_val_global_acc" in s and "best_test_global_acc" not in s
    steps = ledger(read_history(module.history), 4)
    assert [int(c["steps"]) for c in clients] == [steps[c]["steps"] for c in range(4)]
    assert sum(int(c["trained"]) for c in clients) == 4  # 2 rounds x 2 clients


def test_a_clustered_assignment_reads_as_each_clusters_clients():
    assert (
        cluster_text(3, {4: 1, 0: 0, 2: 0, 1: 1, 5: 0})
        == "round 3: cluster 0: clients 0, 2, 5; cluster 1: clients 1, 4"
    )
    assert cluster_text(1, {}) == "round 1: no client assigned yet"


def test_unseen_clients_must_be_a_fraction():
    from fl_lightning.errors import ConfigError

    with pytest.raises(ConfigError, match="data.unseen_clients"):
        make_data(unseen_clients=1.0)


def test_each_transform_group_is_in_the_summary_and_global_is_their_union(tmp_path, caplog):
    from fl_lightning.data import Rotation

    module = make_module(clients_per_round=2)
    transform = Rotation(k=2, global_test="per_group")
    with caplog.at_level("INFO", logger="fl_lightning"):
        folder, s = _fit(tmp_path, module, rounds=2, client_transform=transform)
    curves = _rows(folder / "curves.csv")[-1]
    assert s["group_global_acc"] == {
        g: pytest.approx(float(curves[f"global/group{g}/acc"])) for g in ("0", "1")
    }
    assert s["global_is_union_of_groups"] and "per group (global/acc is their union): group 0" in caplog.text
    clients = _rows(folder / "clients.csv")
    assert [int(c["group"]) for c in clients] == [transform.group_of(c) for c in range(4)]
