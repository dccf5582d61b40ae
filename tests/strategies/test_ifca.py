"""IFCA: the cluster choice by lowest loss, per-cluster averages, restarts, the record, bad input, a run that
recovers the groups of a label permutation."""

import logging

import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from sklearn.metrics import adjusted_rand_score
from torch import nn

from fl_lightning import Runtime
from fl_lightning.api import RoundInfo
from fl_lightning.api.client import ClientModule
from fl_lightning.api.types import ClientContext
from fl_lightning.callbacks import FederatedCallback, FederatedSummary
from fl_lightning.callbacks.results import cluster_text
from fl_lightning.data import IID
from fl_lightning.data.transforms import LabelPermutation
from fl_lightning.engine.attack import SimulatedAttack
from fl_lightning.errors import ConfigError
from fl_lightning.flower.executor import refuse_server_deployed
from fl_lightning.lightning.module import FederatedModule
from fl_lightning.models import MLP, LogisticRegression
from fl_lightning.runs import read_clients, read_texts
from fl_lightning.strategies import DP, FastSlow, FedAvg, FineTune, Median, get_strategy, list_strategies
from fl_lightning.strategies.ifca import CLUSTER, IFCA, META

from conftest import make_data, make_engine, make_module, make_trainer, run_folder


def _client_data(num_clients: int = 2):
    data = make_data(num_clients=num_clients, partition=IID(), local_test_fraction=0.0)
    data.setup("fit")
    return data.clients


def _linear_module() -> ClientModule:
    torch.manual_seed(0)
    return ClientModule(LogisticRegression(input_dim=64, num_outputs=10), lr=0.1, momentum=0.0)


# ---------------------------------------------------------------------------------- the client's choice
def test_a_client_trains_the_cluster_model_with_the_lowest_loss_on_its_training_data():
    clients = _client_data()
    module = _linear_module()
    strategy = IFCA(k=3, seed=4)
    strategy.setup(module, 2)
    message = strategy.message(module, 0, 0)
    assert sorted(message) == [f"{CLUSTER}0", f"{CLUSTER}1", f"{CLUSTER}2"] and "weights" not in message
    data = clients[0]
    # F_0(theta_j) by hand: the mean cross-entropy over every training sample of client 0
    x, y = data.take(data.train_idx)
    losses = []
    for j in range(3):
        w = message[f"{CLUSTER}{j}"]
        logits = x.flatten(1) @ w["net.linear.weight"].T + w["net.linear.bias"]
        losses.append(float(nn.functional.cross_entropy(logits, y)))
    expected = min(range(3), key=lambda j: losses[j])
    assert len(set(losses)) == 3 and expected != 0  # three different draws, not just the first
    ctx = ClientContext(0, 0, message, {}, data.num_samples, 1, 0.1, data=data)
    strategy.on_client_start(module, ctx)
    slot, per_restart = ctx.scratch["ifca"]
    assert slot == expected
    assert per_restart.tolist() == pytest.approx([min(losses)], rel=1e-5)
    for name, t in message[f"{CLUSTER}{expected}"].items():  # the chosen model is the one trained
        assert torch.equal(module.state_dict()[name], t)


def _upload(slot: int, client: int, group: int, weights: dict, losses: list[float]) -> dict:
    facts = torch.tensor([float(slot), float(client), float(group)])
    return {"weights": weights, META: {"facts": facts, "losses": torch.tensor(losses)}}


def _aggregate(
    strategy: IFCA, model: nn.Module, uploads: list[tuple[dict, int, int]], round: int = 0
) -> None:
    agg = strategy.aggregator()
    for upload, n, cid in uploads:
        agg.add(upload, n, cid)
    ids = [cid for _, _, cid in uploads]
    info = RoundInfo(round, ids, ids, strategy.num_clients, agg.weight_totals)
    optimizer = strategy.configure_server_optimizer(list(model.parameters()))
    optimizer.zero_grad()
    strategy.server_update(model, agg.means(), info)
    optimizer.step()


def test_each_cluster_model_becomes_the_sample_weighted_mean_of_its_clients():
    """Clients 0 (1 sample) in cluster 0, 1 (3 samples) and 2 (1 sample) in cluster 1, client 3 absent:
    theta_0 = a, theta_1 = (3 b + c) / 4; the global model is the mean of all, (a + 3 b + c) / 5."""
    model = nn.Linear(2, 1)
    strategy = IFCA(k=3, seed=0)
    strategy.setup(model, 4)
    untouched = strategy.models[2].clone()
    a = {"weight": torch.tensor([[1.0, 2.0]]), "bias": torch.tensor([0.0])}
    b = {"weight": torch.tensor([[5.0, 6.0]]), "bias": torch.tensor([4.0])}
    c = {"weight": torch.tensor([[-3.0, 2.0]]), "bias": torch.tensor([8.0])}
    uploads = [
        (_upload(0, 0, 0, a, [0.5]), 1, 0),
        (_upload(1, 1, 1, b, [0.25]), 3, 1),
        (_upload(1, 2, 1, c, [1.0]), 1, 2),
    ]
    _aggregate(strategy, model, uploads)
    assert strategy.models[0].tolist() == [1.0, 2.0, 0.0]  # layout: weight (2), bias (1)
    assert strategy.models[1].tolist() == pytest.approx([3.0, 5.0, 5.0])  # (15 - 3, 18 + 2, 12 + 8) / 4
    assert torch.equal(strategy.models[2], untouched)  # no client chose it
    assert model.weight.tolist() == [pytest.approx([13 / 5, 22 / 5])] and model.bias.item() == pytest.approx(
        4.0
    )
    metrics = strategy.round_metrics()
    assert metrics["ifca/clients0"] == 1 and metrics["ifca/clients1"] == 2 and metrics["ifca/clients2"] == 0
    assert metrics["ifca/loss"] == pytest.approx((0.5 + 3 * 0.25 + 1.0) / 5)
    assert metrics["cluster_ari"] == 1.0  # groups [0, 1, 1] against clusters [0, 1, 1]


def test_each_clients_last_choice_is_kept_and_checkpointed():
    """Round 1: clients 0, 1, 2 choose 0, 1, 1; round 2: only client 0 trains, choosing 2. Client 3 never
    trained: no cluster. A checkpoint written before the choices were kept loads with none known."""
    model = nn.Linear(2, 1)
    strategy = IFCA(k=3, seed=0)
    strategy.setup(model, 4)
    assert strategy.cluster_ids() == {}
    w = {"weight": torch.zeros(1, 2), "bias": torch.zeros(1)}
    _aggregate(strategy, model, [(_upload(s, c, -1, w, [1.0]), 1, c) for c, s in enumerate([0, 1, 1])])
    assert strategy.cluster_ids() == {0: 0, 1: 1, 2: 1}
    _aggregate(strategy, model, [(_upload(2, 0, -1, w, [1.0]), 1, 0)], round=1)
    assert strategy.cluster_ids() == {0: 2, 1: 1, 2: 1}
    restored = IFCA(k=3, seed=0)
    restored.setup(model, 4)
    restored.load_state_dict(strategy.state_dict())
    assert restored.cluster_ids() == {0: 2, 1: 1, 2: 1}
    older = IFCA(k=3, seed=0)
    older.setup(model, 4)
    older.load_state_dict({k: v for k, v in strategy.state_dict().items() if k != "assigned"})
    assert older.cluster_ids() == {} and torch.equal(older.models, strategy.models)


def test_cluster_ari_compares_the_rounds_choices_with_the_true_groups():
    model = nn.Linear(2, 1)
    strategy = IFCA(k=2, seed=0)
    strategy.setup(model, 5)
    w = {"weight": torch.zeros(1, 2), "bias": torch.zeros(1)}
    clusters, groups = [0, 0, 1, 1, 1], [0, 1, 1, 0, 1]
    _aggregate(
        strategy,
        model,
        [(_upload(s, i, g, w, [1.0]), 1, i) for i, (s, g) in enumerate(zip(clusters, groups))],
    )
    assert strategy.round_metrics()["cluster_ari"] == pytest.approx(adjusted_rand_score(groups, clusters))
    no_groups = IFCA(k=2, seed=0)
    no_groups.setup(model, 2)
    _aggregate(no_groups, model, [(_upload(0, i, -1, w, [1.0]), 1, i) for i in range(2)])
    assert "cluster_ari" not in no_groups.round_metrics()  # a run without groups reports none


def test_restarts_race_in_the_first_round_and_keep_the_lowest_mean_loss():
    """R = 2 sets of k = 1 model: mean lowest losses (2.0 + 3.0) / 2 for set 0, (1.0 + 0.5) / 2 for set 1:
    set 1 is kept, with the first round's average of its clients (client 0 only), in slot 0."""
    model = nn.Linear(2, 1)
    strategy = IFCA(k=1, restarts=2, seed=0)
    strategy.setup(model, 2)
    assert len(strategy.message(model, 0, 0)) == 2 and not torch.equal(strategy.models[0], strategy.models[1])
    a = {"weight": torch.tensor([[1.0, 2.0]]), "bias": torch.tensor([3.0])}
    b = {"weight": torch.tensor([[9.0, 9.0]]), "bias": torch.tensor([9.0])}
    _aggregate(
        strategy, model, [(_upload(1, 0, -1, a, [2.0, 1.0]), 1, 0), (_upload(0, 1, -1, b, [3.0, 0.5]), 1, 1)]
    )
    assert int(strategy.kept) == 1 and strategy.round_metrics()["ifca/restart"] == 1
    assert strategy.models[0].tolist() == [1.0, 2.0, 3.0]
    assert list(strategy.message(model, 0, 1)) == [f"{CLUSTER}0"]  # from now on the k kept models
    # the next round scores only the kept set (in slot 0, as restart 0): its choices and loss are recorded
    _aggregate(strategy, model, [(_upload(0, 0, -1, a, [1.5]), 1, 0), (_upload(0, 1, -1, b, [2.5]), 1, 1)])
    assert strategy.round_metrics()["ifca/loss"] == pytest.approx(2.0)
    assert strategy.round_metrics()["ifca/clients0"] == 2 and strategy.cluster_ids() == {0: 0, 1: 0}


def test_initial_models_are_seeded_draws_and_leave_the_global_rng_alone():
    model = nn.Linear(3, 2)
    torch.manual_seed(5)
    before = torch.random.get_rng_state()
    a, b = IFCA(k=2, seed=7), IFCA(k=2, seed=7)
    a.setup(model, 2)
    b.setup(model, 2)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert torch.equal(a.models, b.models) and not torch.equal(a.models[0], a.models[1])
    c = IFCA(k=2, seed=8)
    c.setup(model, 2)
    assert not torch.equal(a.models, c.models)


# ---------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"k": 0}, "model.strategy.k"),
        ({"k": -2}, "model.strategy.k"),
        ({"k": 1.5}, "model.strategy.k"),
        ({"restarts": 0}, "model.strategy.restarts"),
        ({"seed": -1}, "model.strategy.seed"),
        ({"server_lr": 0}, "model.strategy.server_lr"),
    ],
)
def test_bad_arguments_are_one_line_naming_the_field(kwargs, field):
    with pytest.raises(ConfigError) as info:
        IFCA(**kwargs)
    assert str(info.value).startswith(field) and "\n" not in str(info.value)


def test_more_clusters_than_clients_is_one_line():
    with pytest.raises(ConfigError, match=r"^model.strategy.k=5 is larger than data.num_clients=4") as info:
        make_engine(IFCA(k=5), num_clients=4)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("plugin", [DP, FastSlow, Median])
def test_plugins_that_assume_one_global_model_refuse_to_wrap_it(plugin):
    with pytest.raises(ConfigError, match=f"model.strategy: {plugin.__name__} cannot wrap IFCA") as info:
        plugin(IFCA(k=2))
    assert "FineTune" in str(info.value) and "\n" not in str(info.value)


def test_finetune_wraps_it_and_fine_tunes_the_deployed_cluster_model():
    wrapped = FineTune(IFCA(k=2), epochs=1)
    assert isinstance(wrapped.base, IFCA)


def test_registered_and_listed_with_its_arguments():
    assert "IFCA" in list_strategies()
    strategy = get_strategy("IFCA", k=4)
    assert isinstance(strategy, IFCA) and strategy.k == 4


# ---------------------------------------------------------------------------------- runs
class Choices(FederatedCallback):
    """Every client's recorded cluster per round."""

    def __init__(self) -> None:
        self.clusters: dict[tuple[int, int], float] = {}

    def on_client_end(self, trainer, pl_module, round, index, total, result) -> None:
        if result is not None:
            self.clusters[(round, result.client_id)] = result.metrics["ifca/cluster"]


def _permuted_run(tmp_path, strategy, rounds: int = 5, logger: bool = False, **kw):
    torch.manual_seed(0)
    client = ClientModule(MLP(in_features=64, num_classes=10, hidden=(32,)), lr=0.1, momentum=0.9)
    module = FederatedModule(client=client, strategy=strategy, local_steps=None, local_epochs=2, **kw)
    data = make_data(num_clients=8, partition=IID(), client_transform=LabelPermutation(k=2), batch_size=32)
    choices, summary = Choices(), FederatedSummary()
    board = TensorBoardLogger(tmp_path, name="lightning_logs") if logger else False
    trainer = make_trainer(tmp_path, rounds=rounds, callbacks=[choices, summary], logger=board)
    trainer.fit(module, datamodule=data)
    return module, choices, summary.summary


def test_recovers_the_groups_of_a_label_permutation(tmp_path):
    """8 digits clients, LabelPermutation(k=2): odd and even clients see contradictory labels. IFCA with k = 2
    puts each group in its own cluster within a few rounds (ARI 1, also in summary.json) and its deployed
    models serve both groups, where one global model cannot. The clusters are in TensorBoard's text after
    every round and each client's final one in clients.csv."""
    module, choices, summary = _permuted_run(tmp_path, IFCA(k=2, seed=0), logger=True)
    last = module.history[-1].strategy
    assert last["cluster_ari"] == 1.0 and summary["cluster_ari"] == 1.0
    final = [int(choices.clusters[(4, c)]) for c in range(8)]
    assert final[0::2] == [final[0]] * 4 and final[1::2] == [final[1]] * 4 and final[0] != final[1]
    assert summary["client_acc"]["mean"] > 0.85 > 0.6 > summary["final_global_acc"]
    run = run_folder(tmp_path)
    assert [int(c["cluster"]) for c in read_clients(run)] == final
    texts = read_texts(run)["cluster/assignment"]
    assert [step for step, _ in texts] == [1, 2, 3, 4, 5]
    even, odd = (", ".join(map(str, range(g, 8, 2))) for g in (0, 1))
    parts = sorted([(final[0], even), (final[1], odd)])
    assert texts[-1][1] == f"round 5: cluster {parts[0][0]}: clients {parts[0][1]}; " + (
        f"cluster {parts[1][0]}: clients {parts[1][1]}"
    )
    for r, (_, text) in enumerate(texts):  # each round's text: every client's choice in that round
        chosen = {c: int(choices.clusters[(r, c)]) for c in range(8)}
        assert text == cluster_text(r + 1, chosen)


def test_vectorised_clients_fall_back_to_one_at_a_time_naming_the_reason(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="fl_lightning"):
        module, _, _ = _permuted_run(tmp_path, IFCA(k=2, seed=0), rounds=1, runtime=Runtime(vectorize=4))
    assert module.engine.executor.counts["vectorised"] == 0
    assert any(
        "IFCA scores each cluster model on a client's own data" in r.getMessage() for r in caplog.records
    )


def test_restarts_run_end_to_end(tmp_path):
    module = make_module(IFCA(k=2, restarts=3, seed=0))
    make_trainer(tmp_path, rounds=2).fit(module, datamodule=make_data())
    first, second = (r.strategy for r in module.history)
    assert first["ifca/restart"] == second["ifca/restart"] == int(module.strategy.kept)
    assert module.history[0].bytes_down == 3 * module.history[1].bytes_down  # 6 models, then 2


@pytest.mark.slow
def test_two_processes_match_one_process(tmp_path):
    """The uploads' cluster codes and per-cluster groups are weighted sums: all-reduced across processes, they
    give every process the same cluster models and record."""
    from test_cfl import assert_same_run, cli_run

    extra = [
        "--model.strategy=IFCA",
        "--model.strategy.k=2",
        "--model.strategy.seed=0",
        "--trainer.max_steps=3",
    ]
    one = cli_run(tmp_path / "one", 1, *extra)
    two = cli_run(tmp_path / "two", 2, *extra)
    assert_same_run(one, two)
    assert one["fl_lightning"]["history"][-1]["strategy"]["cluster_ari"] == 1.0


def test_a_simulated_attack_on_its_k_models_is_one_line_not_a_silent_no_op():
    engine = make_engine(IFCA(k=2), attack=SimulatedAttack(kind="sign_flip", fraction=0.5))
    with pytest.raises(
        ConfigError, match=r"^model.attack needs the global model .* model.strategy=IFCA"
    ) as info:
        engine.run_round(0)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("wrap", [False, True])
def test_the_flower_path_refuses_it_before_any_round(wrap):
    strategy = FineTune(IFCA(k=2), epochs=1) if wrap else IFCA(k=2)
    with pytest.raises(ConfigError, match=r"^flower: model.strategy=\w+ deploys each client's model from"):
        refuse_server_deployed(strategy)
    refuse_server_deployed(FineTune(FedAvg(), epochs=1))  # one global model: deployable from a node
