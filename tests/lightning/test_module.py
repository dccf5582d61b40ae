"""The outer Trainer: stock callbacks per round, resume, TensorBoard output, checkpoint checks."""

import warnings
from pathlib import Path

import pytest
import torch
import yaml
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint, TQDMProgressBar
from lightning.pytorch.loggers import TensorBoardLogger

from fl_lightning.callbacks import (
    FederatedCallback,
    FederatedProgressBar,
    FederatedSummary,
    RoundLearningRateMonitor,
)
from fl_lightning.data import Dirichlet
from fl_lightning.errors import ConfigError
from fl_lightning.lightning.module import CLIENT_PREFIX
from fl_lightning.runs import read_scalars
from fl_lightning.strategies import FedAvg

from conftest import global_weights, make_data, make_module, make_trainer


class Stateful(FedAvg):
    """A toy strategy with server momentum, a server buffer and per-client state (resume test)."""

    def setup(self, model, num_clients):
        super().setup(model, num_clients)
        self.register_buffer("h", torch.zeros(()))

    def configure_server_optimizer(self, params):
        return torch.optim.SGD(params, lr=1.0, momentum=0.5)

    def local_loss(self, module, ctx, batch, outputs):
        drift = ctx.state.get("drift")
        if drift is None:
            return None
        return 0.01 * drift * sum(p.sum() for p in module.parameters()) + 0.001 * self.h

    def upload(self, module, ctx):
        up = super().upload(module, ctx)
        delta = sum((up["weights"][k] - v).sum() for k, v in ctx.message["weights"].items())
        ctx.state["drift"] = ctx.state.get("drift", torch.zeros((), device=delta.device)) + delta
        return up

    def on_after_server_step(self, model, means, info):
        self.h += 1.0


def stateful_module():
    return make_module(Stateful(), participation=0.5, lr_decay=0.9)


def test_resume_from_a_mid_run_checkpoint_is_identical(tmp_path):
    ckpt_dir = tmp_path / "ckpts"
    full = stateful_module()
    ckpt = ModelCheckpoint(
        dirpath=ckpt_dir, monitor="global/acc", mode="max", save_top_k=-1, filename="{step}"
    )
    make_trainer(tmp_path, rounds=5, callbacks=[ckpt], enable_checkpointing=True).fit(
        full, datamodule=make_data()
    )
    files = sorted(p.name for p in ckpt_dir.glob("*.ckpt"))
    assert files == [f"step={s}.ckpt" for s in range(1, 6)]  # one per round, monitored metric global/acc

    resumed = stateful_module()
    trainer = make_trainer(tmp_path / "b", rounds=5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(resumed, datamodule=make_data(), ckpt_path=ckpt_dir / "step=2.ckpt")
    assert not [w for w in caught if "not resumable" in str(w.message)]  # the round loader is resumable
    assert trainer.global_step == 5
    a, b = global_weights(full), global_weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(full.strategy.h, resumed.strategy.h)
    assert sorted(full.store.state_dict()) == sorted(resumed.store.state_dict())
    for cid, state in full.store.state_dict().items():
        assert torch.equal(state["drift"], resumed.store.get(cid)["drift"])
    assert [r.round for r in resumed.history] == list(range(5))
    assert [r.this_run for r in resumed.history] == [False, False, True, True, True]


def test_checkpoint_from_a_different_config_is_rejected(tmp_path):
    trainer = make_trainer(tmp_path, rounds=1)
    trainer.fit(make_module(), datamodule=make_data())
    path = tmp_path / "a.ckpt"
    trainer.save_checkpoint(path)
    other = make_trainer(tmp_path / "b", rounds=2)
    with pytest.raises(ConfigError, match=r"data.num_clients \(checkpoint 4 vs config 5\)"):
        other.fit(make_module(), datamodule=make_data(num_clients=5), ckpt_path=path)
    with pytest.raises(ConfigError, match=r"model.client.net \(net.classifier.0.weight"):
        other.fit(make_module(width=8), datamodule=make_data(), ckpt_path=path)
    plain = torch.load(path, weights_only=False)
    del plain["fl_lightning"]
    torch.save(plain, tmp_path / "plain.ckpt")
    with pytest.raises(ConfigError, match="ckpt_path: the checkpoint has no fl_lightning state"):
        other.validate(make_module(), datamodule=make_data(), ckpt_path=tmp_path / "plain.ckpt")


def test_early_stopping_stops_at_round_granularity(fit):
    stop = EarlyStopping(monitor="global/acc", mode="max", patience=1, min_delta=1.0)
    trainer = fit(make_module(), rounds=10, callbacks=[stop])
    assert trainer.global_step == 2  # round 1 sets the best, round 2 fails to improve by 1.0
    assert stop.stopped_epoch == 0 and trainer.should_stop


def test_learning_rate_monitor_sees_the_server_lr(tmp_path):
    logger = TensorBoardLogger(tmp_path, name="lr")
    lrm = LearningRateMonitor(logging_interval="step")
    trainer = make_trainer(tmp_path, rounds=2, logger=logger, callbacks=[lrm])
    trainer.fit(make_module(FedAvg(server_lr=0.7)), datamodule=make_data())
    assert lrm.lrs == {"lr-SGD": [0.7, 0.7]}


def test_progress_bars_tick_once_per_round(tmp_path):
    trainer = make_trainer(tmp_path, rounds=3, enable_progress_bar=True, callbacks=[TQDMProgressBar()])
    trainer.fit(make_module(), datamodule=make_data())
    assert trainer.progress_bar_callback.train_progress_bar.n == 3

    bar = FederatedProgressBar()
    trainer = make_trainer(tmp_path, rounds=2, enable_progress_bar=True, callbacks=[bar])
    trainer.fit(make_module(), datamodule=make_data())
    assert bar.train_progress_bar.n == 2
    assert "clients=4/4" in str(bar.train_progress_bar.postfix)


def test_user_callbacks_get_lightning_and_federated_hooks(fit):
    class Spy(FederatedCallback):
        def __init__(self):
            self.events = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.events.append(("batch_end", trainer.global_step))

        def on_round_start(self, trainer, pl_module, round, clients):
            self.events.append(("round_start", round, tuple(clients)))

        def on_client_end(self, trainer, pl_module, round, index, total, result):
            self.events.append(("client", round, result.client_id, total))

        def on_round_end(self, trainer, pl_module, round, record):
            self.events.append(("round_end", round, record.clients))

    class Plain(Callback):
        def __init__(self):
            self.validations = 0

        def on_validation_end(self, trainer, pl_module):
            self.validations += 1

    spy, plain = Spy(), Plain()
    fit(make_module(clients_per_round=2), rounds=2, callbacks=[spy, plain])
    assert plain.validations == 2
    kinds = [e[0] for e in spy.events]
    assert kinds == ["round_start", "client", "client", "round_end", "batch_end"] * 2
    assert spy.events[4] == ("batch_end", 1) and spy.events[-1] == ("batch_end", 2)


def _scalars(log_dir: Path) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    return set(acc.Tags()["scalars"]) | {f"image:{t}" for t in acc.Tags()["images"]}


def test_tensorboard_gets_global_client_round_metrics_and_the_partition_image(tmp_path):
    logger = TensorBoardLogger(tmp_path, name="lightning_logs")
    summary = FederatedSummary()
    trainer = make_trainer(tmp_path, rounds=2, logger=logger, callbacks=[summary])
    trainer.fit(make_module(), datamodule=make_data())
    tags = _scalars(Path(logger.log_dir))
    for tag in (
        "global/acc",
        "global/loss",
        "round/time_s",
        "round/bytes_up",
        "round/bytes_down",
        "train/loss",
        "z_client/0/train_loss",
        "z_client/3/train_acc",
        "z_client/0/local_acc",
        "z_client/2/acc",
        "personal/acc",
        "image:partition/clients_x_classes",
    ):
        assert tag in tags, tag
    s = summary.summary
    assert s["rounds"] == 2 and s["client_acc"]["n"] == 4
    assert s["bytes_down"] == s["bytes_up"] > 0
    assert (Path(logger.log_dir) / "summary.json").exists()


def test_every_scalar_is_logged_at_step_rounds_done(tmp_path):
    """README: the x-axis is rounds done; round r (0-based) is logged at step r + 1 by every tag."""
    logger = TensorBoardLogger(tmp_path, name="lightning_logs")
    summary = FederatedSummary()
    callbacks = [summary, RoundLearningRateMonitor()]
    trainer = make_trainer(tmp_path, rounds=3, logger=logger, callbacks=callbacks)
    trainer.fit(make_module(), datamodule=make_data())
    scalars = read_scalars(logger.log_dir)
    assert {"global/acc", "personal/acc", "train/loss", "round/clients", "lr-SGD"} <= set(scalars)
    assert any(tag.startswith(CLIENT_PREFIX) for tag in scalars)
    steps = {tag: [step for step, _ in points] for tag, points in scalars.items()}
    assert {tag: s for tag, s in steps.items() if s != [1, 2, 3] and not tag.startswith("summary/")} == {}
    summary_steps = [s for tag, s in steps.items() if tag.startswith("summary/")]
    assert summary_steps and all(s == [3] for s in summary_steps)  # the HPARAMS tab's numbers, at the end
    best = max(scalars["global/acc"], key=lambda p: p[1])
    assert summary.summary["best_round"] == best[0]


def test_communicated_bytes_match_the_model_size(fit):
    module = make_module(clients_per_round=3)
    fit(module, rounds=2)
    model_bytes = sum(p.numel() * p.element_size() for p in module.client.parameters())
    assert [r.bytes_down for r in module.history] == [3 * model_bytes] * 2
    assert [r.bytes_up for r in module.history] == [3 * model_bytes] * 2


def test_validate_and_test_evaluate_the_global_model(tmp_path):
    module, data = make_module(), make_data()
    trainer = make_trainer(tmp_path, rounds=1)
    trainer.fit(module, datamodule=data)
    val = trainer.validate(module, datamodule=data)[0]
    test = trainer.test(module, datamodule=data)[0]
    assert val["global/acc"] == pytest.approx(test["test/acc"])
    assert "personal/acc" in val


def test_model_and_data_mismatches_are_one_line_config_errors(fit):
    from fl_lightning.api.client import ClientModule
    from fl_lightning.lightning.module import FederatedModule
    from fl_lightning.models import SmallCNN

    wrong_classes = FederatedModule(client=ClientModule(SmallCNN(num_classes=7), lr=0.05, momentum=0.0))
    with pytest.raises(ConfigError, match="num_classes=10"):
        fit(wrong_classes)
    wrong_channels = FederatedModule(client=ClientModule(SmallCNN(in_channels=3), lr=0.05, momentum=0.0))
    with pytest.raises(ConfigError, match="model.client.net cannot take"):
        fit(wrong_channels)
    with pytest.raises(ConfigError, match="data.num_clients=5000"):
        fit(make_module(), data=make_data(num_clients=5000))


@pytest.mark.parametrize(("every", "during"), [(0, []), (2, [2])])
def test_clients_are_evaluated_every_n_rounds_and_at_the_end_of_fit(every, during, fit, monkeypatch):
    """Validation inside fit is not "outside training": eval_clients_every=0 evaluates only at the end."""
    module = make_module(eval_clients_every=every)
    rounds = []
    original = module.evaluate_clients

    def counting(*args, **kwargs):
        rounds.append(module.global_step)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, "evaluate_clients", counting)
    fit(module, rounds=3)
    assert rounds == during
    assert module.final_client_metrics()  # summary.json's client_acc: the final model, evaluated once
    assert module.final_client_metrics()
    assert rounds == [*during, 3]
    module.trainer.validate(module, datamodule=module.datamodule, verbose=False)  # outside fit: always
    assert rounds == [*during, 3, 3]


@pytest.mark.parametrize(("threads", "width", "expected"), [(None, 4, [1]), (2, 4, [2]), (None, 400, [])])
def test_cpu_threads_default_to_one_for_small_models(threads, width, expected, fit, monkeypatch):
    """Under 1M parameters a CPU process trains on one intra-op thread unless threads_per_process is set;
    a larger model keeps torch's default (no call)."""
    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    module = make_module(width=width, runtime={"threads_per_process": threads})
    assert (sum(p.numel() for p in module.client.parameters()) < 1_000_000) == (width == 4)
    fit(module, rounds=1)
    assert calls == expected


# ------------------------------------------------------------------------------ devices
# No GPU in CI: the "meta" device stands in for "somewhere other than the module". The data module keeps
# its host copy in ``splits``, so moving its training tensors to "meta" and back loses nothing, while any
# code that ran the module on them without moving them first would fail.
def test_client_evaluation_pulls_the_data_to_the_module_device(tmp_path):
    """After fit (module back on the CPU, data left on the GPU) and from a checkpoint (the other way)."""
    module, data = make_module(), make_data()
    trainer = make_trainer(tmp_path, rounds=1)
    trainer.fit(module, datamodule=data)
    before = module.evaluate_clients(lightning_log=False)
    data.to("meta")
    assert module.evaluate_clients(lightning_log=False) == before
    assert data.device == torch.device("cpu")
    data.to("meta")
    assert "personal/acc" in trainer.validate(module, datamodule=data, verbose=False)[0]


def test_fit_moves_the_data_to_the_module_device_and_back_at_teardown(tmp_path):
    data = make_data()
    data.setup("fit")
    data.to("meta")

    class LeaveDataElsewhere(Callback):
        def on_train_end(self, trainer, pl_module):
            assert data.device == pl_module.device  # on_fit_start pulled it to the module
            data.to("meta")

    trainer = make_trainer(tmp_path, rounds=1, callbacks=[LeaveDataElsewhere()])
    trainer.fit(make_module(), datamodule=data)
    assert data.device == torch.device("cpu")  # teardown gives it back to the host, as the module


def test_the_summary_evaluates_the_final_model_before_lightning_moves_it_to_the_cpu(tmp_path):
    """Lightning's teardown (module to CPU) runs between on_train_end and on_fit_end."""
    seen = {}

    class Probe(Callback):
        def on_train_end(self, trainer, pl_module):
            seen["round"] = pl_module._client_eval_round

    module = make_module(eval_clients_every=0)
    trainer = make_trainer(tmp_path, rounds=2, callbacks=[FederatedSummary(), Probe()])
    trainer.fit(module, datamodule=make_data())
    assert seen["round"] == 2
    assert trainer.callbacks[0].summary["client_acc"]["n"] == 4


def test_task_metrics_follow_the_module(fit):
    """The global metrics are a submodule (they move with the module); the engine makes the clients'
    metrics on the model's device."""
    module = make_module()
    fit(module, rounds=1)
    assert dict(module.named_children())["global_metrics"] is module.global_metrics
    module.to("meta")
    assert module.global_metrics.device.type == "meta" and module.engine.metrics().device.type == "meta"


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ({"gradient_clip_val": 1.0}, "trainer.gradient_clip_val=1.0 .* set model.grad_clip_norm"),
        (
            {"gradient_clip_algorithm": "value"},
            "trainer.gradient_clip_algorithm='value' .* model.grad_clip_norm",
        ),
        ({"accumulate_grad_batches": 2}, "trainer.accumulate_grad_batches=2 .* set model.local_steps"),
        ({"max_epochs": 5}, "trainer.max_epochs=5: one epoch holds all rounds; set trainer.max_steps"),
    ],
)
def test_trainer_options_rounds_cannot_honour_name_the_federated_equivalent(fit, option, message):
    with pytest.raises(ConfigError, match=message):
        fit(make_module(), **option)


def test_trainer_options_that_fit_rounds_are_accepted(fit):
    trainer = fit(make_module(), rounds=1, max_epochs=1, gradient_clip_val=0.0)
    assert trainer.global_step == 1


def test_eval_fraction_evaluates_a_seeded_sample_during_fit_and_every_client_at_the_end(fit, monkeypatch):
    module = make_module(eval_fraction=0.5, eval_clients_every=1)
    evaluated: list[list[int]] = []
    original = module.evaluate_clients

    def recording(*args, **kwargs):
        per = original(*args, **kwargs)
        evaluated.append(sorted(per))
        return per

    monkeypatch.setattr(module, "evaluate_clients", recording)
    fit(module, rounds=2, data=make_data(num_clients=6))
    assert [len(e) for e in evaluated] == [3, 3]  # floor(0.5 * 6) clients after each round
    assert evaluated == [
        module.engine.eval_sample(1),
        module.engine.eval_sample(2),
    ]  # seeded by (seed, round)
    assert sorted(module.final_client_metrics()) == list(range(6))  # the final model: every client
    assert evaluated[-1] == list(range(6))


@pytest.mark.parametrize("bad", [0.0, 1.5, float("nan")])
def test_eval_fraction_outside_unit_interval_is_rejected(bad):
    with pytest.raises(ConfigError, match=r"model.eval_fraction=.* must be .*in \(0, 1\]"):
        make_module(eval_fraction=bad)


def _default_net_module(**kw):
    from fl_lightning.api.client import ClientModule
    from fl_lightning.lightning.module import FederatedModule
    from fl_lightning.models import SmallCNN
    from fl_lightning.strategies import FedProx

    client = ClientModule(SmallCNN(in_channels=1, num_classes=10), lr=0.05, momentum=0.0)
    return FederatedModule(client=client, strategy=FedProx(mu=0.05), local_steps=1, participation=0.5, **kw)


def test_load_from_checkpoint_rebuilds_module_and_data_and_a_resume_equals_the_run_straight_through(tmp_path):
    import lightning as L

    from fl_lightning.data import FederatedDataModule
    from fl_lightning.lightning import federated_trainer
    from fl_lightning.lightning.module import FederatedModule

    fast = {"enable_progress_bar": False, "accelerator": "cpu", "devices": 1}
    L.seed_everything(7, verbose=False)
    straight = _default_net_module()
    straight_root = tmp_path / "straight"  # no logger: the summary goes to default_root_dir, not the cwd
    federated_trainer(
        max_steps=2, logger=False, enable_checkpointing=False, default_root_dir=straight_root, **fast
    ).fit(straight, datamodule=make_data(partition=Dirichlet(alpha=0.3)))
    L.seed_everything(7, verbose=False)
    first = federated_trainer(max_steps=1, default_root_dir=tmp_path, **fast)
    first.fit(_default_net_module(), datamodule=make_data(partition=Dirichlet(alpha=0.3)))
    last = Path(first.log_dir) / "checkpoints" / "last.ckpt"
    L.seed_everything(0, verbose=False)  # another process, another seed: the checkpoint's is used

    model, data = FederatedModule.load_from_checkpoint(last), FederatedDataModule.load_from_checkpoint(last)
    assert (model.seed, data.seed, data.partition.alpha, model.strategy.mu) == (7, 7, 0.3, 0.05)
    assert (model.client.lr, model.engine.config.participation) == (0.05, 0.5)
    resumed = federated_trainer(max_steps=2, default_root_dir=tmp_path, **fast)
    resumed.fit(model, datamodule=data, ckpt_path=str(last))
    assert resumed.log_dir == first.log_dir  # the same run folder
    for k, v in global_weights(straight).items():
        assert torch.equal(v, global_weights(model)[k]), k
    assert [r.round for r in model.history] == [0, 1]


def test_a_module_loaded_from_a_checkpoint_validates_at_its_round_with_its_client_states(tmp_path):
    from fl_lightning.data import FederatedDataModule
    from fl_lightning.lightning import federated_trainer
    from fl_lightning.lightning.module import FederatedModule

    trainer = federated_trainer(max_steps=1, default_root_dir=tmp_path, enable_progress_bar=False)
    trainer.fit(_default_net_module(), datamodule=make_data())
    last = Path(trainer.log_dir) / "checkpoints" / "last.ckpt"
    model = FederatedModule.load_from_checkpoint(last)
    assert model.history == []  # applied when a Trainer sets it up with its data
    check = federated_trainer(logger=False, enable_progress_bar=False)
    (metrics,) = check.validate(model, datamodule=FederatedDataModule.load_from_checkpoint(last))
    assert metrics["global/acc"] == pytest.approx(trainer.callback_metrics["global/acc"].item())
    assert model.rounds_done == 1 and len(model.history) == 1
    with pytest.raises(ConfigError, match=r"^ckpt_path: the checkpoint comes from a different config"):
        check.validate(FederatedModule.load_from_checkpoint(last), datamodule=make_data(num_clients=5))


def test_a_network_its_saved_arguments_do_not_rebuild_is_one_line_saying_to_pass_it(tmp_path):
    from fl_lightning.lightning import federated_trainer
    from fl_lightning.lightning.module import FederatedModule

    trainer = federated_trainer(max_steps=1, default_root_dir=tmp_path, enable_progress_bar=False)
    module = make_module()  # SmallCNN(width=4, hidden=16): SmallCNN keeps neither argument
    trainer.fit(module, datamodule=make_data())
    last = Path(trainer.log_dir) / "checkpoints" / "last.ckpt"
    with pytest.raises(ConfigError, match=r"^ckpt_path: model.client.net: .* client=ClientModule\(SmallCNN"):
        FederatedModule.load_from_checkpoint(last)
    loaded = FederatedModule.load_from_checkpoint(last, client=make_module().client)
    for k, v in global_weights(module).items():
        assert torch.equal(v, global_weights(loaded)[k]), k


def test_a_checkpoint_that_saved_the_round_policy_inside_the_system_model_loads_and_resumes(tmp_path, caplog):
    """A checkpoint written before ``model.round_policy`` (the policy's fields among the system model's
    arguments, in its saved config and its flat hparams) rebuilds the same module and resumes without a
    "changed hyperparameters" line."""
    from fl_lightning.lightning import federated_trainer
    from fl_lightning.lightning.module import FederatedModule
    from fl_lightning.system import Devices, RoundPolicy

    policy = RoundPolicy(deadline_s=1000.0, policy="partial", target_accuracy=0.5, max_sim_time_s=1e6)
    fast = {"enable_progress_bar": False, "accelerator": "cpu", "devices": 1}
    first = federated_trainer(max_steps=1, default_root_dir=tmp_path, **fast)
    first.fit(_default_net_module(system=Devices(speed=50.0), round_policy=policy), datamodule=make_data())
    last = Path(first.log_dir) / "checkpoints" / "last.ckpt"
    saved = torch.load(last, weights_only=True)
    hparams = saved[FederatedModule.CHECKPOINT_HYPER_PARAMS_KEY]
    assert hparams["round_policy"]["init_args"]["deadline_s"] == 1000.0  # the current form
    # rewritten as before: the policy's fields among the system model's init_args
    fields = hparams.pop("round_policy")["init_args"]
    hparams["system"]["init_args"].update(fields)
    flat = saved["fl_lightning"]["hparams"]
    for name in fields:
        flat[f"model.system.{name}"] = flat.pop(f"model.round_policy.{name}")
    old = last  # in its run folder, as written
    torch.save(saved, old)

    model = FederatedModule.load_from_checkpoint(old)
    assert model.round_policy == policy and model.system.speed == 50.0
    resumed = federated_trainer(max_steps=2, default_root_dir=tmp_path, **fast)
    with caplog.at_level("WARNING", logger="fl_lightning"):
        resumed.fit(model, datamodule=make_data(), ckpt_path=str(old))
    assert not [r for r in caplog.records if "changed hyperparameters" in r.getMessage()]
    assert [r.round for r in model.history] == [0, 1]
    assert model.system.round_policy is model.round_policy  # the one object the system model applies


def test_load_from_checkpoint_of_a_strategy_that_sizes_its_state_in_setup(tmp_path):
    """IFCA's cluster models are sized when a run sets up (empty buffers before): a module built from the
    checkpoint takes them as saved (it refused them, size mismatch; so did the main process of the fork
    launcher receiving rank 0's weights)."""
    from fl_lightning.cli import main
    from fl_lightning.lightning.module import FederatedModule

    args = ["fit", "--model.strategy=IFCA", "--model.strategy.k=2", "--trainer.max_steps=1"]
    main(
        [
            *args,
            "--data.num_clients=4",
            "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={tmp_path}",
        ]
    )
    last = next(tmp_path.glob("lightning_logs/*/checkpoints/last.ckpt"))
    model = FederatedModule.load_from_checkpoint(last)
    saved = torch.load(last, weights_only=True)["state_dict"]
    assert torch.equal(model.strategy.models, saved["strategy.models"])
    assert torch.equal(model.strategy.assigned, saved["strategy.assigned"])


def test_a_checkpoint_that_saved_the_runtime_at_the_models_level_loads_and_resumes(tmp_path, caplog):
    """A checkpoint written before ``model.runtime`` (its knobs as arguments of the module itself, in its
    saved config, its flat hparams, or only in its run's config.yaml) rebuilds the same module and resumes
    without a "changed hyperparameters" line."""
    from fl_lightning import Runtime
    from fl_lightning.lightning import federated_trainer
    from fl_lightning.lightning.module import FederatedModule

    runtime = Runtime(vectorize=2, vectorize_cpu="batched", threads_per_process=1, state_memory_mb=64.0)
    fast = {"enable_progress_bar": False, "accelerator": "cpu", "devices": 1}
    first = federated_trainer(max_steps=1, default_root_dir=tmp_path, **fast)
    first.fit(_default_net_module(runtime=runtime), datamodule=make_data())
    last = Path(first.log_dir) / "checkpoints" / "last.ckpt"
    saved = torch.load(last, weights_only=True)
    hparams = saved[FederatedModule.CHECKPOINT_HYPER_PARAMS_KEY]
    assert hparams["runtime"]["init_args"]["vectorize"] == 2  # the current form
    # rewritten as before: the knobs among the module's own arguments
    fields = hparams.pop("runtime")["init_args"]
    hparams.update(fields)
    flat = saved["fl_lightning"]["hparams"]
    for name in fields:
        flat[f"model.{name}"] = flat.pop(f"model.runtime.{name}")
    torch.save(saved, last)

    model = FederatedModule.load_from_checkpoint(last)
    assert model.runtime == runtime and model.engine.config.local.vectorize == 2
    resumed = federated_trainer(max_steps=2, default_root_dir=tmp_path, **fast)
    with caplog.at_level("WARNING", logger="fl_lightning"):
        resumed.fit(model, datamodule=make_data(), ckpt_path=str(last))
    assert not [r for r in caplog.records if "changed hyperparameters" in r.getMessage()]
    assert [r.round for r in model.history] == [0, 1]

    # a checkpoint with no saved arguments: its run's config.yaml, written with the former spelling
    del saved[FederatedModule.CHECKPOINT_HYPER_PARAMS_KEY]
    torch.save(saved, last)
    config = {"seed_everything": 0, "model": {"local_steps": 1, **fields}}
    (last.parent.parent / "config.yaml").write_text(yaml.safe_dump(config))
    assert FederatedModule.load_from_checkpoint(last).runtime == runtime
