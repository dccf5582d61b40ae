import math
import shutil

import pytest
import torch
from torch import nn

from fl_lightning.api.aggregation import Aggregator
from fl_lightning.api.client import ClientModule, merge_train_states
from fl_lightning.callbacks import FederatedCallback
from fl_lightning.cli import main
from fl_lightning.data.federated import ClientData
from fl_lightning.engine import Engine, EngineConfig, LocalConfig, Sequential
from fl_lightning.engine.round import num_sampled
from fl_lightning.errors import ConfigError, RunError
from fl_lightning.functional.sampling import sample_clients
from fl_lightning.lightning.checkpoint import LastRoundCheckpoint
from fl_lightning.strategies import (
    DP,
    Ditto,
    FedAvg,
    FedAvgM,
    FedReg,
    FedRep,
    FedSAM,
    FineTune,
    MoFedSAM,
    PFedMe,
)

from conftest import global_weights, make_data, make_engine, make_module, make_trainer


def test_sampling_depends_only_on_seed_and_round():
    first = [sample_clients(100, 10, seed=3, round=r) for r in range(5)]
    # sampling round 4 alone (as after a resume) gives the same clients
    assert sample_clients(100, 10, seed=3, round=4) == first[4]
    assert all(len(set(s)) == 10 and s == sorted(s) for s in first)
    assert first[0] != first[1]
    assert sample_clients(100, 10, seed=4, round=0) != first[0]


def test_number_of_sampled_clients():
    assert num_sampled(100, 0.1, None) == 10
    assert num_sampled(200, 0.05, None) == 10
    assert num_sampled(10, 0.01, None) == 1
    assert num_sampled(10, 0.5, 7) == 7
    with pytest.raises(ConfigError, match="model.clients_per_round"):
        num_sampled(10, 1.0, 11)


def test_participation_outside_unit_interval_is_rejected():
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ConfigError, match=r"model.participation=.* must be in \(0, 1\]"):
            make_module(participation=bad)


class Recorder(FedAvg):
    """FedAvg that records what the loop gives each client."""

    def __init__(
        self, fail: set[int] = frozenset(), nan: set[int] = frozenset(), fail_rounds: set[int] | None = None
    ) -> None:
        super().__init__()
        self.seen: list[tuple[int, int, float, int]] = []
        self.steps: dict[tuple[int, int], int] = {}
        self.fail, self.nan = set(fail), set(nan)
        self.fail_rounds = fail_rounds  # None: every round

    def on_client_start(self, module, ctx):
        if ctx.client_id in self.fail and (self.fail_rounds is None or ctx.round in self.fail_rounds):
            raise RuntimeError("deliberate failure")

    def on_after_optimizer_step(self, module, optimizer, ctx):
        key = (ctx.round, ctx.client_id)
        self.steps[key] = self.steps.get(key, 0) + 1

    def upload(self, module, ctx):
        self.seen.append((ctx.round, ctx.client_id, ctx.lr, ctx.num_steps))
        up = super().upload(module, ctx)
        if ctx.client_id in self.nan:
            up["weights"] = {k: v * float("nan") for k, v in up["weights"].items()}
        return up


def test_lr_decays_per_round_and_local_steps_are_counted(fit):
    rec = Recorder()
    fit(make_module(rec, local_steps=3, lr_decay=0.5), rounds=3)
    lrs = {r: lr for r, _, lr, _ in rec.seen}
    assert lrs == {0: pytest.approx(0.1), 1: pytest.approx(0.05), 2: pytest.approx(0.025)}
    assert set(rec.steps.values()) == {3}


def test_local_epochs_run_ceil_n_over_b_steps_per_epoch(fit):
    rec = Recorder()
    data = make_data(batch_size=16)
    fit(make_module(rec, local_steps=None, local_epochs=2), data=data, rounds=1)
    for c in data.clients:
        assert rec.steps[(0, c.client_id)] == 2 * math.ceil(c.num_samples / 16)


def test_failing_and_non_finite_clients_are_excluded(fit, caplog):
    rec = Recorder(fail={1}, nan={2})
    module = make_module(rec)
    trainer = fit(module, rounds=2, allow_failed_clients=True)
    assert [r.failed for r in module.history] == [2, 2]
    assert all(torch.isfinite(v).all() for v in global_weights(module).values())
    assert trainer.callback_metrics["round/failed_clients"] == 2
    assert "excluded from the aggregate" in caplog.text


class WeightsAtRoundEnd(FederatedCallback):
    def __init__(self) -> None:
        self.weights: list[dict[str, torch.Tensor]] = []

    def on_round_end(self, trainer, pl_module, round, record):
        self.weights.append(global_weights(pl_module))


def test_a_round_where_every_client_fails_is_skipped(fit, caplog):
    module = make_module(Recorder(fail={0, 1, 2, 3}, fail_rounds={0}), clients_per_round=1)
    before = global_weights(module)
    seen = WeightsAtRoundEnd()
    trainer = fit(module, rounds=2, callbacks=[seen], allow_failed_clients=True)
    assert trainer.global_step == 2
    assert [(r.round, r.skipped, r.failed) for r in module.history] == [(0, True, 1), (1, False, 0)]
    assert all(torch.equal(seen.weights[0][k], v) for k, v in before.items())
    assert not all(torch.equal(seen.weights[1][k], v) for k, v in before.items())
    assert "round 0 skipped: every sampled client failed (client" in caplog.text
    assert "RuntimeError: deliberate failure" in caplog.text


class FailingAvgM(FedAvgM):
    def __init__(self, fail_rounds: set[int]) -> None:
        super().__init__(momentum=0.9)
        self.fail_rounds = fail_rounds

    def on_client_start(self, module, ctx):
        if ctx.round in self.fail_rounds:
            raise RuntimeError("deliberate failure")


def test_a_skipped_round_leaves_server_momentum_and_weights_alone(fit):
    module = make_module(FailingAvgM(fail_rounds={1}))
    seen = WeightsAtRoundEnd()
    trainer = fit(module, rounds=3, callbacks=[seen], allow_failed_clients=True)
    assert trainer.global_step == 3
    assert [r.skipped for r in module.history] == [False, True, False]
    assert all(torch.equal(seen.weights[1][k], v) for k, v in seen.weights[0].items())
    state = trainer.optimizers[0].state
    assert all(s["momentum_buffer"] is not None for s in state.values())


def test_consecutive_failed_rounds_stop_the_run_with_one_line(fit):
    module = make_module(Recorder(fail={0, 1, 2, 3}), max_failed_rounds=2)
    with pytest.raises(RunError) as info:
        fit(module, rounds=5)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith("round 1: every sampled client failed for 2 consecutive rounds")
    assert "(last error: client 0: RuntimeError: deliberate failure)" in msg
    assert "model.max_failed_rounds=2" in msg
    assert len(module.history) == 1


def test_a_round_with_uploads_ends_the_failure_streak():
    """A failed round is one unit of the streak: 0, 1 fail, 2 aggregates, 3, 4 fail (2 in a row), 5 stops."""
    engine = make_engine(FailingAvgM(fail_rounds={0, 1, 3, 4, 5}), max_failed_rounds=3)
    streaks = []
    for r in range(5):
        engine.run_round(r)
        streaks.append(engine.failed_streak)
    assert streaks == [1, 2, 0, 1, 2]
    with pytest.raises(RunError, match="^round 5: every sampled client failed for 3 consecutive rounds"):
        engine.run_round(5)


def test_the_failure_streak_survives_a_resume(tmp_path):
    """Two failed rounds, a checkpoint, a resume: the third failed round in a row stops the run."""

    def run(rounds, folder, ckpt=None):
        module = make_module(FailingAvgM(fail_rounds={0, 1, 2}), max_failed_rounds=3)
        trainer = make_trainer(
            folder, rounds=rounds, enable_checkpointing=True, callbacks=[LastRoundCheckpoint(folder / "ck")]
        )
        trainer.fit(module, datamodule=make_data(), ckpt_path=ckpt)
        return module

    assert run(2, tmp_path / "a").engine.failed_streak == 2
    with pytest.raises(RunError, match="^round 2: every sampled client failed for 3 consecutive rounds"):
        run(4, tmp_path / "b", ckpt=str(tmp_path / "a" / "ck" / "last.ckpt"))


def test_failures_stop_the_run_at_once_when_not_tolerated(fit):
    match = "client 0 failed .*deliberate failure.*tolerate_client_failures=false"
    with pytest.raises(RunError, match=match) as err:
        fit(make_module(Recorder(fail={0}), tolerate_client_failures=False), rounds=1)
    assert isinstance(err.value.__cause__, RuntimeError)  # the client's own exception, for a debugger


def test_aggregator_weights_by_samples_or_uniformly():
    agg = Aggregator(weighting={"control": "uniform"})
    agg.add({"weights": {"w": torch.tensor([1.0])}, "control": {"c": torch.tensor([1.0])}}, num_samples=3)
    agg.add({"weights": {"w": torch.tensor([5.0])}, "control": {"c": torch.tensor([5.0])}}, num_samples=1)
    means = agg.means()
    assert means["weights"]["w"].item() == pytest.approx(2.0)
    assert means["control"]["c"].item() == pytest.approx(3.0)
    assert agg.totals == {"weights": 4.0, "control": 2.0}


def test_compile_is_validated_and_resolved_per_device():
    with pytest.raises(ConfigError, match="model.runtime.compile"):
        make_module(runtime={"compile": "fast"})
    from fl_lightning.engine.local import LocalConfig

    assert LocalConfig(8).compile_mode(torch.device("cpu")) is None
    assert LocalConfig(8, compile=True).compile_mode(torch.device("cpu")) == "default"
    assert LocalConfig(8, compile=True).compile_mode(torch.device("cuda")) == "reduce-overhead"
    assert LocalConfig(8, compile="max-autotune").compile_mode(torch.device("cpu")) == "max-autotune"


@pytest.mark.slow
def test_compiled_local_steps_match_eager(fit):
    if not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        pytest.skip("torch.compile on CPU needs a C++ compiler (g++/clang++) for inductor's generated code")
    eager, compiled = make_module(FedAvg()), make_module(FedAvg(), runtime={"compile": True})
    fit(eager, rounds=2)
    fit(compiled, rounds=2)
    assert getattr(compiled.worker, "_fl_compile_mode", None) == "default"  # compiled once, kept
    a, b = global_weights(eager), global_weights(compiled)
    assert all(torch.allclose(a[k], b[k], rtol=0, atol=1e-4) for k in a)
    assert any(not torch.equal(a[k], global_weights(make_module(FedAvg()))[k]) for k in a)  # it trained


class RecordingClient(ClientModule):
    """A ClientModule that records every step's task loss, batch size and number of correct samples."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.steps: list[tuple[float, int, int]] = []

    def _track_train(self, outputs, target, loss) -> None:
        correct = int((outputs.argmax(dim=1) == target).sum())
        self.steps.append((float(loss), target.shape[0], correct))
        super()._track_train(outputs, target, loss)


def test_round_train_metrics_pool_the_samples_of_all_clients():
    """train/loss and train/acc are means over every sample trained on (client states merged).

    Two clients of 10 and 40 samples each take 3 steps of batch 8: client 0 sees 8 + 2 + 8 samples
    (a smaller last batch of its first pass), client 1 sees 24. The pooled mean weights the clients
    by those counts, not by their sizes as a mean of per-client means weighted by size would.
    """
    torch.manual_seed(0)
    x, y = torch.randn(50, 4), torch.randint(0, 3, (50,))
    clients = [
        ClientData(0, x, y, torch.arange(10), torch.empty(0, dtype=torch.long)),
        ClientData(1, x, y, torch.arange(10, 50), torch.empty(0, dtype=torch.long)),
    ]
    engine = Engine(
        RecordingClient(nn.Linear(4, 3), lr=0.1), FedAvg(), EngineConfig(LocalConfig(8, local_steps=3))
    )
    engine.setup(clients, "multiclass", 3, executor=Sequential())
    res = engine.run_round(0).result
    worker = engine.worker

    per_client = {0: worker.steps[:3], 1: worker.steps[3:]}
    seen = {c: sum(n for _, n, _ in s) for c, s in per_client.items()}
    assert seen == {0: 18, 1: 24}
    for c, steps in per_client.items():
        assert res.client_metrics[c]["train_loss"] == pytest.approx(sum(v * n for v, n, _ in steps) / seen[c])
        assert res.client_metrics[c]["train_acc"] == pytest.approx(sum(k for _, _, k in steps) / seen[c])
    pooled_loss = sum(v * n for v, n, _ in worker.steps) / 42
    pooled_acc = sum(k for _, _, k in worker.steps) / 42
    assert res.train_metrics["train_loss"] == pytest.approx(pooled_loss, rel=1e-6)
    assert res.train_metrics["train_acc"] == pytest.approx(pooled_acc, rel=1e-6)
    # the former mean of per-client means weighted by client size (10, 40) is a different number
    by_size = sum(res.client_metrics[c]["train_loss"] * n for c, n in ((0, 10), (1, 40))) / 50
    assert by_size != pytest.approx(pooled_loss, rel=1e-4)


def test_train_metrics_merge_states_in_client_order():
    a, b = ClientModule(nn.Linear(2, 2)), ClientModule(nn.Linear(2, 2))
    assert a.train_state() == {} and merge_train_states([a.train_state()]) == {}
    a._track_train(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 0]), torch.tensor(2.0))
    b._track_train(torch.tensor([[1.0, 0.0]]), torch.tensor([0]), torch.tensor(5.0))
    merged = merge_train_states([a.train_state(), b.train_state()])
    assert merged == pytest.approx({"train_loss": (2.0 * 2 + 5.0) / 3, "train_acc": 2 / 3})
    assert a.train_stats() == pytest.approx({"train_loss": 2.0, "train_acc": 0.5})
    a.reset_train_stats()
    assert a.train_state() == {}


# ------------------------------------------------------------------------------ configuration errors
class _ScalerPrecision:
    """A precision plugin with a gradient scaler (as ``trainer.precision=16-mixed`` on a GPU)."""

    scaler = object()


@pytest.mark.parametrize(
    ("strategy", "owner"),
    [
        (lambda: FedSAM(), "FedSAM"),
        (lambda: Ditto(), "Ditto"),
        (lambda: FedRep(), "FedRep"),
        (lambda: PFedMe(), "PFedMe"),
        (lambda: FedReg(), "FedReg"),
        (lambda: DP(FedSAM()), "FedSAM"),
        (lambda: FineTune(MoFedSAM()), "MoFedSAM"),
    ],
)
def test_a_strategy_with_its_own_local_step_is_refused_under_a_gradient_scaler(strategy, owner):
    """The local loop steps through the scaler and never calls local_step: one ConfigError before round 1."""
    engine = make_engine()
    engine.strategy = strategy()
    with pytest.raises(ConfigError, match=rf"model.strategy: {owner} needs its own local step.*16-mixed"):
        engine.setup(engine.clients, "multiclass", 10, precision=_ScalerPrecision())
    engine.strategy = DP(FedAvg())  # the default local step is fine
    engine.setup(engine.clients, "multiclass", 10, precision=_ScalerPrecision())


@pytest.mark.parametrize("strategy", ["VHL", "FedReg", "FedPAC"])
def test_a_strategy_that_cannot_take_the_task_is_one_error_line_before_round_1(tmp_path, capsys, strategy):
    """Multilabel data: VHL, FedReg and FedPAC refuse it in Strategy.check (exit 2), no client runs."""
    args = [
        "fit",
        f"--model.strategy={strategy}",
        "--data.dataset=synthetic:flair",
        "--data.partition=IID",
        "--data.num_clients=4",
        "--data.synthetic.train_size=64",
        "--data.synthetic.test_size=16",
        "--data.synthetic.shape=[3,8,8]",
        "--model.client.init_args.task=multilabel",
        "--model.client.init_args.net=fl_lightning.models.MLP",
        "--model.client.init_args.net.in_features=192",
        "--model.client.init_args.net.num_classes=17",
        "--trainer.max_steps=2",
        f"--trainer.default_root_dir={tmp_path}",
    ]
    with pytest.raises(SystemExit) as exit_:
        main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: model.strategy={strategy} ")
    assert "multilabel" in err[0] or "single-label" in err[0]
    assert not (tmp_path / "lightning_logs").exists() or not list(
        (tmp_path / "lightning_logs").rglob("*.ckpt")
    )
