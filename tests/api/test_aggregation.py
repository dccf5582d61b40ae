"""The aggregator a strategy configures (weighting, receive, reduce) and the server-side strategy hooks:
selection, upload/aggregate post-processing."""

import pytest
import torch

from fl_lightning.api.aggregation import Aggregator, weighted_mean
from fl_lightning.api.strategy import StrategyWrapper
from fl_lightning.functional import payload_bytes
from fl_lightning.functional.sampling import sample_clients
from fl_lightning.strategies import DP, FedAvg, Median, Scaffold

from conftest import global_weights, make_engine, make_module

#: The two kinds of aggregator: streaming weighted sums, and every upload kept for a reduction.
KINDS = {"streaming": {}, "buffered": {"reduce": weighted_mean}}


def _uploads():
    """(client_id, upload, num_samples), deliberately not in client order."""
    return [
        (7, {"weights": {"w": torch.tensor([1.0, 2.0])}, "control": {"c": torch.tensor([1.0])}}, 3),
        (2, {"weights": {"w": torch.tensor([5.0, 6.0])}, "control": {"c": torch.tensor([5.0])}}, 1),
        (4, {"weights": {"w": torch.tensor([0.0, -4.0])}, "control": {"c": torch.tensor([0.0])}}, 4),
    ]


@pytest.mark.parametrize("kind", KINDS)
def test_weighted_mean_by_hand(kind):
    agg = Aggregator(weighting={"control": "uniform"}, **KINDS[kind])
    assert agg.buffered == (kind == "buffered")
    for cid, up, n in _uploads():
        agg.add(up, n, cid)
    means = agg.means()
    # samples: (3*[1,2] + 1*[5,6] + 4*[0,-4]) / 8 = [8, -4] / 8
    assert torch.allclose(means["weights"]["w"], torch.tensor([1.0, -0.5]))
    # uniform: (1 + 5 + 0) / 3
    assert means["control"]["c"].item() == pytest.approx(2.0)
    assert agg.weight_totals == {"weights": 8.0, "control": 3.0}


@pytest.mark.parametrize("kind", KINDS)
def test_a_weighting_rule_per_group_with_a_default_and_a_rule_of_the_upload(kind):
    """``"*"`` is the rule of the groups not named; a function weighs an upload by what it carries."""
    rule = lambda upload, n: n / float(upload["control"]["c"] + 1)  # noqa: E731
    agg = Aggregator(weighting={"weights": rule, "*": "uniform"}, **KINDS[kind])
    for cid, up, n in _uploads():
        agg.add(up, n, cid)
    # weights: 3/2, 1/6, 4/1 -> (1.5*[1,2] + [5,6]/6 + 4*[0,-4]) / (1.5 + 1/6 + 4)
    total = 1.5 + 1 / 6 + 4
    expected = 1.5 * torch.tensor([1.0, 2.0]) + torch.tensor([5.0, 6.0]) / 6 + 4 * torch.tensor([0.0, -4.0])
    assert torch.allclose(agg.means()["weights"]["w"], expected / total)
    assert agg.weight_totals == pytest.approx({"weights": total, "control": 3.0})
    with pytest.raises(ValueError, match="weighting of 'control'"):
        Aggregator(weighting={"control": "by size"})


@pytest.mark.parametrize("kind", KINDS)
def test_add_applies_the_receive_transform_before_weighting(kind):
    """What a client sent becomes what is averaged in ``add`` itself, for either kind of aggregator: a
    group the transform adds is averaged, and the weights see the transformed upload."""

    def receive(upload):
        w = upload["weights"]["w"]
        return {"weights": {"w": 2 * w}, "square": {"w": w * w}}

    agg = Aggregator(
        weighting={"square": lambda up, n: float(up["square"]["w"][0])}, receive=receive, **KINDS[kind]
    )
    agg.add({"weights": {"w": torch.tensor([1.0, 3.0])}}, 1, 0)
    agg.add({"weights": {"w": torch.tensor([2.0, 5.0])}}, 3, 1)
    means = agg.means()
    assert means["weights"]["w"].tolist() == [(2 * 1 + 3 * 4) / 4, (6 + 3 * 10) / 4]  # 2w, by samples
    # square weighted by its own first entry: (1 * [1, 9] + 4 * [4, 25]) / 5
    assert means["square"]["w"].tolist() == pytest.approx([17 / 5, 109 / 5])
    assert agg.weight_totals == {"weights": 4.0, "square": 5.0}


def test_buffered_mean_equals_streaming_mean_on_random_uploads():
    g = torch.Generator().manual_seed(0)
    stream, buffered = Aggregator(), Aggregator(reduce=weighted_mean)
    for cid in (5, 1, 3, 0, 9):
        up = {"weights": {"a": torch.randn(4, 3, generator=g), "b": torch.randn(7, generator=g)}}
        n = int(torch.randint(1, 50, (1,), generator=g))
        stream.add(up, n, cid)
        buffered.add(up, n, cid)
    s, b = stream.means(), buffered.means()
    assert all(torch.allclose(s["weights"][k], b["weights"][k], rtol=0, atol=1e-6) for k in ("a", "b"))
    assert stream.weight_totals == buffered.weight_totals


def _median(order):
    def reduce(entries):
        order.extend(cid for cid, _, _ in entries)
        stacked = torch.stack([up["weights"]["w"] for _, up, _ in entries])
        return {"weights": {"w": stacked.median(dim=0).values}}

    return reduce


def test_buffered_reduce_sees_every_upload_in_client_order_and_keeps_copies():
    order: list[int] = []
    agg = Aggregator(reduce=_median(order))
    ups = _uploads()
    for cid, up, n in ups:
        agg.add(up, n, cid)
    ups[0][1]["weights"]["w"].fill_(100.0)  # the worker's tensors are reused: the buffer holds copies
    means = agg.means()
    assert order == [2, 4, 7]
    assert means["weights"]["w"].tolist() == [1.0, 2.0]  # coordinate-wise median of [1,5,0] and [2,6,-4]


def test_the_strategy_declares_its_aggregator_and_a_plugin_builds_on_its_base():
    plain = FedAvg().aggregator()
    assert plain.weighting == {"*": "samples"} and plain.receive is None and not plain.buffered
    scaffold = Scaffold().aggregator()
    assert scaffold.weight("control", {}, 5) == 1.0 and scaffold.weight("weights", {}, 5) == 5.0
    # DP: the base's weighting, with the weights (and its own group) uniform
    dp = DP(Scaffold(), noise_multiplier=0.0).aggregator()
    assert dp.weight("weights", {}, 5) == 1.0 and dp.weight("control", {}, 5) == 1.0
    assert DP(FedAvg(), noise_multiplier=0.0).aggregator().weight("other", {}, 5) == 5.0
    # a robust plug-in: the base's weighting and receive, its own reduction
    median = Median(Scaffold())
    agg = median.aggregator()
    assert agg.buffered and agg.reduce == median.robust_aggregate and agg.weighting == scaffold.weighting

    class Doubling(StrategyWrapper):
        def aggregator(self):
            return super().aggregator().replace(receive=lambda up: {"weights": {"w": 2 * up["weights"]["w"]}})

    agg = Doubling(FedAvg()).aggregator()
    agg.add({"weights": {"w": torch.tensor([1.0])}}, 1, 0)
    assert agg.means()["weights"]["w"].item() == 2.0


def test_a_buffered_aggregator_trains_like_the_streaming_mean(fit):
    class Buffered(FedAvg):
        def aggregator(self):
            return Aggregator(reduce=weighted_mean)

    a, b = make_module(FedAvg(), clients_per_round=3), make_module(Buffered(), clients_per_round=3)
    fit(a, rounds=2)
    fit(b, rounds=2)
    wa, wb = global_weights(a), global_weights(b)
    assert all(torch.allclose(wa[k], wb[k], rtol=0, atol=1e-6) for k in wa)


# ------------------------------------------------------------------------------ client selection
def test_default_selection_is_the_seeded_uniform_sampling_bit_for_bit():
    # values of sample_clients before selection moved to the strategy
    pinned = [[2, 6, 8], [1, 5, 9], [1, 4, 5], [1, 6, 9], [6, 8, 9], [1, 4, 8]]
    assert [FedAvg().select_clients(10, 3, r, s) for s in (0, 7) for r in (0, 1, 5)] == pinned
    engine = make_engine(FedAvg(), num_clients=100, seed=3, clients_per_round=10)
    for r in range(4):
        assert engine.sample(r) == sample_clients(100, 10, 3, r)
    assert engine.sample(2) == [24, 27, 36, 37, 41, 51, 72, 77, 80, 83]


class FirstTwo(FedAvg):
    """Selects clients 3 and 1 every round and records who trains."""

    def __init__(self):
        super().__init__()
        self.trained: list[tuple[int, int]] = []

    def select_clients(self, num_clients, count, round, seed):
        return [3, 1]

    def on_client_start(self, module, ctx):
        super().on_client_start(module, ctx)
        self.trained.append((ctx.round, ctx.client_id))


def test_select_clients_decides_who_trains(fit):
    strategy = FirstTwo()
    module = make_module(strategy, clients_per_round=3)
    fit(module, rounds=2)
    assert strategy.trained == [(0, 1), (0, 3), (1, 1), (1, 3)]  # sorted by the loop
    assert [r.clients for r in module.history] == [2, 2]


@pytest.mark.parametrize("bad", [[], [0, 0], [4], [-1]])
def test_an_invalid_selection_is_refused(bad):
    class Bad(FedAvg):
        def select_clients(self, num_clients, count, round, seed):
            return bad

    with pytest.raises(ValueError, match="select_clients must return distinct client ids"):
        make_engine(Bad()).sample(0)


# ------------------------------------------------------------------------------ post-processing
class ClassifierOnly(FedAvg):
    """Compression by omission: only the output layer is sent up."""

    def process_upload(self, upload, ctx):
        return {"weights": {n: t for n, t in upload["weights"].items() if n.startswith("net.classifier.2.")}}


def test_process_upload_is_what_is_sent_counted_and_aggregated(fit):
    full = make_module(FedAvg(), clients_per_round=2)
    part = make_module(ClassifierOnly(), clients_per_round=2)
    start = global_weights(part)
    fit(full, rounds=1)
    fit(part, rounds=1)
    sent = {n: t for n, t in start.items() if n.startswith("net.classifier.2.")}
    assert part.history[0].bytes_up == 2 * payload_bytes({"weights": sent})
    assert part.history[0].bytes_up < full.history[0].bytes_up
    end = global_weights(part)
    for name in start:  # entries not sent keep their value; sent ones moved
        assert torch.equal(start[name], end[name]) == (name not in sent)


class ZeroAggregate(FedAvg):
    def __init__(self):
        super().__init__()
        self.infos = []
        self.seen = None

    def process_aggregate(self, means, info):
        self.infos.append((info.round, list(info.aggregated), dict(info.weight_totals)))
        return {"weights": {n: torch.zeros_like(t) for n, t in means["weights"].items()}}

    def server_update(self, model, means, info):
        self.seen = means
        super().server_update(model, means, info)


def test_process_aggregate_reaches_server_update(fit):
    strategy = ZeroAggregate()
    module = make_module(strategy, clients_per_round=2)
    fit(module, rounds=1)
    rnd, aggregated, totals = strategy.infos[0]
    assert rnd == 0 and len(aggregated) == 2 and totals["weights"] > 0
    assert all(not t.any() for t in strategy.seen["weights"].values())
    # server_lr=1: w - (w - 0) = 0
    assert all(not p.any() for p in module.client.parameters())


class NoisyUpload(FedAvg):
    """Local DP's shape: Gaussian noise on every uploaded tensor."""

    def process_upload(self, upload, ctx):
        return {g: {n: t + 0.01 * torch.randn_like(t) for n, t in ts.items()} for g, ts in upload.items()}


def test_noise_in_process_upload_comes_from_the_client_stream_and_repeats(fit):
    runs = [make_module(NoisyUpload(), clients_per_round=2) for _ in range(2)]
    for module in runs:
        fit(module, rounds=1)
    plain = make_module(FedAvg(), clients_per_round=2)
    fit(plain, rounds=1)
    a, b, c = (global_weights(m) for m in (*runs, plain))
    assert all(torch.equal(a[k], b[k]) for k in a)  # seeded by (seed, round, client_id)
    assert any(not torch.equal(a[k], c[k]) for k in a)  # and the noise did reach the aggregate
