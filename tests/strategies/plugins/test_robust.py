"""Robust aggregation plug-ins and the attack simulation: reductions by hand, composition, end to end."""

import pytest
import torch
from torch import nn

from fl_lightning.api import SimulatedAttack
from fl_lightning.api.types import ClientContext
from fl_lightning.data import IID
from fl_lightning.errors import ConfigError
from fl_lightning.functional.robust import malicious_clients
from fl_lightning.strategies import (
    Attack,
    FedAvg,
    Krum,
    Median,
    NormBounded,
    Scaffold,
    TrimmedMean,
    get_strategy,
)

from conftest import global_weights, make_data, make_module


def _round(strategy, uploads, num_samples=None, extra=None, send=True):
    """One round of uploads ``w^t + Delta_k`` on ``nn.Linear(2, 1)`` with ``w^t`` all ones.

    ``uploads[k] = (a, b)``: ``Delta_k`` is ``[[a, 0]]`` on the weight and ``[b]`` on the bias.
    """
    model = nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.fill_(1.0)
        model.bias.fill_(1.0)
    strategy.setup(model, len(uploads))
    agg = strategy.aggregator()
    if send:  # a process that trained no client this round sends no message
        strategy.message(model, 0, 0)
    for k, (w, b) in enumerate(uploads):
        payload = {"weights": {"weight": torch.tensor([[w, 0.0]]) + 1, "bias": torch.tensor([b]) + 1}}
        if extra is not None:
            payload["controls"] = {"c": torch.tensor([extra[k]])}
        agg.add(payload, (num_samples or [1] * len(uploads))[k], k)
    return agg.means()


UPDATES = [(1.0, 0.0), (2.0, 0.0), (3.0, 0.0), (4.0, 0.0), (100.0, -50.0)]


def test_median_trimmed_mean_krum_on_hand_values():
    for strategy, expected in [
        (Median(FedAvg()), (3.0, 0.0)),
        (TrimmedMean(FedAvg(), beta=0.2), (3.0, 0.0)),
        # K - f - 2 = 2 nearest: scores 1+4, 1+1, 1+1, 1+4, huge -> Krum picks client 1 (tie: lower id)
        (Krum(FedAvg(), f=1), (2.0, 0.0)),
        (Krum(FedAvg(), f=1, m=3), (2.0, 0.0)),  # clients 1, 2, 0: (2 + 3 + 1) / 3
    ]:
        assert strategy.aggregator().buffered
        means = _round(strategy, UPDATES)
        w, b = expected
        assert torch.allclose(means["weights"]["weight"], torch.tensor([[w, 0.0]]) + 1), strategy
        assert torch.allclose(means["weights"]["bias"], torch.tensor([b]) + 1), strategy


def test_without_a_message_this_round_w_t_is_the_global_model_from_setup():
    means = _round(Krum(FedAvg(), f=1), UPDATES, send=False)
    assert torch.allclose(means["weights"]["weight"], torch.tensor([[3.0, 1.0]]))


def test_norm_bounded_clips_updates_server_side_and_keeps_sample_weights():
    # updates (3, 4) -> norm 5 clipped to (0.6, 0.8); (0.3, 0.4) kept; weights 1 and 3
    means = _round(NormBounded(FedAvg(), max_norm=1.0), [(3.0, 4.0), (0.3, 0.4)], num_samples=[1, 3])
    assert torch.allclose(means["weights"]["weight"], torch.tensor([[(0.6 + 0.9) / 4, 0.0]]) + 1)
    assert torch.allclose(means["weights"]["bias"], torch.tensor([(0.8 + 1.2) / 4]) + 1)


def test_other_groups_keep_the_weighted_mean():
    """Control variates (any group but "weights") are the base's weighted mean, outliers included."""
    strategy = Median(Scaffold())
    means = _round(strategy, UPDATES, num_samples=[1, 1, 1, 1, 4], extra=[0.0, 0.0, 0.0, 0.0, 8.0])
    expected = 32.0 / 8 if strategy.aggregator().weight("controls", {}, 2) == 2.0 else 8.0 / 5
    assert torch.allclose(means["controls"]["c"], torch.tensor([expected]))
    assert torch.allclose(means["weights"]["weight"], torch.tensor([[3.0, 0.0]]) + 1)


def test_attack_declares_the_flip_or_scale_of_the_clients_chosen_by_the_run_seed_only():
    """The plug-in holds one SimulatedAttack, which the engine applies; its process_upload is the base's."""
    for seed in (0, 1):
        bad = malicious_clients(10, 0.4, seed)
        assert len(bad) == 4 and bad == malicious_clients(10, 0.4, seed)
        for kind, factor in [("sign_flip", -3.0), ("scale", 3.0)]:
            plugin = Attack(FedAvg(), fraction=0.4, kind=kind, scale=3.0)
            plugin.setup(nn.Linear(1, 1), 10)
            assert plugin.attack == SimulatedAttack(kind, 0.4, 3.0) and plugin.malicious(seed) == bad
            assert (plugin.fraction, plugin.kind, plugin.scale) == (0.4, kind, 3.0)
            sent = {"weights": {"w": torch.tensor([1.0, 2.0])}}
            upload = {"weights": {"w": torch.tensor([2.0, 0.0])}}
            out = plugin.attack.apply(upload, sent)["weights"]["w"]
            assert torch.allclose(out, torch.tensor([1.0, 2.0]) + factor * torch.tensor([1.0, -2.0]))
            ctx = ClientContext(min(bad), 0, sent, {}, 10, 1, 0.1, seed=seed)
            assert plugin.process_upload(upload, ctx) is upload  # the engine applies it, in one place
    assert malicious_clients(10, 0.4, 0) != malicious_clients(10, 0.4, 1)


def test_bad_options_are_one_line_config_errors():
    for make, field in [
        (lambda: TrimmedMean(beta=0.5), "model.strategy.beta"),
        (lambda: Krum(f=-1), "model.strategy.f"),
        (lambda: Krum(m=0), "model.strategy.m"),
        (lambda: NormBounded(max_norm=0.0), "model.strategy.max_norm"),
        (lambda: Attack(fraction=1.5), "model.strategy.fraction"),
        (lambda: Attack(kind="noise"), "model.strategy.kind"),
        (lambda: Attack(scale=float("nan")), "model.strategy.scale"),
    ]:
        with pytest.raises(ConfigError, match=field) as err:
            make()
        assert "\n" not in str(err.value)


def test_registered_and_composable_by_name():
    strategy = get_strategy("median", base=Attack(FedAvg(), fraction=0.4))
    assert isinstance(strategy, Median) and isinstance(strategy.base, Attack)
    assert strategy.aggregator().reduce == strategy.robust_aggregate


def _distance(a, b):
    return sum((a[k] - b[k]).float().square().sum() for k in a).sqrt().item()


def test_robust_aggregators_resist_sign_flip_attackers_end_to_end(fit):
    """40% of clients send -10x their update: FedAvg moves far from the clean run, Median and Krum do not."""

    def run(strategy):
        module = make_module(strategy, local_steps=5)
        fit(module, make_data(num_clients=5, partition=IID()), rounds=3)
        return global_weights(module)

    clean = run(FedAvg())
    attack = {"fraction": 0.4, "kind": "sign_flip", "scale": 10.0}
    fedavg = _distance(run(Attack(FedAvg(), **attack)), clean)
    median = _distance(run(Median(Attack(FedAvg(), **attack))), clean)
    krum = _distance(run(Krum(Attack(FedAvg(), **attack), f=2)), clean)
    assert median < fedavg / 3 and krum < fedavg / 3, (fedavg, median, krum)
