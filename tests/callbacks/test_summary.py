import dataclasses

import pytest
import torch

from fl_lightning.callbacks.summary import flatten_config, hparam_metrics, machine_info
from fl_lightning.engine.record import RoundRecord, SimulatedTime
from fl_lightning.runs import machine_text


def test_flatten_config_names_classes_and_keeps_their_arguments():
    config = {
        "seed_everything": 3,
        "trainer": {"max_steps": 10},
        "model": {
            "strategy": {"class_path": "fl_lightning.strategies.FedProx", "init_args": {"mu": 0.01}},
            "client": {
                "class_path": "fl_lightning.ClientModule",
                "init_args": {
                    "lr": 0.1,
                    "net": {"class_path": "fl_lightning.models.SmallCNN", "init_args": None},
                },
            },
            "attack": None,
            "runtime": {"state_dir": "/tmp/x", "vectorize": 4},
        },
        "data": {"partition": {"class_path": "fl_lightning.data.IID"}, "num_clients": 8, "root": "data"},
        "extra": [1, 2],
    }
    assert flatten_config(config) == {
        "seed_everything": 3,
        "model.strategy": "FedProx",
        "model.strategy.mu": 0.01,
        "model.client": "ClientModule",
        "model.client.lr": 0.1,
        "model.client.net": "SmallCNN",
        "model.attack": None,
        "data.partition": "IID",
        "data.num_clients": 8,
    }  # trainer and other sections left out, as are where state and data live
    assert flatten_config({"model": {"milestones": [1, 2]}}) == {"model.milestones": "[1, 2]"}


def test_hparam_metrics_are_the_summary_numbers():
    summary = {
        "metric": "o_f1",
        "rounds": 5,
        "final_global_o_f1": 0.5,
        "best_global_o_f1": 0.75,
        "best_round": 4,
        "bytes_total": 100,
        "wall_time_s": 2.0,
        "client_o_f1": {"n": 3, "mean": 0.4, "std": 0.1, "min": 0.2, "max": 0.6},
        "interrupted": True,
    }
    assert hparam_metrics(summary) == {
        "summary/rounds": 5.0,
        "summary/final_global_o_f1": 0.5,
        "summary/best_global_o_f1": 0.75,
        "summary/best_round": 4.0,
        "summary/bytes_total": 100.0,
        "summary/wall_time_s": 2.0,
        "summary/client_o_f1_mean": pytest.approx(0.4),
        "summary/client_o_f1_std": pytest.approx(0.1),
        "summary/client_o_f1_min": pytest.approx(0.2),
        "summary/interrupted": 1.0,
    }


def test_the_machine_names_torch_the_device_its_kernels_and_threads(monkeypatch):
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    info = machine_info(torch.device("cpu"))
    assert info == {"torch": torch.__version__, "device": "cpu", "cpu_kernels": "AVX512", "threads": 2}
    assert machine_text(info) == f"torch {torch.__version__}, cpu (AVX512 kernels), 2 threads"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "NVIDIA H100")
    gpu = machine_info(torch.device("cuda", 0))
    assert gpu == {"torch": torch.__version__, "device": "cuda", "gpu": "NVIDIA H100", "threads": 2}
    assert machine_text({**gpu, "threads": 1}) == f"torch {torch.__version__}, cuda (NVIDIA H100), 1 thread"
    assert machine_text(None) == machine_text({}) == ""  # a run from before the field


def test_the_machine_names_the_precision_that_ran_unless_full(monkeypatch):
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    mixed = machine_info(torch.device("cpu"), "bf16-mixed")
    assert mixed["precision"] == "bf16-mixed"
    where = f"torch {torch.__version__}, cpu (AVX2 kernels), 1 thread"
    assert machine_text(mixed) == f"{where}, bf16-mixed precision"
    assert machine_text(machine_info(torch.device("cpu"), "32-true")) == where  # as the stored tables


def test_16_mixed_asked_on_a_cpu_is_summarised_as_the_bf16_that_ran(tmp_path, caplog):
    from fl_lightning.lightning import federated_trainer
    from fl_lightning.runs import read_summary

    from conftest import make_data, make_module, run_folder

    trainer = federated_trainer(
        max_steps=1,
        default_root_dir=tmp_path,
        precision="16-mixed",
        accelerator="cpu",
        enable_progress_bar=False,
    )
    with caplog.at_level("INFO", logger="fl_lightning"):
        trainer.fit(make_module(), datamodule=make_data())
    summary = read_summary(run_folder(tmp_path))
    assert summary["machine"]["precision"] == "bf16-mixed"
    assert "1 thread, bf16-mixed precision" in caplog.text  # the summary's machine line


def test_the_summary_reports_the_simulated_time_and_the_time_to_the_target():
    from fl_lightning.callbacks.summary import summarize

    def rec(r, acc, clock):
        sim = SimulatedTime(round_s=1.0, time_s=clock)
        return RoundRecord(r, 2, 0, 1, 1, 0.1, sim=sim, metrics={"global/acc": acc})

    history = [rec(0, 0.5, 10.0), rec(1, 0.8, 25.0), rec(2, 0.7, 40.0)]
    s = summarize(history, {}, 1.0, target=0.75)
    assert s["sim_time_s"] == 40.0 and s["sim_target"] == 0.75 and s["sim_time_to_target_s"] == 25.0
    assert summarize(history, {}, 1.0, target=0.9)["sim_time_to_target_s"] is None  # never reached
    assert "sim_target" not in summarize(history, {}, 1.0)
    plain = [dataclasses.replace(r, sim=None) for r in history]
    assert "sim_time_s" not in summarize(plain, {}, 1.0, target=0.75)  # no simulated clock
    assert hparam_metrics(s | {"metric": "acc"})["summary/sim_time_s"] == 40.0


def test_a_run_with_a_system_model_writes_its_simulated_time(tmp_path):
    from fl_lightning.engine.system import Devices, RoundPolicy
    from fl_lightning.lightning.trainer import federated_trainer
    from fl_lightning.runs import read_summary

    from conftest import make_data, make_module

    module = make_module(system=Devices(), round_policy=RoundPolicy(target_accuracy=0.05))
    trainer = federated_trainer(
        max_steps=2, default_root_dir=str(tmp_path), enable_progress_bar=False, accelerator="cpu"
    )
    trainer.fit(module, datamodule=make_data())
    s = read_summary(trainer.log_dir)
    assert s["sim_time_s"] == pytest.approx(module.engine.clock) and s["sim_target"] == 0.05
    assert s["sim_time_to_target_s"] == pytest.approx(module.history[0].sim.time_s)
    assert (s["late_clients"], s["partial_clients"], s["dropped_out"], s["failed_clients"]) == (0, 0, 0, 0)
