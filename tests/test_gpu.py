"""The GPU lane: every path on CUDA (``python -m pytest -m cuda``; skipped without a GPU).

Each check is a function of the accelerator (or device). The ``cuda``-marked tests run it on the GPU;
a few unmarked tests run the same function on the CPU, so the code of the lane runs in the CPU-only CI
too (the strategies' and precision's CPU runs are in tests/strategies and tests/core/test_precision.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from fl_lightning.api.metrics import TaskMetrics
from fl_lightning.callbacks import FederatedSummary
from fl_lightning.cli import main
from fl_lightning.data import FederatedDataModule
from fl_lightning.data.datasets import Synthetic
from fl_lightning.runs import run_number
from fl_lightning.strategies import Strategy, get_strategy, list_strategies

from conftest import global_weights, make_data, make_module, make_trainer, run_folder

cuda = pytest.mark.cuda
# Small generated data shaped like the embedded digits, which the default and test models take.
SYNTHETIC = ["--data.dataset=synthetic:digits", "--data.num_clients=4"]


def synthetic_data(**kw: Any) -> FederatedDataModule:
    return make_data(dataset=Synthetic(like="digits", train_size=400, test_size=100), **kw)


def run_cli(tmp_path: Path, *args: str) -> None:
    main([*args, "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={tmp_path}"])


def summaries(tmp_path: Path) -> list[dict[str, Any]]:
    files = sorted(
        (tmp_path / "lightning_logs").glob("version_*/summary.json"), key=lambda p: run_number(p.parent) or 0
    )
    return [json.loads(p.read_text()) for p in files]


# ------------------------------------------------------------------------------ bodies
def cli_subcommands(tmp_path: Path, accelerator: str) -> None:
    """fit (summary.json written: the end-of-fit evaluation ran), validate, test, resume."""
    device = [f"--trainer.accelerator={accelerator}", "--trainer.devices=1"]
    run_cli(tmp_path, "fit", *SYNTHETIC, *device, "--trainer.max_steps=2", "--model.local_steps=2")
    assert summaries(tmp_path)[0]["rounds"] == 2
    ckpt = next((run_folder(tmp_path) / "checkpoints").glob("*.ckpt"))
    run_cli(tmp_path, "validate", *SYNTHETIC, *device, f"--ckpt_path={ckpt}")
    run_cli(tmp_path, "test", *SYNTHETIC, *device, f"--ckpt_path={ckpt}")
    run_cli(
        tmp_path,
        "fit",
        *SYNTHETIC,
        *device,
        "--trainer.max_steps=3",
        "--model.local_steps=2",
        f"--ckpt_path={ckpt}",
    )
    resumed = summaries(tmp_path)[-1]
    assert (resumed["rounds"], resumed["rounds_this_run"]) == (3, 1)


def checkpoint_moves_between_devices(tmp_path: Path, first: str, second: str) -> None:
    """A checkpoint written on ``first`` resumes on ``second`` (client states included)."""
    run_cli(tmp_path, "fit", *SYNTHETIC, f"--trainer.accelerator={first}", "--trainer.max_steps=2",
            "--model.local_steps=2", "--model.strategy=Scaffold")  # fmt: skip
    ckpt = next((run_folder(tmp_path) / "checkpoints").glob("*.ckpt"))
    saved = torch.load(ckpt, map_location="cpu", weights_only=False)
    states = saved["fl_lightning"]["client_state"]
    assert states and all(t.device.type == "cpu" for s in states.values() for t in s.values())  # host
    run_cli(tmp_path, "fit", *SYNTHETIC, f"--trainer.accelerator={second}", "--trainer.max_steps=3",
            "--model.local_steps=2", "--model.strategy=Scaffold", f"--ckpt_path={ckpt}")  # fmt: skip
    assert summaries(tmp_path)[-1]["rounds"] == 3


def strategy_for_one_round(name: str) -> Strategy:
    if name == "fedcog":  # generation and distillation from round 0, small
        return get_strategy(name, num_generated=16, gen_steps=2)
    return get_strategy(name)


def one_round(tmp_path: Path, strategy: Strategy, accelerator: str, **trainer_kw: Any) -> None:
    """One round, the end-of-fit summary, then validate and test: finite, on the host afterwards."""
    module, data = make_module(strategy), synthetic_data()
    start = global_weights(module)
    trainer = make_trainer(
        tmp_path, rounds=1, accelerator=accelerator, callbacks=[FederatedSummary()], **trainer_kw
    )
    trainer.fit(module, datamodule=data)
    end = global_weights(module)
    assert all(torch.isfinite(v).all() for v in end.values())
    assert any(not torch.equal(start[k], end[k]) for k in start)
    assert trainer.callbacks[0].summary["client_acc"]["n"] == 4  # the crash at the end of fit
    states = module.store.state_dict()  # client states live on the host
    assert all(t.device.type == "cpu" for s in states.values() for t in s.values())
    assert data.device == torch.device("cpu")  # the data module is back on the host, as the module
    val = trainer.validate(module, datamodule=data, verbose=False)[0]
    test = trainer.test(module, datamodule=data, verbose=False)[0]
    assert "personal/acc" in val and val["global/acc"] == pytest.approx(test["test/acc"])


def metrics_on(device: str) -> None:
    """TaskMetrics on ``device`` equal the CPU values, for both tasks; merge across devices."""
    g = torch.Generator().manual_seed(0)
    cases = {
        "multiclass": (torch.randn(64, 10, generator=g), torch.randint(10, (64,), generator=g)),
        "multilabel": (torch.randn(64, 17, generator=g), (torch.rand(64, 17, generator=g) < 0.2).long()),
    }
    for task, (logits, target) in cases.items():
        ref, dev = TaskMetrics(task, logits.shape[1]), TaskMetrics(task, logits.shape[1]).to(device)
        ref.update(logits, target)
        dev.update(logits[:32].to(device), target[:32].to(device))
        assert dev.device.type == torch.device(device).type
        other = TaskMetrics(task, logits.shape[1])  # on the host, merged into the device's
        other.update(logits[32:], target[32:])
        dev.merge(other)
        expected, got = ref.compute(), dev.compute()
        assert got.keys() == expected.keys()
        for k in expected:
            assert got[k] == pytest.approx(expected[k], abs=1e-5), (task, k)


# ------------------------------------------------------------------------------ the lane on the CPU
def test_cli_subcommands_on_cpu(tmp_path):
    cli_subcommands(tmp_path, "cpu")


def test_checkpoint_moves_between_devices_on_cpu(tmp_path):
    checkpoint_moves_between_devices(tmp_path, "cpu", "cpu")


@pytest.mark.parametrize("name", ["fedavg", "fedcog", "finetune"])
def test_one_round_on_cpu(tmp_path, name):
    one_round(tmp_path, strategy_for_one_round(name), "cpu")


def test_metrics_on_cpu():
    metrics_on("cpu")


# ------------------------------------------------------------------------------ the lane on the GPU
@cuda
def test_cli_subcommands_on_gpu(tmp_path):
    cli_subcommands(tmp_path, "gpu")


@cuda
@pytest.mark.parametrize(("first", "second"), [("gpu", "cpu"), ("cpu", "gpu")])
def test_checkpoint_moves_between_devices_on_gpu(tmp_path, first, second):
    checkpoint_moves_between_devices(tmp_path, first, second)


@cuda
@pytest.mark.parametrize("name", list_strategies())
def test_every_strategy_runs_a_round_on_gpu(tmp_path, name):
    one_round(tmp_path, strategy_for_one_round(name), "gpu")


@cuda
@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
@pytest.mark.parametrize("name", ["fedavg", "fedprox", "scaffold"])
def test_mixed_precision_on_gpu(tmp_path, precision, name):
    one_round(tmp_path, get_strategy(name), "gpu", precision=precision)


@cuda
def test_metrics_on_gpu():
    metrics_on("cuda")


# ------------------------------------------------------------------------------ on either device
DEVICES = ["cpu", pytest.param("cuda", marks=cuda)]
ACCELERATOR = {"cpu": "cpu", "cuda": "gpu"}


@pytest.mark.parametrize("device", DEVICES)
def test_metrics_are_computed_on_the_module_device_during_validation(tmp_path, device):
    from lightning.pytorch import Callback

    seen = set()

    class Probe(Callback):
        def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
            seen.add((pl_module.global_metrics.device.type, pl_module.engine.local_metrics.device.type))

    trainer = make_trainer(tmp_path, rounds=1, accelerator=ACCELERATOR[device], callbacks=[Probe()])
    trainer.fit(make_module(), datamodule=synthetic_data())
    assert seen == {(device, device)}


@pytest.mark.parametrize("device", DEVICES)
def test_a_module_placed_on_the_device_before_fit(tmp_path, device):
    """check_data runs the network on a sample of the data: the sample goes where the module is."""
    module = make_module().to(device)
    make_trainer(tmp_path, rounds=1, accelerator=ACCELERATOR[device]).fit(module, datamodule=synthetic_data())
    assert module.history


@pytest.mark.parametrize("device", DEVICES)
def test_data_module_to_is_idempotent(device):
    data = synthetic_data()
    data.setup("fit")
    x = data.to(device).clients[0].x
    assert x.device.type == device
    assert data.to(device).clients[0].x is x and data.to(x.device).clients[0].x is x  # "cuda" is "cuda:0"
    assert data.to("cpu").clients[0].x is data.splits.train_x  # the host copy is kept: nothing copied


@pytest.mark.parametrize("device", DEVICES)
def test_finetune_and_pfedme_move_host_batches_to_the_module_device(device):
    from fl_lightning.engine.local import LocalConfig, local_training
    from fl_lightning.functional.moreau import personal_steps
    from fl_lightning.strategies.plugins.finetune import FineTune

    data = synthetic_data()
    data.setup("fit")  # the data stays on the host
    worker = make_module().client.to(device)
    FineTune(epochs=1).adapt(worker, data.clients[0], {}, local_training(LocalConfig(16)))
    theta = {n: p.detach().clone().requires_grad_(True) for n, p in worker.named_parameters()}
    optimizer = torch.optim.SGD(list(theta.values()), lr=0.1)
    batch = next(data.clients[0].batches(16, 1, torch.Generator().manual_seed(0)))
    reference = {n: t.detach() for n, t in theta.items()}
    outputs, loss = personal_steps(worker, theta, reference, batch, optimizer, 1.0, 2)
    assert outputs.device.type == device and torch.isfinite(loss)


@pytest.mark.parametrize("device", DEVICES)
def test_decomposition_of_a_conv_on_the_device(device):
    from fl_lightning.models.decomposed import DecomposedConv2d

    conv = torch.nn.Conv2d(3, 4, 3, padding=1).to(device)
    x = torch.randn(2, 3, 8, 8, device=device)
    for atoms in (9, 12):  # exact for m_a >= k*k; 12 > 9 draws random atoms on the host
        layer = DecomposedConv2d.from_conv(conv, num_atoms=atoms)
        torch.testing.assert_close(layer(x), conv(x), atol=1e-3, rtol=1e-3)  # TF32 convs on a GPU
