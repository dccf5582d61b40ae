"""fl_lightning.engine.vectorized: model.runtime.vectorize trains a round's clients as one batched computation
with the results of the sequential round (weights, per-client metrics, client state), or falls back to it with
one notice."""

import logging
import shutil

import pytest
import torch
from torch import nn

from fl_lightning.api.client import ClientModule
from fl_lightning.api.strategy import StrategyWrapper
from fl_lightning.callbacks import FederatedCallback
from fl_lightning.data.federated import ClientData
from fl_lightning.engine import batched, executors, vectorized
from fl_lightning.engine.local import outputs_together
from fl_lightning.engine.vectorized import StackedWorker, group_size, stack_payloads, stack_states
from fl_lightning.errors import ConfigError
from fl_lightning.models import MLP, Decomposed, LogisticRegression, SmallCNN, Tensorized
from fl_lightning.strategies import FedAvg, get_strategy
from fl_lightning.strategies.plugins import (
    DP,
    Attack,
    FastSlow,
    FedCOG,
    FineTune,
    Krum,
    Median,
    NormBounded,
    PersonalAtoms,
    TrimmedMean,
)

from conftest import global_weights, make_data, make_module, make_trainer

ATOL = 1e-5
STRATEGIES = {
    "FedAvg": {},
    "FedProx": {"mu": 0.1},
    "Scaffold": {},
    "FedDyn": {"alpha": 0.1},
    "FedDC": {"alpha": 0.1},
    "FedSAM": {"rho": 0.05, "clip_norm": 1.0},
    "FedSMOO": {"beta": 10.0, "rho": 0.05, "clip_norm": 1.0},
    "FedAdam": {},
    "FedAvgM": {"server_lr": 0.5},
    "FedExP": {},
    "FedCM": {"alpha": 0.1},
    "MoFedSAM": {"rho": 0.05, "alpha": 0.1, "clip_norm": 1.0},
    "FedSpeed": {"beta": 10.0, "rho": 0.05, "sam_weight": 0.5, "clip_norm": 1.0},
    "FedGamma": {"rho": 0.05, "clip_norm": 1.0},
    "FedNova": {"mu": 0.1},
}
#: Plug-ins that vectorise, each around a strategy: ``(factory, net)``.
PLUGINS = {
    "Median": (lambda: Median(FedAvg()), "cnn"),
    "TrimmedMean": (lambda: TrimmedMean(get_strategy("FedProx", mu=0.1), beta=0.25), "cnn"),
    "Krum": (lambda: Krum(FedAvg(), f=1, m=2), "cnn"),
    "NormBounded": (lambda: NormBounded(get_strategy("Scaffold"), max_norm=0.5), "cnn"),
    "Attack": (lambda: Attack(FedAvg(), fraction=0.5, kind="scale", scale=3.0), "cnn"),
    "DP": (lambda: DP(FedAvg(), noise_multiplier=1.0, clip_norm=0.5), "cnn"),
    "DP-adaptive": (
        lambda: DP(FedAvg(), noise_multiplier=0.5, clipping="adaptive", clipped_count_stddev=0.5),
        "cnn",
    ),
    "NormBounded-Attack": (lambda: NormBounded(Attack(FedAvg(), fraction=0.5)), "cnn"),
    "FineTune": (lambda: FineTune(FedAvg(), epochs=1), "cnn"),
    "FastSlow": (lambda: FastSlow(FedAvg(), period=2, cache=False), "decomposed"),
}


class ClientLog(FederatedCallback):
    """Every client's metrics and the round's train metrics."""

    def __init__(self) -> None:
        self.clients: dict[tuple[int, int], dict[str, float]] = {}

    def on_client_end(self, trainer, pl_module, round, index, total, result) -> None:
        if result is not None:
            self.clients[(round, result.client_id)] = dict(result.metrics)


def _net(kind: str) -> nn.Module:
    if kind == "mlp":
        return MLP(in_features=64, num_classes=10, hidden=(16,))
    if kind == "mlp2":
        return MLP(in_features=64, num_classes=10, hidden=(32, 16))
    if kind == "logistic":
        return LogisticRegression(input_dim=64, num_outputs=10)
    if kind == "cp":
        return Tensorized(SmallCNN(in_channels=1, num_classes=10, width=4, hidden=16), ratio=2.0)
    if kind == "decomposed":
        return Decomposed(SmallCNN(in_channels=1, num_classes=10, width=4, hidden=16), num_atoms=4)
    return SmallCNN(in_channels=1, num_classes=10, width=4, hidden=16)


def _fit(
    tmp_path,
    strategy,
    vectorize: int | str,
    net: str = "cnn",
    rounds: int = 3,
    lr: float = 0.1,
    precision: str = "32-true",
    data_kw: dict | None = None,
    runtime: dict | None = None,
    **kw,
):
    """``rounds`` rounds on 4 Dirichlet clients of unequal size: unequal step counts, ragged last batches,
    SGD with momentum and weight decay, per-round lr decay. ``strategy``: a registered name, or
    ``(label, factory)``."""
    label, build = strategy if isinstance(strategy, tuple) else (strategy, None)
    module = make_module(
        build() if build is not None else get_strategy(strategy, **STRATEGIES.get(strategy, {})),
        client_kw={"momentum": 0.9, "weight_decay": 1e-3, **kw.pop("client_kw", {})},
        **{"local_steps": None, "local_epochs": 1, "lr_decay": 0.9, **kw},
        runtime={"vectorize": vectorize, **(runtime or {})},
    )
    torch.manual_seed(0)
    module.client.net = _net(net)
    module.client.lr = lr
    log = ClientLog()
    trainer = make_trainer(
        tmp_path / f"{label}-{vectorize}", rounds=rounds, callbacks=[log], precision=precision
    )
    trainer.fit(module, datamodule=make_data(**(data_kw or {})))
    return module, log


def _assert_same(seq, vec, atol: float = ATOL) -> None:
    (a, log_a), (b, log_b) = seq, vec
    wa, wb = global_weights(a), global_weights(b)
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=atol)
    assert log_a.clients.keys() == log_b.clients.keys()
    for key, metrics in log_a.clients.items():
        assert log_b.clients[key] == pytest.approx(metrics, rel=1e-5, abs=1e-6)
    for cid in range(4):  # the clients' persistent state (control variates, duals, drifts, mu_i)
        assert (cid in a.store) == (cid in b.store)
        if cid in a.store:
            sa, sb = a.store.get(cid), b.store.get(cid)
            assert sa.keys() == sb.keys()
            for k in sa:
                torch.testing.assert_close(sa[k], sb[k], rtol=1e-4, atol=atol)
    assert [r.train["train_loss"] for r in a.history] == pytest.approx(
        [r.train["train_loss"] for r in b.history], rel=1e-5
    )


def _vectorised(module) -> bool:
    """The run trained stacked groups and never fell back."""
    return module.engine.executor.counts["vectorised"] > 0 and not module.engine.executor.notices


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_vectorised_clients_equal_sequential_clients(tmp_path, strategy):
    """SmallCNN: under vmap (the path of networks that are not linear chains)."""
    seq, vec = _fit(tmp_path, strategy, 1), _fit(tmp_path, strategy, 4)
    assert seq[0].engine.executor.counts["vectorised"] == 0 and _vectorised(vec[0])
    _assert_same(seq, vec)


@pytest.mark.parametrize("plugin", list(PLUGINS))
def test_vectorised_plugins_equal_sequential_clients(tmp_path, plugin):
    """Plug-ins whose own work is on the server or in upload/process_upload/adapt (per client): the
    vectorised run equals the sequential one (DP's noise too: it is drawn on the aggregate from a
    seeded generator)."""
    build, net = PLUGINS[plugin]
    seq, vec = _fit(tmp_path, (plugin, build), 1, net), _fit(tmp_path, (plugin, build), 4, net)
    assert seq[0].engine.executor.counts["vectorised"] == 0 and _vectorised(vec[0])
    _assert_same(seq, vec)


@pytest.mark.parametrize(
    ("strategy", "net"), [("FedAvg", "mlp"), ("Scaffold", "mlp"), ("FedDyn", "decomposed"), ("FedProx", "cp")]
)
def test_vectorised_mlp_and_decomposed_layers(tmp_path, strategy, net):
    seq, vec = _fit(tmp_path, strategy, 1, net), _fit(tmp_path, strategy, 3, net)  # groups of 3 and 1
    assert _vectorised(vec[0])
    _assert_same(seq, vec)


#: SCAFFOLD as NIID-Bench runs it: option II's variate under momentum, the correction after the step.
NIID_SCAFFOLD = (
    "Scaffold-NIID-Bench",
    lambda: get_strategy("Scaffold", variate="option_ii", correction="after_step"),
)
#: Float64 runs: ``(strategy, net, client_kw, kw, hold_back)``. The MLPs run as a batched linear chain: its
#: SGD step fused into the backward (plain SGD, FedAvg and its server-side variants), and held back as
#: low-rank updates where ``hold_back`` (``DEFER_BYTES`` 0: every layer); or returning gradients (momentum,
#: Adam, clipping, strategies with local terms or gradient hooks). SmallCNN runs under vmap.
FLOAT64 = {
    "fused": ("FedAvg", "mlp2", {"momentum": 0.0}, {}, False),
    "fused-held-back": ("FedAvg", "mlp2", {"momentum": 0.0, "weight_decay": 0.0}, {}, True),
    "fused-FedAdam-logistic": ("FedAdam", "logistic", {"momentum": 0.0}, {}, True),
    "momentum": ("FedAvg", "mlp2", {}, {}, True),
    "clipping": ("FedAvg", "mlp2", {"momentum": 0.0}, {"grad_clip_norm": 0.5}, True),
    "adam": ("FedAvg", "mlp2", {"optimizer": "adam"}, {"lr": 0.01}, True),
    "FedProx": ("FedProx", "mlp2", {}, {}, True),
    "Scaffold": ("Scaffold", "mlp2", {"momentum": 0.0}, {}, True),
    "Scaffold-NIID-Bench": (NIID_SCAFFOLD, "mlp2", {}, {}, True),
    "FedSAM": ("FedSAM", "mlp2", {}, {}, True),
    "vmap-cnn": ("FedAvg", "cnn", {}, {}, True),
}


@pytest.mark.parametrize("case", list(FLOAT64))
def test_vectorised_clients_equal_one_at_a_time_in_float64(tmp_path, monkeypatch, case):
    """The same weights, client states and metrics as one client at a time, to 1e-9 in float64: 5 clients
    of unequal sizes (unequal step counts: a client's weights are taken when its own last step is done),
    in groups of 3 and of 2 (a stack within the stack of 3)."""
    strategy, net, client_kw, kw, hold_back = FLOAT64[case]
    monkeypatch.setattr(batched, "DEFER_BYTES", 0 if hold_back else 2**40)
    run = {"net": net, "precision": "64-true", "client_kw": client_kw, "data_kw": {"num_clients": 5}, **kw}
    seq, vec = _fit(tmp_path, strategy, 1, **run), _fit(tmp_path, strategy, 3, **run)
    assert _vectorised(vec[0]) and next(iter(global_weights(vec[0]).values())).dtype == torch.float64
    (full, within) = sorted(vec[0].engine.executor.stacks.values(), key=lambda s: -s.size)
    assert (full.size, within.size) == (3, 2) and within.within is full
    assert full.chained == (net != "cnn")
    fused = vec[0].history[-1].vectorize["vectorize/fused_sgd"]
    assert fused == float(case.startswith("fused"))
    _assert_same(seq, vec, atol=1e-9)


@pytest.mark.parametrize(("plugin", "together"), [(None, True), ("FineTune", False)])
def test_deployed_models_evaluate_together_with_the_metrics_of_one_at_a_time(
    tmp_path, monkeypatch, plugin, together
):
    """Every client deploys the global model: their test batches go through it together (several clients
    per forward), each client's metrics as one at a time; a strategy that adapts the model per client
    (FineTune) evaluates one at a time."""
    calls = []
    monkeypatch.setattr(executors, "outputs_together", lambda *a: calls.append(1) or outputs_together(*a))
    strategy = ("FineTune", lambda: FineTune(FedAvg(), epochs=1)) if plugin else "FedAvg"
    seq, vec = _fit(tmp_path, strategy, 1, "mlp", rounds=1), _fit(tmp_path, strategy, 4, "mlp", rounds=1)
    a, b = seq[0].final_client_metrics(), vec[0].final_client_metrics()
    assert a.keys() == b.keys() == {0, 1, 2, 3} and bool(calls) == together
    for cid in a:
        assert b[cid] == pytest.approx(a[cid], rel=1e-5)


def test_auto_trains_the_rounds_clients_together_within_the_memory_budget(tmp_path):
    vec = _fit(tmp_path, "FedAvg", "auto", "mlp", rounds=2, data_kw={"num_clients": 5})
    assert vec[0].engine.executor.max_group == 5 and _vectorised(vec[0])
    assert vec[0].history[-1].vectorize["vectorize/group_size"] == 5.0
    small = _fit(tmp_path / "small", "FedAvg", "auto", "cnn", rounds=1, runtime={"vectorize_memory_gb": 1e-4})
    assert 1 <= small[0].engine.executor.max_group < 4  # ~100 KiB: fewer than the round's 4 clients


@pytest.mark.parametrize("strategy", ["FedProx", "FedDC", "FedSAM", "FedSMOO"])
def test_vectorised_decomposed_layers_other_strategies(tmp_path, strategy):
    seq, vec = _fit(tmp_path, strategy, 1, "decomposed"), _fit(tmp_path, strategy, 4, "decomposed")
    assert _vectorised(vec[0])
    # FedDC's drift feeds each round's float32 rounding (vmap's batched convolutions sum in another
    # order) into the next: 3.6e-5 on weights of magnitude 0.4 after 3 rounds with torch 2.14.1
    _assert_same(seq, vec, atol=1e-4 if strategy == "FedDC" else ATOL)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["FedAvg", "FedSAM"])
def test_compiled_vectorised_clients_equal_sequential_eager_clients(tmp_path, monkeypatch, strategy):
    """model.runtime.compile compiles the vmapped forward once per stack (a linear chain too: compiled, it
    runs under vmap): after a compiled forward's first call, compiling it again (e.g. for a ragged last
    batch's new shape) is an error (stance ``fail_on_recompile``) that the run does not survive, and the
    compiled code is what ran (the profiler's "Torch-Compiled Region" events). Public torch APIs only:
    ``torch._dynamo``'s config and counters change between releases."""
    if not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        pytest.skip("torch.compile on CPU needs a C++ compiler (g++/clang++) for inductor's generated code")
    seq = _fit(tmp_path, strategy, 1, "mlp", rounds=2)
    compile_forward = StackedWorker.compile_forward

    def compile_once(stack, mode):
        compile_forward(stack, mode)
        if mode is not None:
            (stack._stacked_fn,) = _no_compile_after_first_call(stack._stacked_fn)

    monkeypatch.setattr(StackedWorker, "compile_forward", compile_once)
    torch.compiler.reset()
    try:
        with torch.profiler.profile() as prof:
            vec = _fit(tmp_path, strategy, 4, "mlp", rounds=2, runtime={"compile": True})
    finally:
        torch.compiler.reset()
    assert any(e.name.startswith("Torch-Compiled Region") for e in prof.events())  # it ran compiled
    (stack,) = vec[0].engine.executor.stacks.values()
    assert _vectorised(vec[0]) and stack.compile_mode == "default"
    wa, wb = global_weights(seq[0]), global_weights(vec[0])
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=1e-4)
    assert [r.train["train_loss"] for r in seq[0].history] == pytest.approx(
        [r.train["train_loss"] for r in vec[0].history], abs=1e-4
    )


def _no_compile_after_first_call(*fns):
    """``fns`` wrapped so that every call after a function's first runs under the compiler stance
    ``fail_on_recompile`` (any compilation then raises)."""

    def wrap(fn):
        calls = [0]

        def call(*args):
            calls[0] += 1
            if calls[0] == 1:
                return fn(*args)
            with torch.compiler.set_stance("fail_on_recompile"):
                return fn(*args)

        return call

    return tuple(wrap(fn) for fn in fns)


def test_padding_to_the_batch_size_masks_the_padding_out():
    """A compiled stack pads every batch to the full batch size (one shape): the same losses."""
    torch.manual_seed(0)
    worker = ClientModule(_net("mlp"), lr=0.1)
    stack = StackedWorker(worker, 2)
    x_all, y_all = torch.randn(20, 1, 8, 8), torch.randint(0, 10, (20,))
    data = ClientData(0, x_all, y_all, torch.arange(20), torch.empty(0, dtype=torch.long))
    idx, counts = [torch.arange(3), torch.arange(5, 10)], [3, 5]
    gens = [torch.Generator(), torch.Generator()]
    short = vectorized._stacked_batch(idx, counts, [data, data], gens, None)
    wide = vectorized._stacked_batch(idx, counts, [data, data], gens, None, width=8)
    assert short[0].shape[1] == 5 and wide[0].shape[1] == 8 and wide[2].sum(1).tolist() == [3, 5]
    a, b = stack.training_step(short, 0), stack.training_step(wide, 0)
    torch.testing.assert_close(a["loss"], b["loss"])


def test_clipping_is_per_client_and_plain_sgd_scaffold(tmp_path):
    """The loop's grad_clip_norm clips each client by its own global norm (a norm over the stack would
    differ); SCAFFOLD with plain SGD uses option II (no step-to-step scratch)."""
    kw = {"grad_clip_norm": 0.5, "client_kw": {"momentum": 0.0}}
    for strategy in ("FedAvg", "Scaffold"):
        seq = _fit(tmp_path, strategy, 1, **kw)
        vec = _fit(tmp_path, strategy, 4, **kw)
        assert _vectorised(vec[0])
        _assert_same(seq, vec)


def test_fixed_local_steps_and_adam(tmp_path):
    kw = {"local_steps": 3, "lr": 0.01, "client_kw": {"optimizer": "adam"}}
    seq, vec = _fit(tmp_path, "FedProx", 1, **kw), _fit(tmp_path, "FedProx", 4, **kw)
    assert _vectorised(vec[0])
    _assert_same(seq, vec)


# ------------------------------------------------------------------------------------ fallback
class BatchNormNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Flatten(), nn.Linear(64, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 10)
        )

    def forward(self, x):
        return self.body(x)


class LoggingClient(ClientModule):
    def training_step(self, batch, batch_idx):
        out = super().training_step(batch, batch_idx)
        self.log("extra", 1.0)
        return out


class Momentum(FedAvg):
    """A FedAvg subclass: inherits FedAvg's hooks but not its declaration."""


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("batchnorm", "BatchNorm1d keeps running statistics"),
        ("client", "LoggingClient is not stackable"),
        ("strategy", "Momentum does not declare vectorizable local terms"),
        ("dropout", "dropout's random draws"),
        ("plugin", "StrategyWrapper does not declare vectorizable local terms"),
        ("fedcog", "FedCOG generates each client's inputs"),
        ("personal_atoms", "PersonalAtoms trains each client's local atoms"),
        ("fast_slow", "model.strategy.cache=false vectorises"),
        ("plugin_of_unvectorised", "Momentum does not declare"),
    ],
)
def test_unsupported_runs_fall_back_with_one_notice(tmp_path, caplog, case, reason):
    def build(vectorize: int):
        strategy = {
            "strategy": lambda: Momentum(),
            "plugin": lambda: StrategyWrapper(FedAvg()),
            "fedcog": lambda: FedCOG(FedAvg(), num_generated=8, gen_steps=2),
            "personal_atoms": lambda: PersonalAtoms(FedAvg()),
            "fast_slow": lambda: FastSlow(FedAvg(), period=2),
            "plugin_of_unvectorised": lambda: Median(Momentum()),
        }.get(case, FedAvg)()
        module = make_module(strategy, runtime={"vectorize": vectorize})
        torch.manual_seed(0)
        if case in ("personal_atoms", "fast_slow"):
            module.client.net = _net("decomposed")
        elif case == "batchnorm":
            module.client.net = BatchNormNet()
        elif case == "dropout":
            module.client.net = nn.Sequential(
                nn.Flatten(), nn.Linear(64, 16), nn.Dropout(0.2), nn.Linear(16, 10)
            )
        elif case == "client":
            module.client = LoggingClient(_net("cnn"), lr=0.1, momentum=0.0)
        make_trainer(tmp_path / str(vectorize), rounds=2).fit(module, datamodule=make_data())
        return module

    seq = build(1)
    with caplog.at_level(logging.WARNING, logger="fl_lightning"):
        vec = build(4)
    notices = [r.getMessage() for r in caplog.records if "model.runtime.vectorize=4" in r.getMessage()]
    assert len(notices) == 1 and reason in notices[0] and "\n" not in notices[0]
    assert vec.engine.executor.counts["vectorised"] == 0
    wa, wb = global_weights(seq), global_weights(vec)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_failing_client_is_excluded_as_in_the_sequential_round(tmp_path):
    class FailOn(FedAvg):
        vectorizable = True

        def on_client_start(self, module, ctx):
            if ctx.client_id == 2 and ctx.round == 1:
                raise RuntimeError("deliberate")
            super().on_client_start(module, ctx)

    runs = []
    for vectorize in (1, 4):
        module = make_module(FailOn(), runtime={"vectorize": vectorize})
        make_trainer(tmp_path / str(vectorize), rounds=2).fit(module, datamodule=make_data())
        runs.append(module)
    assert [r.failed for r in runs[1].history] == [0, 1] and _vectorised(runs[1])
    wa, wb = global_weights(runs[0]), global_weights(runs[1])
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=ATOL)


# ------------------------------------------------------------------------------------ resume
def test_resume_mid_run_with_vectorised_clients(tmp_path):
    from fl_lightning.lightning.checkpoint import AtomicCheckpointIO, LastRoundCheckpoint

    def fit(path, module, rounds, ckpt_path=None):
        trainer = make_trainer(
            path,
            rounds=rounds,
            enable_checkpointing=True,
            callbacks=[LastRoundCheckpoint(dirpath=path / "ckpts")],
            plugins=[AtomicCheckpointIO()],
        )
        trainer.fit(module, datamodule=make_data(), ckpt_path=ckpt_path)

    def module(vectorize):
        return make_module(get_strategy("Scaffold"), runtime={"vectorize": vectorize}, participation=0.75)

    full_seq = module(1)
    fit(tmp_path / "seq", full_seq, 4)
    fit(tmp_path / "a", module(4), 2)
    resumed = module(4)
    fit(tmp_path / "b", resumed, 4, ckpt_path=tmp_path / "a" / "ckpts" / "last.ckpt")
    assert _vectorised(resumed)
    wa, wb = global_weights(full_seq), global_weights(resumed)
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=ATOL)


# ------------------------------------------------------------------------------------ options
@pytest.mark.parametrize("bad", [0, -2, 2.5, True])
def test_vectorize_must_be_a_positive_integer(bad):
    with pytest.raises(ConfigError, match=r"model.runtime.vectorize=.* must be an integer >= 1 .* or auto"):
        make_module(runtime={"vectorize": bad})


@pytest.mark.parametrize("bad", [0, -1.0, float("nan")])
def test_vectorize_memory_budget_must_be_positive(bad):
    with pytest.raises(ConfigError, match="model.runtime.vectorize_memory_gb"):
        make_module(runtime={"vectorize": 4, "vectorize_memory_gb": bad})


def test_memory_budget_bounds_the_group_size(tmp_path):
    data = make_data()
    data.setup()
    worker = ClientModule(_net("cnn"))
    size, note = group_size(8, worker, data.clients[0], 32, None)  # half the host's available memory
    assert size == 8 and "MiB per client" in note
    size, note = group_size(8, worker, data.clients[0], 32, 1e-4)  # ~100 KiB: fewer than 8 fit
    assert 1 <= size < 8 and "MiB per client" in note
    assert group_size(8, worker, data.clients[0], 32, 100.0)[0] == 8
    module = make_module(runtime={"vectorize": 4, "vectorize_memory_gb": 1e-6})  # 1 KiB: one client per group
    make_trainer(tmp_path, rounds=1).fit(module, datamodule=make_data())
    assert module.engine.executor.max_group == 1 and module.engine.executor.counts["vectorised"] == 0


# ------------------------------------------------------------------------------------ pieces
@pytest.mark.parametrize("net", ["cnn", "mlp"])
def test_stacked_worker_outputs_each_clients_own_network(net):
    """Under vmap (SmallCNN) and as a batched linear chain (MLP, on the CPU)."""
    worker = ClientModule(_net(net))
    stack = StackedWorker(worker, 3)
    assert stack.uses_chain(torch.device("cpu")) == (net == "mlp")
    assert [n for n, _ in stack.named_parameters()] == [n for n, _ in worker.named_parameters()]
    with torch.no_grad():
        for p in stack.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    x = torch.randn(3, 5, 1, 8, 8)
    out = stack(x)
    for k in range(3):
        own = {n: p[k] for n, p in stack.named_parameters()}
        ref = torch.func.functional_call(worker, own, (x[k],))
        torch.testing.assert_close(out[k], ref)


def test_messages_share_common_tensors_and_states_fill_missing_entries_with_zeros():
    w = torch.ones(2)
    shared = stack_payloads([{"weights": {"w": w}}, {"weights": {"w": w.detach()}}])
    assert shared["weights"]["w"].shape == (2,)  # same storage: broadcast, not stacked
    own = stack_payloads([{"g": {"w": w}}, {"g": {"w": w + 1}}])
    assert own["g"]["w"].tolist() == [[1, 1], [2, 2]]
    states = stack_states([{"a": torch.ones(2)}, {}], torch.device("cpu"))
    assert states["a"].tolist() == [[1, 1], [0, 0]]


# ------------------------------------------------------------------------------------ GPU lane
@pytest.mark.cuda
@pytest.mark.parametrize("strategy", ["FedAvg", "Scaffold", "FedSMOO"])
def test_vectorised_clients_equal_sequential_clients_on_cuda(tmp_path, strategy):
    def fit(vectorize):
        module = make_module(
            get_strategy(strategy, **STRATEGIES[strategy]),
            client_kw={"momentum": 0.9, "weight_decay": 1e-3},
            local_steps=None,
            local_epochs=1,
            runtime={"vectorize": vectorize},
        )
        make_trainer(tmp_path / str(vectorize), rounds=3, accelerator="gpu").fit(
            module, datamodule=make_data()
        )
        return module

    seq, vec = fit(1), fit(4)
    assert _vectorised(vec) and vec.history[-1].peak_memory_gb > 0
    wa, wb = global_weights(seq), global_weights(vec)
    for k in wa:
        torch.testing.assert_close(wa[k].cpu(), wb[k].cpu(), rtol=0, atol=1e-4)


@pytest.mark.cuda
@pytest.mark.parametrize(
    ("client_kw", "hold_back"), [({}, False), ({"momentum": 0.0}, False), ({"momentum": 0.0}, True)]
)
def test_the_linear_chain_on_cuda_equals_sequential_clients(tmp_path, monkeypatch, client_kw, hold_back):
    """The CPU's batched linear chain (returning gradients with momentum; the SGD step fused; held back as
    low-rank updates) runs on CUDA too, where vmap is the default."""
    monkeypatch.setattr(batched, "CHAIN_DEVICES", ("cpu", "cuda"))
    monkeypatch.setattr(batched, "DEFER_BYTES", 0 if hold_back else 2**40)

    def fit(vectorize):
        module = make_module(
            FedAvg(),
            client_kw={"momentum": 0.9, "weight_decay": 0.0, **client_kw},
            local_steps=None,
            local_epochs=1,
            runtime={"vectorize": vectorize},
        )
        torch.manual_seed(0)
        module.client.net = _net("mlp2")
        make_trainer(tmp_path / str(vectorize), rounds=2, accelerator="gpu").fit(
            module, datamodule=make_data()
        )
        return module

    seq, vec = fit(1), fit(4)
    (stack,) = vec.engine.executor.stacks.values()
    assert _vectorised(vec) and stack.chained
    assert vec.history[-1].vectorize["vectorize/fused_sgd"] == float(client_kw.get("momentum", 0.9) == 0)
    wa, wb = global_weights(seq), global_weights(vec)
    for k in wa:
        torch.testing.assert_close(wa[k].cpu(), wb[k].cpu(), rtol=0, atol=1e-4)


@pytest.mark.cuda
@pytest.mark.parametrize("strategy", ["FedAvg", "FedSAM"])
def test_compiled_vectorised_clients_equal_sequential_eager_clients_on_cuda(tmp_path, strategy):
    """model.runtime.compile=true on CUDA: the vmapped forward compiled with CUDA graphs
    ("reduce-overhead")."""

    def fit(vectorize, compile):
        module = make_module(
            get_strategy(strategy, **STRATEGIES[strategy]),
            client_kw={"momentum": 0.9, "weight_decay": 1e-3},
            local_steps=None,
            local_epochs=1,
            runtime={"vectorize": vectorize, "compile": compile},
        )
        torch.manual_seed(0)
        module.client.net = _net("mlp")
        make_trainer(tmp_path / f"{vectorize}{compile}", rounds=2, accelerator="gpu").fit(
            module, datamodule=make_data()
        )
        return module

    seq, vec = fit(1, False), fit(4, True)
    (stack,) = vec.engine.executor.stacks.values()
    assert _vectorised(vec) and stack.compile_mode == "reduce-overhead"
    wa, wb = global_weights(seq), global_weights(vec)
    for k in wa:
        torch.testing.assert_close(wa[k].cpu(), wb[k].cpu(), rtol=0, atol=1e-4)


def test_a_group_that_cannot_be_stacked_for_a_declared_reason_is_retrained_one_client_at_a_time(
    tmp_path, caplog
):
    """A hook may declare at run time that a group cannot be stacked (UnvectorizableError): the group
    trains one client at a time, with one notice naming the reason, and gives the sequential result."""

    class Unstackable(FedAvg):
        vectorizable = True  # but its hook finds out it needs one client

        def on_client_start(self, module, ctx):
            if ctx.stacked:
                raise vectorized.UnvectorizableError("needs one client")
            super().on_client_start(module, ctx)

    runs = []
    with caplog.at_level(logging.WARNING, logger="fl_lightning"):
        for vectorize in (1, 4):
            module = make_module(Unstackable(), runtime={"vectorize": vectorize})
            make_trainer(tmp_path / str(vectorize), rounds=2).fit(module, datamodule=make_data())
            runs.append(module)
    notices = [r.getMessage() for r in caplog.records if "trained one at a time" in r.getMessage()]
    assert len(notices) == 1 and notices[0].endswith("trained one at a time: needs one client")
    assert [r.failed for r in runs[1].history] == [0, 0]
    assert [r.vectorised_clients for r in runs[1].history] == [0, 0]
    wa, wb = global_weights(runs[0]), global_weights(runs[1])
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_any_other_error_of_a_stacked_group_propagates(tmp_path):
    """An error that is not a declared reason is not hidden by a fallback (nor counted as client failures)."""

    class Broken(FedAvg):
        vectorizable = True

        def on_client_start(self, module, ctx):
            if ctx.stacked:
                raise RuntimeError("a bug in the stacked hook")
            super().on_client_start(module, ctx)

    module = make_module(Broken(), runtime={"vectorize": 4})
    with pytest.raises(RuntimeError, match="a bug in the stacked hook"):
        make_trainer(tmp_path, rounds=1).fit(module, datamodule=make_data())
    assert module.history == []
