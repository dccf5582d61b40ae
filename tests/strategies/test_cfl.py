"""CFL: the split test and bi-partition on constructed updates, per-cluster means, recursion, bad input, and a
run that splits a label-permuted federation into its two groups (one at a time, vectorised, resumed)."""

import os
from pathlib import Path

import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from torch import nn

from fl_lightning import Runtime
from fl_lightning.api import RoundInfo, RunSpec
from fl_lightning.api.client import ClientModule
from fl_lightning.callbacks import FederatedSummary
from fl_lightning.cli import main
from fl_lightning.data import IID
from fl_lightning.data.transforms import LabelPermutation
from fl_lightning.errors import ConfigError
from fl_lightning.lightning.checkpoint import AtomicCheckpointIO, LastRoundCheckpoint
from fl_lightning.lightning.module import FederatedModule
from fl_lightning.models import MLP
from fl_lightning.runs import read_clients, read_texts
from fl_lightning.strategies import DP, Attack, FineTune, Krum, get_strategy, list_strategies
from fl_lightning.strategies.cfl import CFL, META

from conftest import FORK, make_data, make_trainer, run_folder
from programs import run_program

D = torch.tensor([1.0, 2.0, -1.0, 0.5])  # the two groups' opposing direction


def _round(
    strategy: CFL, model: nn.Module, weights: dict[int, torch.Tensor], round: int, n: dict | None = None
):
    """One server round on uploads ``{client: flat weights}`` (``n``: sample counts, default 1)."""
    agg = strategy.aggregator()
    for cid, flat in weights.items():
        upload = {
            "weights": {"weight": flat[:3].view(1, 3), "bias": flat[3:]},
            META: {"group": torch.tensor([-1.0])},
        }
        agg.add(upload, (n or {}).get(cid, 1), cid)
    ids = sorted(weights)
    info = RoundInfo(round, ids, ids, strategy.num_clients, agg.weight_totals)
    optimizer = strategy.configure_server_optimizer(list(model.parameters()))
    optimizer.zero_grad()
    strategy.server_update(model, agg.means(), info)
    optimizer.step()


def _setup(num_clients: int = 6, **kw) -> tuple[CFL, nn.Module]:
    model = nn.Linear(3, 1)
    with torch.no_grad():
        model.weight.zero_()
        model.bias.zero_()
    strategy = CFL(**{"eps_1": 0.5, "eps_2": 1.0, "warmup": 1, **kw})
    strategy.setup(model, num_clients)
    return strategy, model


def _opposing(scale: float = 1.0, noise: float = 0.05) -> dict[int, torch.Tensor]:
    """Clients 0, 2, 3 move along +D, clients 1, 4, 5 along -D (plus a little noise): the mean update is
    small, every client's is large."""
    g = torch.Generator().manual_seed(0)
    signs = [1, -1, 1, 1, -1, -1]
    return {c: s * scale * D + noise * torch.randn(4, generator=g) for c, s in enumerate(signs)}


def test_opposing_updates_split_into_the_two_groups_each_averaged():
    strategy, model = _setup()
    uploads = _opposing()
    _round(strategy, model, uploads, round=1)
    assert strategy.cluster_of.tolist() == [0, 1, 0, 0, 1, 1]
    assert strategy.cluster_ids() == {0: 0, 1: 1, 2: 0, 3: 0, 4: 1, 5: 1}  # clients.csv's, TensorBoard's
    assert strategy.num_clusters == 2 and strategy.splits.tolist() == [[1, 0, 1]]
    # each cluster model is its clients' mean (theta_c started at 0)
    torch.testing.assert_close(strategy.models[0], sum(uploads[c] for c in (0, 2, 3)) / 3)
    torch.testing.assert_close(strategy.models[1], sum(uploads[c] for c in (1, 4, 5)) / 3)
    metrics = strategy.round_metrics()
    assert (
        metrics["cfl/clusters"] == 2 and metrics["cfl/splits"] == 1 and metrics["cfl/last_split_round"] == 2
    )
    expected_mean = torch.stack([uploads[c] for c in range(6)])[:, :4].mean(0).norm()
    assert metrics["cfl/mean_norm"] == pytest.approx(float(expected_mean), rel=1e-5)
    assert metrics["cfl/max_norm"] == pytest.approx(max(float(uploads[c].norm()) for c in range(6)), rel=1e-5)
    # the global model is the mean of every upload
    mean = sum(uploads.values()) / 6
    torch.testing.assert_close(model.weight.detach().view(-1), mean[:3])


@pytest.mark.parametrize(
    ("case", "kw", "round"),
    [
        ("warm-up", {"warmup": 5}, 1),  # before the warm-up ends
        ("mean too large", {"eps_1": 0.01}, 1),  # the cluster is not near a stationary point
        ("max too small", {"eps_2": 10.0}, 1),  # no client's update is large
    ],
)
def test_no_split_unless_every_criterion_holds(case, kw, round):
    strategy, model = _setup(**kw)
    _round(strategy, model, _opposing(), round=round)
    assert strategy.num_clusters == 1 and strategy.cluster_of.tolist() == [0] * 6, case
    assert strategy.round_metrics()["cfl/splits"] == 0


def test_a_cluster_of_two_clients_or_with_absent_clients_does_not_split():
    strategy, model = _setup(num_clients=2)
    _round(strategy, model, {0: D, 1: -D}, round=1)
    assert strategy.num_clusters == 1  # more than two clients needed
    strategy, model = _setup(num_clients=7)  # client 6 is in cluster 0 but not in the round
    _round(strategy, model, _opposing(), round=1)
    assert strategy.num_clusters == 1


def test_an_unseen_client_is_not_waited_for():
    """Client 6 of cluster 0 is held out of training (data.unseen_clients): the split happens without it,
    and it stays in cluster 0."""
    strategy, model = _setup(num_clients=7)
    strategy.check(model, RunSpec("multiclass", 10, 7, (4,), unseen=frozenset({6})))
    _round(strategy, model, _opposing(), round=1)
    assert strategy.num_clusters == 2 and strategy.cluster_of[6] == 0


def test_splits_recurse_within_a_cluster():
    """After the first split, cluster 0's clients disagree again along another direction: cluster 0 splits,
    the other cluster (no disagreement) stays."""
    strategy, model = _setup(num_clients=8)
    first = {**_opposing(), 6: D.clone(), 7: -D}
    _round(strategy, model, first, round=1)
    assert strategy.cluster_of.tolist() == [0, 1, 0, 0, 1, 1, 0, 1]
    e = torch.tensor([0.0, 0.0, 3.0, 1.0])
    theta0, theta1 = strategy.models[0].clone(), strategy.models[1].clone()
    second = {0: theta0 + e, 2: theta0 - e, 3: theta0 + e * 1.02, 6: theta0 - e}
    second.update({1: theta1, 4: theta1, 5: theta1, 7: theta1})
    _round(strategy, model, second, round=2)
    assert strategy.num_clusters == 3 and strategy.splits.tolist() == [[1, 0, 1], [2, 0, 2]]
    assert strategy.cluster_of.tolist() == [0, 1, 2, 0, 1, 1, 2, 1]


def test_sample_counts_weigh_the_cluster_mean():
    strategy, model = _setup(num_clients=3, warmup=100)
    uploads = {0: D.clone(), 1: 2 * D, 2: -D}
    _round(strategy, model, uploads, round=0, n={0: 1, 1: 2, 2: 1})
    torch.testing.assert_close(strategy.models[0], (D + 4 * D - D) / 4)


def test_the_deployed_model_is_the_clients_cluster_model():
    strategy, model = _setup()
    _round(strategy, model, _opposing(), round=1)
    deployed = nn.Linear(3, 1)
    strategy.personalize(deployed, 4, {})
    torch.testing.assert_close(torch.cat([deployed.weight.view(-1), deployed.bias]), strategy.models[1])
    assert strategy.message(model, 4, 2)["weights"]["bias"].item() == strategy.models[1][3].item()


# ---------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"eps_1": 0.0}, "model.strategy.eps_1"),
        ({"eps_1": -1.0}, "model.strategy.eps_1"),
        ({"eps_2": 0.0, "eps_1": 0.1}, "model.strategy.eps_2"),
        ({"eps_1": 2.0, "eps_2": 1.0}, "model.strategy.eps_1=2.0 must be below model.strategy.eps_2=1.0"),
        ({"warmup": -1}, "model.strategy.warmup"),
    ],
)
def test_thresholds_out_of_range_are_one_line_naming_the_field(kwargs, field):
    with pytest.raises(ConfigError) as info:
        CFL(**kwargs)
    assert str(info.value).startswith(field) and "\n" not in str(info.value)


@pytest.mark.parametrize("plugin", [DP, Krum])
def test_plugins_that_assume_one_global_model_refuse_to_wrap_it(plugin):
    with pytest.raises(ConfigError, match=f"model.strategy: {plugin.__name__} cannot wrap CFL"):
        plugin(CFL())


def test_registered_and_composable_with_finetune_and_attack():
    assert "CFL" in list_strategies()
    strategy = get_strategy("CFL", eps_1=0.1, eps_2=0.2)
    assert (strategy.eps_1, strategy.eps_2) == (0.1, 0.2)
    assert isinstance(FineTune(Attack(CFL())).base.base, CFL)


# ---------------------------------------------------------------------------------- runs
def _permuted_module(vectorize: int = 1) -> FederatedModule:
    torch.manual_seed(0)
    client = ClientModule(MLP(in_features=64, num_classes=10, hidden=(32,)), lr=0.1, momentum=0.9)
    strategy = CFL(eps_1=0.8, eps_2=2.0, warmup=3)
    return FederatedModule(
        client=client,
        strategy=strategy,
        local_steps=None,
        local_epochs=2,
        runtime=Runtime(vectorize=vectorize, vectorize_cpu="batched"),
    )


def _permuted_data():
    return make_data(num_clients=8, partition=IID(), client_transform=LabelPermutation(k=2), batch_size=32)


def test_splits_a_label_permutation_into_its_two_groups(tmp_path):
    """8 digits clients, LabelPermutation(k=2): after the warm-up the one cluster's mean update is small while
    its clients' updates stay large, and the bi-partition separates the two groups exactly."""
    module, summary = _permuted_module(), FederatedSummary()
    logger = TensorBoardLogger(tmp_path, name="lightning_logs")
    make_trainer(tmp_path, rounds=5, callbacks=[summary], logger=logger).fit(
        module, datamodule=_permuted_data()
    )
    assert module.strategy.cluster_of.tolist() == [0, 1, 0, 1, 0, 1, 0, 1]
    records = [r.strategy for r in module.history]
    assert [r["cfl/splits"] for r in records] == [0, 0, 0, 1, 0]  # one split, in round 4
    run = run_folder(tmp_path)
    assert [int(c["cluster"]) for c in read_clients(run)] == [0, 1, 0, 1, 0, 1, 0, 1]  # the final clusters
    texts = read_texts(run)["cluster/assignment"]  # every round's, in TensorBoard's text tab
    assert texts[2] == (3, "round 3: cluster 0: clients 0, 1, 2, 3, 4, 5, 6, 7")
    assert texts[3] == (4, "round 4: cluster 0: clients 0, 2, 4, 6; cluster 1: clients 1, 3, 5, 7")
    assert summary.summary["cluster_ari"] == 1.0 and summary.summary["cfl/last_split_round"] == 4
    assert summary.summary["client_acc"]["mean"] > 0.85 > 0.65 > summary.summary["final_global_acc"]


def test_vectorised_clients_equal_one_at_a_time(tmp_path):
    """Each client's message is its cluster's model: after the split the group stacks two clusters' models."""
    seq, vec = _permuted_module(1), _permuted_module(4)
    make_trainer(tmp_path / "seq", rounds=5).fit(seq, datamodule=_permuted_data())
    make_trainer(tmp_path / "vec", rounds=5).fit(vec, datamodule=_permuted_data())
    assert vec.engine.executor.counts["vectorised"] == 40 and seq.engine.executor.counts["vectorised"] == 0
    assert torch.equal(seq.strategy.cluster_of, vec.strategy.cluster_of)
    torch.testing.assert_close(seq.strategy.models, vec.strategy.models, rtol=0, atol=1e-5)


def test_resume_restores_the_clusters_found(tmp_path):
    """The cluster models grow with each split: a checkpoint after the split resumes with them."""

    def fit(folder, rounds, ckpt=None):
        module = _permuted_module()
        trainer = make_trainer(
            tmp_path / folder,
            rounds=rounds,
            enable_checkpointing=True,
            plugins=[AtomicCheckpointIO()],
            callbacks=[LastRoundCheckpoint(dirpath=tmp_path / folder / "ckpts")],
        )
        trainer.fit(module, datamodule=_permuted_data(), ckpt_path=ckpt)
        return module

    full = fit("full", 6)
    fit("a", 5)
    resumed = fit("b", 6, tmp_path / "a" / "ckpts" / "last.ckpt")
    assert resumed.strategy.num_clusters == 2
    assert torch.equal(full.strategy.cluster_of, resumed.strategy.cluster_of)
    assert torch.equal(full.strategy.models, resumed.strategy.models)
    assert torch.equal(full.strategy.splits, resumed.strategy.splits)


# ---------------------------------------------------------------------------------- several processes
TESTS = Path(__file__).resolve().parents[1]
#: The label-permuted federation through the command line, 8 clients, every one in every round.
PERMUTED = [
    "--trainer.accelerator=cpu",
    "--trainer.max_steps=5",
    "--trainer.enable_progress_bar=false",
    "--model.client.net=fl_lightning.models.MLP",
    "--data.client_transform=LabelPermutation",
    "--data.client_transform.k=2",
    "--data.num_clients=8",
    "--data.partition=IID",
    "--model.local_epochs=2",
    "--model.local_steps=null",
    "--model.eval_clients_every=0",
]


def cli_run(folder: Path, devices: int, *extra: str) -> dict:
    """``fit`` through the command line in ``devices`` processes (forked, :data:`conftest.FORK`); the last
    checkpoint."""
    folder.mkdir(parents=True, exist_ok=True)
    args = ["fit", *PERMUTED, *extra, f"--trainer.default_root_dir={folder}"]
    if devices == 1:
        main(args)
    else:
        env = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        proc = run_program([*args, f"--trainer.devices={devices}", FORK], cwd=folder, env=env, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
    ckpt = next((run_folder(folder) / "checkpoints").glob("*.ckpt"))
    return torch.load(ckpt, weights_only=False)


def assert_same_run(one: dict, two: dict) -> None:
    """Global weights and the strategy's cluster state agree; so do the round records."""
    w1, w2 = one["state_dict"], two["state_dict"]
    assert w1.keys() == w2.keys() and any(k.startswith("strategy.") for k in w1)
    for k in w1:
        torch.testing.assert_close(w1[k], w2[k], rtol=0, atol=1e-5)
    h1, h2 = one["fl_lightning"]["history"], two["fl_lightning"]["history"]
    for a, b in zip(h1, h2, strict=True):
        assert a["strategy"] == pytest.approx(b["strategy"], rel=1e-4, abs=1e-5)


@pytest.mark.slow
def test_two_processes_split_as_one_process(tmp_path):
    """Each process trains half the clients; the buffered uploads are gathered in client order, so both
    processes split the same cluster the same way, as the one-process run does."""
    extra = ["--model.strategy=CFL", "--model.strategy.eps_1=1.0", "--model.strategy.eps_2=2.5"]
    extra.append("--model.strategy.warmup=3")
    one = cli_run(tmp_path / "one", 1, *extra)
    two = cli_run(tmp_path / "two", 2, *extra)
    assert_same_run(one, two)
    assert one["fl_lightning"]["history"][-1]["strategy"]["cfl/clusters"] == 2
    assert one["state_dict"]["strategy.cluster_of"].tolist() == [0, 1, 0, 1, 0, 1, 0, 1]
