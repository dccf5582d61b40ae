"""fl_lightning.data.transforms: per-client feature skew, concept shift and label noise, seeded, on every
read of a client's samples and on every execution path."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from fl_lightning.api.types import ClientContext
from fl_lightning.cli import main
from fl_lightning.data import (
    IID,
    FederatedDataModule,
    GaussianNoise,
    LabelNoise,
    LabelPermutation,
    NaturalUsers,
    Rotation,
    Shakespeare,
    list_transforms,
)
from fl_lightning.data.transforms import distinct_permutations, flip_labels, noise_std, rotate
from fl_lightning.engine import vectorized
from fl_lightning.errors import ConfigError
from fl_lightning.runs import latest_run
from fl_lightning.strategies import FedAvg, FedGen

from conftest import FORK, global_weights, make_data, make_module, make_trainer
from programs import run_program


def _data(transform, num_clients: int = 4, **kw) -> FederatedDataModule:
    dm = FederatedDataModule(num_clients=num_clients, partition=IID(), client_transform=transform, **kw)
    dm.setup()
    return dm


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------------------------------ noise
def test_noise_std_is_niid_benchs_sigma_i_over_n_minus_1():
    assert [noise_std(0.1, i, 5) for i in range(5)] == pytest.approx([0.0, 0.025, 0.05, 0.075, 0.1])
    assert noise_std(0.1, 0, 1) == 0.0  # a federation of one client has no noise


def test_gaussian_noise_has_each_clients_std_and_is_fresh_at_every_access():
    dm = _data(GaussianNoise(sigma=0.9), num_clients=4)
    for c in dm.clients:
        idx = c.train_idx
        x, y = c.take(idx, _gen(c.client_id))
        assert torch.equal(y, c.y[idx])  # labels untouched
        noise = (x - c.x[idx]).flatten()
        expected = 0.9 * c.client_id / 3
        if expected == 0:
            assert torch.equal(x, c.x[idx])
        else:  # ~ 64 * 350 draws: the std is within 2% of the client's level
            assert noise.std().item() == pytest.approx(expected, rel=0.02)
            assert abs(noise.mean().item()) < 0.02
    last = dm.clients[3]
    g = _gen(0)
    first, second = last.take(last.train_idx[:8], g)[0], last.take(last.train_idx[:8], g)[0]
    assert not torch.equal(first, second), "drawn afresh at every access"
    again = last.take(last.train_idx[:8], _gen(0))[0]
    assert torch.equal(first, again), "the same generator state gives the same noise"


def test_noise_is_drawn_from_the_batch_generator_right_after_the_indices():
    dm = _data(GaussianNoise(sigma=0.5))
    c = dm.clients[2]
    batches = list(c.batches(16, 3, _gen(7)))
    g = _gen(7)
    for (x, y), idx in zip(batches, c.batch_indices(16, 3, g)):
        ref = c.x[idx] + torch.randn(c.x[idx].shape, generator=g) * c.transform.std(2)
        torch.testing.assert_close(x, ref)
        assert torch.equal(y, c.y[idx])


def test_local_test_data_get_the_clients_noise_the_same_at_every_evaluation():
    dm = _data(GaussianNoise(sigma=0.5), local_test_fraction=0.3)
    c = dm.clients[3]
    a = torch.cat([x for x, _ in c.eval_batches(7)])
    b = torch.cat([x for x, _ in c.eval_batches(7)])
    assert torch.equal(a, b)
    clean = c.x[c.test_idx]
    assert (a - clean).std().item() == pytest.approx(0.5, rel=0.1)


def test_noise_on_token_inputs_is_a_one_line_error(tmp_path):
    play = tmp_path / "plays" / "comedies" / "tiny.md"
    play.parent.mkdir(parents=True)
    lines = "\n".join(f"Line {i} of a speech that goes on." for i in range(12))
    play.write_text(f"# Tiny\n\n**ANNA**  \n{lines}\n\n**BEN**  \n{lines}\n")
    options = Shakespeare(root=str(tmp_path / "plays"), seq_len=10)
    dm = FederatedDataModule(options, partition=NaturalUsers(), client_transform=GaussianNoise(0.1))
    with pytest.raises(ConfigError, match=r"^data\.client_transform=GaussianNoise needs float inputs"):
        dm.setup()


# ------------------------------------------------------------------------------------------ rotation
def test_rotation_groups_and_angles():
    dm = _data(Rotation(k=4), num_clients=6)
    t = dm.client_transform
    assert [t.group_of(i) for i in range(6)] == [0, 1, 2, 3, 0, 1]
    assert [t.angle(g) for g in range(4)] == [0.0, 90.0, 180.0, 270.0]
    for c in dm.clients:
        idx = c.train_idx[:5]
        x, y = c.take(idx)
        ref = torch.rot90(c.x[idx], k=t.group_of(c.client_id), dims=(-2, -1))  # counter-clockwise
        torch.testing.assert_close(x, ref)
        assert torch.equal(y, c.y[idx])
        xe = next(c.eval_batches(5))[0]
        eval_idx = c.test_idx[:5]
        torch.testing.assert_close(xe, torch.rot90(c.x[eval_idx], k=t.group_of(c.client_id), dims=(-2, -1)))


def test_rotation_by_other_angles_uses_torchvision():
    x = torch.randn(2, 1, 9, 9)
    assert rotate(x, 360) is x
    assert not torch.equal(rotate(x, 45), x) and rotate(x, 45).shape == x.shape
    dm = _data(Rotation(k=3), num_clients=3)
    assert dm.client_transform.angle(1) == 120.0


# ------------------------------------------------------------------------------------ permutation
def test_label_permutations_are_fixed_distinct_seeded_and_group_zero_keeps_the_labels():
    dm = _data(LabelPermutation(k=3), num_clients=6, seed=5)
    t = dm.client_transform
    perms = [t.permutation(g).tolist() for g in range(3)]
    assert perms[0] == list(range(10))
    assert len({tuple(p) for p in perms}) == 3 and all(sorted(p) == list(range(10)) for p in perms)
    again = _data(LabelPermutation(k=3), num_clients=6, seed=5).client_transform
    assert [again.permutation(g).tolist() for g in range(3)] == perms  # seeded: reproducible
    other = _data(LabelPermutation(k=3), num_clients=6, seed=6).client_transform
    assert [other.permutation(g).tolist() for g in range(3)] != perms
    for c in dm.clients:
        perm = t.permutation(t.group_of(c.client_id))
        assert torch.equal(c.train_labels(), perm[c.y[c.train_idx]])
        x, y = c.take(c.train_idx[:9])
        assert torch.equal(x, c.x[c.train_idx[:9]]) and torch.equal(y, perm[c.y[c.train_idx[:9]]])
        _, ye = next(c.eval_batches(1000))
        assert torch.equal(ye, perm[c.y[c.test_idx]])


def test_distinct_permutations_and_the_bound_on_k():
    perms = distinct_permutations(3, 6, np.random.default_rng(0))
    assert len({tuple(p) for p in perms}) == 6  # all 3! of them
    with pytest.raises(ValueError):
        distinct_permutations(3, 7, np.random.default_rng(0))
    with pytest.raises(ConfigError, match=r"data\.client_transform\.k=7 exceeds the 6 distinct permutations"):
        LabelPermutation(k=7).check(10, 3, "multiclass", (4,))


def test_multilabel_targets_have_their_columns_permuted():
    t = LabelPermutation(k=2)
    t._multilabel, t._perms = True, [torch.arange(3), torch.tensor([2, 0, 1])]
    y = torch.tensor([[1, 0, 0], [0, 1, 1]])
    # label c reads perm[c]: column perm[c] of the result is the original column c
    assert t.group_labels(1, y).tolist() == [[0, 0, 1], [1, 1, 0]]


# -------------------------------------------------------------------------------------- label noise
def test_flip_labels_flips_at_the_rate_and_always_to_another_class():
    y = np.random.default_rng(0).integers(0, 10, 20_000)
    out = flip_labels(y, 0.3, 10, np.random.default_rng(1))
    flipped = out != y
    assert flipped.mean() == pytest.approx(0.3, abs=0.01)
    counts = np.bincount((out[flipped] - y[flipped]) % 10, minlength=10)
    assert counts[0] == 0 and counts[1:].min() > 0.8 * counts[1:].mean()  # uniform over the other classes


def test_label_noise_rates_flips_and_reproducibility():
    dm = _data(LabelNoise(max_rate=0.6, min_rate=0.2, noisy_fraction=0.5), num_clients=6, seed=3)
    t = dm.client_transform
    rates = [t.rate(i) for i in range(6)]
    assert sum(r > 0 for r in rates) == 3 and all(0.2 <= r <= 0.6 for r in rates if r > 0)
    again = _data(LabelNoise(max_rate=0.6, min_rate=0.2, noisy_fraction=0.5), num_clients=6, seed=3)
    for c, d in zip(dm.clients, again.clients):
        labels = c.train_labels()
        assert torch.equal(labels, d.train_labels())  # seeded by (data.seed, client)
        assert torch.equal(c.take(c.train_idx)[1], labels)  # fixed: the same at every access
        clean = c.y[c.train_idx]
        if t.rate(c.client_id) == 0:
            assert torch.equal(labels, clean)
        _, ye = next(c.eval_batches(1000))
        if t.rate(c.client_id) > 0:  # the local test data are noisy too
            assert (ye != c.y[c.test_idx]).any()
            assert (labels != clean).float().mean().item() == pytest.approx(t.rate(c.client_id), abs=0.12)
    assert dm.eval_groups == []  # global/*: the clean test set
    _, y = next(iter(dm.test_dataloader()))
    assert torch.equal(y, dm.splits.test_y[: len(y)])


def test_label_noise_needs_multiclass_labels():
    with pytest.raises(ConfigError, match="LabelNoise needs a multiclass dataset"):
        LabelNoise().check(4, 17, "multilabel", (3, 8, 8))


# ------------------------------------------------------------------------------------- bad values
@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: GaussianNoise(sigma=-0.1), "data.client_transform.sigma"),
        (lambda: GaussianNoise(sigma=math.nan), "data.client_transform.sigma"),
        (lambda: Rotation(k=0), "data.client_transform.k"),
        (lambda: LabelPermutation(k=-1), "data.client_transform.k"),
        (lambda: LabelNoise(max_rate=1.5), "data.client_transform.max_rate"),
        (lambda: LabelNoise(max_rate=0.2, min_rate=0.3), "data.client_transform.min_rate"),
        (lambda: LabelNoise(noisy_fraction=-0.1), "data.client_transform.noisy_fraction"),
        (lambda: _data(Rotation(k=5), num_clients=4), "data.client_transform.k"),
        (lambda: _data(Rotation(k=2), dataset="fedprox_synthetic"), "data.client_transform=Rotation"),
    ],
)
def test_out_of_range_parameters_are_one_line_errors(build, field):
    with pytest.raises(ConfigError) as info:
        build()
    assert str(info.value).startswith(field) and "\n" not in str(info.value)


def test_registry():
    assert list_transforms() == ["gaussian_noise", "label_noise", "label_permutation", "rotation"]


# --------------------------------------------------------------------------------- in the run
def test_the_card_and_the_fingerprint_record_the_transform():
    dm = _data(Rotation(k=2), num_clients=3)
    card = dm.client_transform.card()
    assert "Rotation(k=2)" in card and "| 1 | 1 | rotated 180 degrees |" in card
    assert "global/group<g>/*" in card
    assert dm.fingerprint()["data.client_transform"] == "Rotation(k=2)"
    assert "data.client_transform" not in _data(None).fingerprint()


def test_strategies_read_the_clients_labels_as_it_sees_them():
    dm = _data(LabelPermutation(k=2), num_clients=2)
    c = dm.clients[1]
    strategy = FedGen()
    module = make_module(strategy).client
    strategy.setup(module, num_clients=2)
    ctx = ClientContext(1, 0, {"weights": {}}, {}, c.num_samples, 1, 0.1, data=c)
    counts = strategy.upload(module, ctx)["fedgen"]["counts"]
    expected = torch.bincount(c.train_labels(), minlength=10).float()
    assert torch.equal(counts.cpu(), expected)
    assert not torch.equal(expected, torch.bincount(c.y[c.train_idx], minlength=10).float())


@pytest.mark.parametrize(
    "transform",
    [
        lambda: GaussianNoise(sigma=0.5),
        lambda: Rotation(k=2),
        lambda: LabelPermutation(k=2),
        lambda: LabelNoise(),
    ],
    ids=["noise", "rotation", "permutation", "label_noise"],
)
def test_sequential_and_vectorised_rounds_give_the_same_weights(tmp_path, transform):
    weights = []
    for vectorize in (1, 4):
        module = make_module(FedAvg(), local_steps=None, local_epochs=1, runtime={"vectorize": vectorize})
        trainer = make_trainer(tmp_path / str(vectorize), rounds=2)
        trainer.fit(module, datamodule=make_data(client_transform=transform()))
        weights.append(global_weights(module))
        assert (module.history[-1].vectorised_clients or 0) == (4 if vectorize > 1 else 0)
    for k in weights[0]:
        torch.testing.assert_close(weights[0][k], weights[1][k], rtol=0, atol=1e-5)


def test_vectorised_gather_draws_the_noise_of_the_sequential_batches():
    dm = make_data(client_transform=GaussianNoise(sigma=0.5))
    dm.setup()
    gens = [_gen(i) for i in range(4)]
    idx = [c.train_idx[: 5 + i] for i, c in enumerate(dm.clients)]
    counts = [len(i) for i in idx]
    x, y, weight, _ = vectorized._stacked_batch(idx, counts, dm.clients, gens, None, 0)
    for k, c in enumerate(dm.clients):
        ref_x, ref_y = c.take(idx[k], _gen(k))
        torch.testing.assert_close(x[k, : counts[k]], ref_x)
        assert torch.equal(y[k, : counts[k]], ref_y)
        assert weight[k].sum().item() == counts[k]


@pytest.mark.parametrize("transform", [Rotation, LabelPermutation])
def test_per_group_global_evaluation_logs_each_group_and_their_union(tmp_path, transform):
    module = make_module(FedAvg())
    trainer = make_trainer(tmp_path, rounds=1)
    dm = make_data(client_transform=transform(k=2))
    trainer.fit(module, datamodule=dm)
    metrics = trainer.callback_metrics
    groups = [metrics[f"global/group{g}/acc"].item() for g in range(2)]
    # the union of the groups: equal-size copies of the test set, so the mean of the groups' accuracies
    assert metrics["global/acc"].item() == pytest.approx(sum(groups) / 2, abs=1e-6)
    batches = list(dm.test_dataloader())
    assert [b[2] for b in batches] == [0] * (len(batches) // 2) + [1] * (len(batches) // 2)


def test_noise_evaluates_the_clean_test_set_by_default_and_per_client_on_request(tmp_path):
    dm = make_data(client_transform=GaussianNoise(sigma=0.5))
    dm.setup()
    assert dm.eval_groups == []
    per = make_data(client_transform=GaussianNoise(sigma=0.5, global_test="per_group"))
    per.setup()
    assert per.eval_groups == [0, 1, 2, 3]  # NIID-Bench: every party's noisy copy of the test set
    batches = list(per.test_dataloader())
    assert len(batches) == 4 * len(list(dm.test_dataloader()))
    x0, _, g0 = batches[0]
    assert g0 == 0 and torch.equal(x0, dm.splits.test_x[: len(x0)])  # party 0: no noise
    again = list(per.test_dataloader())
    assert all(torch.equal(a[0], b[0]) for a, b in zip(batches, again))  # the same noisy copy each time


# ------------------------------------------------------------------------- Flower and two processes
ROOT = Path(__file__).resolve().parents[2]
PATH_ARGS = [
    "--trainer.accelerator=cpu",
    "--trainer.enable_progress_bar=false",
    "--data.num_clients=4",
    "--model.local_steps=2",
    "--model.eval_clients_every=0",
    "--data.client_transform=GaussianNoise",
    "--data.client_transform.sigma=0.5",
    "--trainer.max_steps=2",
]


def _last_weights(folder: Path) -> dict[str, torch.Tensor]:
    return torch.load(latest_run(folder) / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


def _flower(folder: Path, config: Path) -> None:
    pytest.importorskip("flwr")
    from flower_helpers import LocalGrid
    from flwr.supercore.task_identity import TaskIdentity

    from fl_lightning.flower import client_app, fit_on_grid

    args = [*PATH_ARGS, f"--trainer.default_root_dir={folder}"]
    with pytest.MonkeyPatch.context() as mp:  # the ids Flower's runtimes set, here the test's
        for attr, value in (("_run_id", 1), ("_task_id", 1), ("_node_id", 0)):
            mp.setattr(TaskIdentity, attr, value)
        fit_on_grid(LocalGrid(client_app(config, args), 4), config, args, wait_for_nodes=1)


def _two_processes(folder: Path, config: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = ["fit", f"--config={config}", *PATH_ARGS, "--trainer.devices=2", FORK]
    proc = run_program([*cmd, f"--trainer.default_root_dir={folder}"], cwd=folder.parent, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("path", ["flower", pytest.param("two_processes", marks=pytest.mark.slow)])
def test_noise_gives_the_same_weights_through_flower_and_two_processes(tmp_path, monkeypatch, path):
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "flower"))
    config = tmp_path / "run.yaml"
    config.write_text("seed_everything: 0\n")
    main(["fit", f"--config={config}", *PATH_ARGS, f"--trainer.default_root_dir={tmp_path / 'one'}"])
    (_flower if path == "flower" else _two_processes)(tmp_path / path, config)
    base, other = _last_weights(tmp_path / "one"), _last_weights(tmp_path / path)
    for k in base:
        torch.testing.assert_close(other[k], base[k], rtol=0, atol=1e-5)


def test_tensorboard_has_the_card_and_the_per_group_scalars(tmp_path):
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = TensorBoardLogger(str(tmp_path), name="tb")
    module = make_module(FedAvg())
    make_trainer(tmp_path, rounds=1, logger=logger).fit(
        module, datamodule=make_data(client_transform=Rotation(k=2))
    )
    events = EventAccumulator(logger.log_dir)
    events.Reload()
    assert "partition/client_transform/text_summary" in events.Tags()["tensors"]
    text = events.Tensors("partition/client_transform/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "Rotation(k=2)" in text and "| 3 | 1 | rotated 180 degrees |" in text
    assert {"global/group0/acc", "global/group1/acc", "global/acc"} <= set(events.Tags()["scalars"])
