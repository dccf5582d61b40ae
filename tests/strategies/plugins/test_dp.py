"""The DP plug-in: clipping bound, noise scale and seeding, accounting, adaptive clipping, budget, errors."""

import json
import logging
import math
import sys
from pathlib import Path

import pytest
import torch
from opacus.accountants import PRVAccountant, RDPAccountant
from torch import nn

from fl_lightning.api.types import ClientContext, RoundInfo
from fl_lightning.cli import main
from fl_lightning.errors import ConfigError, RunError
from fl_lightning.functional.privacy import global_norm
from fl_lightning.lightning.checkpoint import LastRoundCheckpoint
from fl_lightning.strategies import DP, FedAvg, Median, Scaffold, get_strategy

from conftest import FORK, global_weights, make_data, make_module, make_trainer, run_folder
from programs import run_program

CONFIG = Path(__file__).resolve().parents[3] / "configs" / "dp" / "dp_fedavg_digits.yaml"
D_IN, D_OUT = 50, 20  # nn.Linear(50, 20): 1020 coordinates


def _model(value: float = 0.0) -> nn.Linear:
    model = nn.Linear(D_IN, D_OUT)
    with torch.no_grad():
        model.weight.fill_(value)
        model.bias.fill_(value)
    return model


def _round(strategy, model, deltas, round=0, seed=0, num_clients=None, sampled=None):
    """One round: ``select_clients``, every client uploads ``w^t + deltas[k]``, aggregate, process.

    ``deltas[k]`` is a float (the update is that value on every coordinate) or a ``(weight, bias)``
    pair of tensors. Returns ``(means, uploads after process_upload)``.
    """
    k = len(deltas)
    n = sampled if sampled is not None else k
    num_clients = num_clients or max(n, 1)
    strategy.select_clients(num_clients, n, round, seed)
    agg = strategy.aggregator()
    uploads = []
    for cid, delta in enumerate(deltas):
        message = strategy.message(model, cid, round)
        dw, db = (
            (torch.full_like(model.weight, delta), torch.full_like(model.bias, delta))
            if isinstance(delta, float)
            else delta
        )
        upload = {"weights": {"weight": model.weight.detach() + dw, "bias": model.bias.detach() + db}}
        ctx = ClientContext(cid, round, message, {}, 10, 1, 0.1)
        upload = strategy.process_upload(upload, ctx)
        uploads.append(upload)
        agg.add(upload, 10 + cid, cid)
    info = RoundInfo(round, list(range(n)), list(range(k)), num_clients, agg.weight_totals)
    return strategy.process_aggregate(agg.means(), info), uploads


def _delta(payload, model):
    return global_norm(
        [
            payload["weights"]["weight"] - model.weight.detach(),
            payload["weights"]["bias"] - model.bias.detach(),
        ]
    ).item()


# ---------------------------------------------------------------------------------- clipping
def test_every_clients_contribution_is_clipped_to_the_bound():
    gen = torch.Generator().manual_seed(0)
    model = _model(0.5)
    strategy = DP(FedAvg(), noise_multiplier=0.0, clip_norm=0.8)
    strategy.setup(model, 8)
    deltas = [
        (s * torch.randn(D_OUT, D_IN, generator=gen), s * torch.randn(D_OUT, generator=gen))
        for s in (1e-4, 1e-3, 0.01, 0.02, 0.1, 1.0, 10.0, 100.0)
    ]
    means, uploads = _round(strategy, model, deltas)
    norms = [_delta(u, model) for u in uploads]
    assert all(nrm <= 0.8 * (1 + 1e-5) for nrm in norms)
    assert sum(nrm == pytest.approx(0.8, rel=1e-5) for nrm in norms) == 4  # the four large ones were clipped
    small = global_norm(list(deltas[0])).item()
    assert norms[0] == pytest.approx(small, rel=1e-5)  # a small update is untouched
    # the noiseless aggregate is the uniform mean of the clipped updates (sample counts ignored)
    expected = sum(u["weights"]["weight"] for u in uploads) / 8
    torch.testing.assert_close(means["weights"]["weight"], expected)


def test_fixed_denominator_when_clients_fail():
    model = _model(0.0)
    strategy = DP(FedAvg(), noise_multiplier=0.0, clip_norm=100.0)
    strategy.setup(model, 10)
    means, _ = _round(strategy, model, [1.0, 3.0], sampled=4)  # 4 sampled, 2 uploaded
    torch.testing.assert_close(means["weights"]["bias"], torch.full((D_OUT,), (1.0 + 3.0) / 4))


# ---------------------------------------------------------------------------------- noise
@pytest.mark.parametrize(("z", "clip", "n"), [(1.0, 1.0, 5), (2.5, 0.3, 20)])
def test_noise_scale_matches_the_configuration(z, clip, n):
    model = nn.Linear(1000, 100)  # 100_100 coordinates
    strategy = DP(FedAvg(), noise_multiplier=z, clip_norm=clip)
    strategy.setup(model, 100)
    means, _ = _round(strategy, model, [0.0] * n, num_clients=100)
    noise = torch.cat([(means["weights"][k] - v.detach()).reshape(-1) for k, v in model.state_dict().items()])
    assert noise.std().item() == pytest.approx(z * clip / n, rel=0.02)
    assert abs(noise.mean().item()) < 0.05 * z * clip / n
    assert strategy.round_metrics()["privacy/noise_std"] == pytest.approx(z * clip / n)


def test_noise_is_seeded_by_the_run_seed_and_the_round():
    def noise(seed, round):
        model = _model(0.0)
        strategy = DP(FedAvg(), noise_multiplier=1.0)
        strategy.setup(model, 10)
        return _round(strategy, model, [0.0, 0.0], round=round, seed=seed)[0]["weights"]["weight"]

    a = noise(0, 3)
    assert torch.equal(a, noise(0, 3))  # a fresh strategy (another process, a resumed run): the same noise
    assert not torch.equal(a, noise(0, 4)) and not torch.equal(a, noise(1, 3))


# ---------------------------------------------------------------------------------- accounting
@pytest.mark.parametrize(("name", "cls"), [("rdp", RDPAccountant), ("prv", PRVAccountant)])
def test_epsilon_equals_opacus_for_the_same_parameters(name, cls):
    model = _model(0.0)
    strategy = DP(FedAvg(), noise_multiplier=1.3, accountant=name, delta=1e-4)
    strategy.setup(model, 50)
    reference = cls()
    for r in range(6):
        _round(strategy, model, [0.1] * 5, round=r, num_clients=50)
        reference.step(noise_multiplier=1.3, sample_rate=5 / 50)
        metrics = strategy.round_metrics()
        assert metrics["privacy/epsilon"] == pytest.approx(reference.get_epsilon(delta=1e-4), rel=1e-9)
        assert metrics["privacy/delta"] == 1e-4
    assert strategy.history == [(1.3, 0.1, 6)]


def test_default_delta_is_one_over_m_to_the_1_1():
    strategy = DP(FedAvg())
    strategy.setup(_model(), 200)
    assert strategy.delta_value == pytest.approx(200**-1.1)


def test_accountant_state_is_checkpointed():
    model = _model(0.0)
    strategy = DP(FedAvg(), noise_multiplier=1.0, clipping="adaptive", clipped_count_stddev=1.0)
    strategy.setup(model, 20)
    for r in range(3):
        _round(strategy, model, [0.1] * 4, round=r, num_clients=20)
    state = strategy.state_dict()
    restored = DP(FedAvg(), noise_multiplier=1.0, clipping="adaptive", clipped_count_stddev=1.0)
    restored.setup(_model(), 20)
    restored.load_state_dict(state)
    assert restored.history == strategy.history == [(1.0, 0.2, 3)]
    assert restored.current_clip == strategy.current_clip != 1.0
    assert restored.epsilon() == strategy.epsilon() > 0


# ---------------------------------------------------------------------------------- adaptive
def test_adaptive_clipping_update_by_hand():
    model = _model(0.0)
    strategy = DP(FedAvg(), noise_multiplier=0.0, clip_norm=2.0, clipping="adaptive", target_quantile=0.5)
    strategy.setup(model, 10)
    scale = math.sqrt(D_IN * D_OUT + D_OUT)  # a constant update c has norm c * scale
    means, uploads = _round(strategy, model, [(i + 1) / scale for i in range(10)])  # norms 1..10
    assert [float(u["dp"]["unclipped"]) for u in uploads] == [1.0, 1.0] + [0.0] * 8
    assert strategy.round_metrics()["privacy/unclipped_fraction"] == pytest.approx(0.2)
    assert strategy.round_metrics()["privacy/clip_norm"] == 2.0  # the C this round used
    assert strategy.current_clip == pytest.approx(2.0 * math.exp(-0.2 * (0.2 - 0.5)))
    assert "dp" not in means  # the count does not reach the base strategy
    for r in range(1, 150):
        _round(strategy, model, [(i + 1) / scale for i in range(10)], round=r)
    assert 4.0 < strategy.current_clip < 6.5  # towards the median norm


def test_adaptive_clipping_splits_the_noise_multiplier():
    model = nn.Linear(1000, 100)
    strategy = DP(
        FedAvg(), noise_multiplier=1.0, clip_norm=1.0, clipping="adaptive", clipped_count_stddev=1.0
    )
    strategy.setup(model, 100)
    means, _ = _round(strategy, model, [0.0] * 10, num_clients=100)
    z_delta = (1.0 - 0.25) ** -0.5
    noise = torch.cat([(means["weights"][k] - v.detach()).reshape(-1) for k, v in model.state_dict().items()])
    assert noise.std().item() == pytest.approx(z_delta / 10, rel=0.02)
    assert strategy.history == [(1.0, 0.1, 1)]  # the accountant sees the total z


def test_adaptive_noise_uses_the_clip_norm_that_clipped_the_round():
    # Andrew et al. (2021), Alg. 1: sigma_Delta = z_Delta C_t, the C_t the clients clipped with; C_{t+1}
    # (here about C_t exp(-2 * 0.5)) only reaches the next round's message
    model = nn.Linear(1000, 100)
    strategy = DP(
        FedAvg(),
        noise_multiplier=1.0,
        clip_norm=0.5,
        clipping="adaptive",
        clip_lr=2.0,
        clipped_count_stddev=1.0,
    )
    strategy.setup(model, 100)
    means, uploads = _round(strategy, model, [0.0] * 10, num_clients=100)  # all unclipped: C shrinks
    assert all(float(u["dp"]["unclipped"]) == 1.0 for u in uploads)
    fraction = strategy.round_metrics()["privacy/unclipped_fraction"]
    assert strategy.current_clip == pytest.approx(0.5 * math.exp(-2.0 * (fraction - 0.5)))
    assert strategy.current_clip < 0.5 * 0.6
    noise = torch.cat([(means["weights"][k] - v.detach()).reshape(-1) for k, v in model.state_dict().items()])
    z_delta = (1.0 - 0.25) ** -0.5
    assert noise.std().item() == pytest.approx(z_delta * 0.5 / 10, rel=0.02)
    assert strategy.round_metrics()["privacy/noise_std"] == pytest.approx(z_delta * 0.5 / 10)
    next_clip = float(strategy.message(model, 0, 1)["dp"]["clip_norm"])
    assert next_clip == pytest.approx(strategy.current_clip, rel=1e-6)


def test_adaptive_count_is_centred_so_failed_clients_are_neutral():
    # 4 sampled, 2 reported, both unclipped: b~ = 1/2 + (2 - 2/2) / 4 = 0.75 (not 2/4, which would
    # count the failed clients as clipped and grow C; and 1/2 sensitivity, Thm. 1's 2 sigma_b)
    model = _model(0.0)
    strategy = DP(FedAvg(), noise_multiplier=0.0, clip_norm=100.0, clipping="adaptive")
    strategy.setup(model, 10)
    _round(strategy, model, [1.0, 3.0], sampled=4)
    assert strategy.round_metrics()["privacy/unclipped_fraction"] == pytest.approx(0.75)
    assert strategy.current_clip == pytest.approx(100.0 * math.exp(-0.2 * 0.25))


@pytest.mark.parametrize("quantile", [0.2, 0.8])
def test_adaptive_clipping_tracks_other_quantiles(quantile):
    model = _model(0.0)
    strategy = DP(
        FedAvg(), noise_multiplier=0.0, clip_norm=5.0, clipping="adaptive", target_quantile=quantile
    )
    strategy.setup(model, 10)
    scale = math.sqrt(D_IN * D_OUT + D_OUT)
    for r in range(150):
        _round(strategy, model, [(i + 1) / scale for i in range(10)], round=r)  # norms 1..10
    low, high = 10 * quantile, 10 * quantile + 1  # between the 2nd and 3rd norm for 0.2, 8th and 9th for 0.8
    assert low * 0.85 < strategy.current_clip < high * 1.15


def test_adaptive_default_count_noise_too_small_is_one_line():
    model = _model()
    strategy = DP(FedAvg(), noise_multiplier=1.0, clipping="adaptive")  # sigma_b = 10 / 20 = z / 2
    strategy.setup(model, 20)
    with pytest.raises(RunError, match="raise model.strategy.clipped_count_stddev") as info:
        _round(strategy, model, [0.1] * 10, num_clients=20)
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------------------------- budget
def test_stop_reason_before_a_round_that_would_exceed_the_budget():
    model = _model()
    strategy = DP(FedAvg(), noise_multiplier=1.0, target_epsilon=1.5, delta=1e-3)
    strategy.setup(model, 50)
    rounds = 0
    while strategy.select_clients(50, 5, rounds, 0) and not strategy.stop_reason(rounds):  # as the loop does
        _round(strategy, model, [0.1] * 5, round=rounds, num_clients=50)
        rounds += 1
        assert strategy.epsilon() <= 1.5
    assert rounds > 1 and strategy.epsilon(extra_rounds=1) > 1.5
    reason = strategy.stop_reason(rounds)
    assert "model.strategy.target_epsilon=1.5 is spent" in reason and "\n" not in reason


def _fit(tmp_path, module, num_clients, rounds, ckpt_path=None):
    """Fit as the CLI does (``last.ckpt`` after every round) on ``num_clients`` digits clients."""
    trainer = make_trainer(
        tmp_path,
        rounds=rounds,
        enable_checkpointing=True,
        callbacks=[LastRoundCheckpoint(tmp_path / "ckpts")],
    )
    trainer.fit(module, datamodule=make_data(num_clients=num_clients), ckpt_path=ckpt_path)
    return trainer


def test_budget_stop_ends_fit_cleanly_and_a_resume_refuses_to_run(tmp_path, caplog):
    def module():
        strategy = DP(FedAvg(), noise_multiplier=1.0, clip_norm=1.0, target_epsilon=1.5)
        return make_module(strategy, clients_per_round=4)

    first = module()
    with caplog.at_level(logging.WARNING, logger="fl_lightning"):
        trainer = _fit(tmp_path, first, num_clients=20, rounds=50)
    done = trainer.global_step
    assert 1 < done < 10 and len(first.history) == done
    said = f"stopping after {done} rounds: "
    assert any(said in r.message and "privacy budget" in r.message for r in caplog.records)
    eps = first.history[-1].strategy["privacy/epsilon"]
    assert eps <= 1.5 < first.strategy.epsilon(extra_rounds=1)
    ckpt = tmp_path / "ckpts" / "last.ckpt"
    saved = torch.load(ckpt, weights_only=True)
    assert saved["global_step"] == done and "global/acc" in saved["fl_lightning"]["history"][-1]["metrics"]
    with pytest.raises(RunError, match=f"^round {done} cannot run: the privacy budget") as info:
        _fit(tmp_path, module(), num_clients=20, rounds=60, ckpt_path=ckpt)
    assert "\n" not in str(info.value)
    assert torch.load(ckpt, weights_only=True)["global_step"] == done  # untouched


def test_resume_is_exact_with_adaptive_clipping(tmp_path):
    def module():
        strategy = DP(
            FedAvg(), noise_multiplier=0.5, clip_norm=0.5, clipping="adaptive", clipped_count_stddev=1
        )
        return make_module(strategy, clients_per_round=3)

    full = module()
    _fit(tmp_path / "full", full, num_clients=8, rounds=4)
    _fit(tmp_path, module(), num_clients=8, rounds=2)
    resumed = module()
    _fit(tmp_path, resumed, num_clients=8, rounds=4, ckpt_path=tmp_path / "ckpts" / "last.ckpt")
    a, b = global_weights(full), global_weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.strategy.history == full.strategy.history == [(0.5, 3 / 8, 4)]
    assert resumed.strategy.current_clip == full.strategy.current_clip != 0.5
    assert resumed.history[-1].strategy == full.history[-1].strategy


# ---------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"noise_multiplier": -1.0}, "model.strategy.noise_multiplier=-1.0 must be >= 0"),
        ({"noise_multiplier": float("nan")}, "model.strategy.noise_multiplier=nan must be a finite number"),
        ({"clip_norm": 0.0}, "model.strategy.clip_norm=0.0 must be > 0"),
        ({"clip_norm": -2.0}, "model.strategy.clip_norm=-2.0 must be > 0"),
        ({"delta": 0.0}, "model.strategy.delta=0.0 must be in (0, 1)"),
        ({"delta": 1.0}, "model.strategy.delta=1.0 must be in (0, 1)"),
        ({"delta": 1.5}, "model.strategy.delta=1.5 must be in (0, 1)"),
        ({"accountant": "gdp"}, "model.strategy.accountant='gdp' must be one of 'rdp', 'prv'"),
        ({"clipping": "auto"}, "model.strategy.clipping='auto' must be 'fixed' or 'adaptive'"),
        ({"target_quantile": 1.5}, "model.strategy.target_quantile=1.5 must be in [0, 1]"),
        ({"clip_lr": 0.0}, "model.strategy.clip_lr=0.0 must be > 0"),
        ({"target_epsilon": 0.0}, "model.strategy.target_epsilon=0.0 must be > 0"),
        (
            {"target_epsilon": 1.0, "noise_multiplier": 0.0},
            "model.strategy.target_epsilon needs model.strategy",
        ),
        (
            {"clipped_count_stddev": 0.4, "clipping": "adaptive"},
            "model.strategy.clipped_count_stddev=0.4 must be > 0.5",
        ),
        ({"clipped_count_stddev": -1.0}, "model.strategy.clipped_count_stddev=-1.0 must be >= 0"),
    ],
)
def test_bad_values_are_one_line_config_errors(kwargs, message):
    with pytest.raises(ConfigError) as info:
        DP(FedAvg(), **kwargs)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_without_opacus_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "opacus", None)
    with pytest.raises(ConfigError, match=r"pip install fl_lightning\[dp\]"):
        DP(FedAvg())
    DP(FedAvg(), noise_multiplier=0.0)  # clipping only: no accountant needed


def test_robust_base_is_refused():
    with pytest.raises(ConfigError, match="DP cannot wrap Median"):
        DP(Median(FedAvg())).setup(_model(), 4)


def test_other_upload_groups_are_named_in_a_warning(caplog):
    model = _model()
    strategy = DP(Scaffold(), noise_multiplier=0.0)
    strategy.setup(model, 2)
    means = {"weights": {k: v.detach() for k, v in model.state_dict().items()}, "controls": {}}
    info = RoundInfo(0, [0, 1], [0, 1], 2, {"weights": 2.0, "controls": 2.0})
    with caplog.at_level(logging.WARNING):
        strategy.process_aggregate(means, info)
    assert "controls of Scaffold is averaged without clipping or noise" in caplog.text


# ---------------------------------------------------------------------------------- end to end
@pytest.mark.parametrize("base", ["FedProx", "Scaffold", "FedAdam", "FedPer", "Local"])
def test_dp_wraps_mean_aggregating_strategies(base, fit):
    module = make_module(DP(get_strategy(base), noise_multiplier=0.5, clip_norm=0.5), clients_per_round=2)
    fit(module, rounds=2)
    assert all(torch.isfinite(v).all() for v in module.client.state_dict().values())
    assert [r.failed for r in module.history] == [0, 0]
    if base != "Local":  # Local uploads nothing: nothing released, nothing accounted
        assert module.history[-1].strategy["privacy/epsilon"] > 0


def test_fit_with_dp_writes_epsilon_to_summary_and_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    main(
        [
            "fit",
            f"--config={CONFIG}",
            "--trainer.max_steps=3",
            "--trainer.enable_progress_bar=false",
            "--data.num_clients=40",
            "--model.clients_per_round=8",
            "--model.local_epochs=1",
            "--model.strategy.init_args.clipping=adaptive",
            "--model.strategy.init_args.clipped_count_stddev=1.0",
            f"--trainer.default_root_dir={tmp_path}",
        ]
    )
    version = run_folder(tmp_path)
    summary = json.loads((version / "summary.json").read_text())
    expected = RDPAccountant()
    for _ in range(3):
        expected.step(noise_multiplier=1.0, sample_rate=8 / 40)
    assert summary["privacy/epsilon"] == pytest.approx(expected.get_epsilon(delta=40**-1.1), rel=1e-9)
    assert summary["privacy/delta"] == pytest.approx(40**-1.1)
    events = EventAccumulator(str(version))
    events.Reload()
    epsilons = events.Scalars("privacy/epsilon")
    assert [e.step for e in epsilons] == [1, 2, 3]
    assert epsilons[0].value < epsilons[1].value < epsilons[2].value
    assert epsilons[2].value == pytest.approx(summary["privacy/epsilon"], rel=1e-5)
    assert {"privacy/clip_norm", "privacy/noise_std", "privacy/unclipped_fraction"} <= set(
        events.Tags()["scalars"]
    )


@pytest.mark.slow
def test_two_processes_add_the_same_noise_once(tmp_path):
    """Under DDP the noise is drawn once on the all-reduced aggregate, the same on both processes."""
    args = [
        "fit",
        "--trainer.accelerator=cpu",
        "--trainer.max_steps=3",
        "--trainer.enable_progress_bar=false",
        "--data.num_clients=6",
        "--model.participation=0.5",
        "--model.local_steps=3",
        "--model.eval_clients_every=0",
        "--model.strategy=DP",
        "--model.strategy.noise_multiplier=1.0",
        "--model.strategy.clip_norm=0.5",
        "--model.strategy.clipping=adaptive",
        "--model.strategy.clipped_count_stddev=1.0",
    ]
    runs = {}
    for devices in (1, 2):
        root = tmp_path / str(devices)
        root.mkdir()
        if devices == 1:
            main([*args, f"--trainer.default_root_dir={root}"])
        else:
            cmd = [*args, f"--trainer.default_root_dir={root}", "--trainer.devices=2", FORK]
            proc = run_program(cmd, cwd=root, timeout=300)
            assert proc.returncode == 0, proc.stderr[-3000:]
        ckpt = next((run_folder(root) / "checkpoints").glob("*.ckpt"))
        runs[devices] = torch.load(ckpt, weights_only=True)
    one, two = runs[1], runs[2]
    for k, v in one["state_dict"].items():
        torch.testing.assert_close(v, two["state_dict"][k], rtol=0, atol=1e-5)
    assert one["fl_lightning"]["history"][-1]["strategy"] == pytest.approx(
        two["fl_lightning"]["history"][-1]["strategy"]
    )
