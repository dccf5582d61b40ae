"""FLAIR: the release's HDF5 layout, natural per-user clients, caches, multilabel training end to end."""

import json

import h5py
import numpy as np
import pytest
import torch

import fl_lightning.data.flair as flair
from fl_lightning.api.client import ClientModule
from fl_lightning.data import FederatedDataModule, load_dataset
from fl_lightning.data.flair import (
    FLAIR_LABELS,
    NaturalUsers,
    encode_labels,
    prepare_flair_cache,
    read_split,
    write_digits_as_flair,
)
from fl_lightning.engine.record import RoundRecord
from fl_lightning.errors import ConfigError
from fl_lightning.lightning.module import FederatedModule
from fl_lightning.models import SmallCNN
from fl_lightning.strategies import FedAvg, FedCOG

# (user, split) -> label strings of its images; images are filled with a value identifying them
USERS = {
    ("u1", "train"): ["animal|plant", "structure", ""],
    ("u0", "train"): ["food|liquid|material", "outdoor"],
    ("u2", "train"): ["art", "fire|light", "music", "games"],
    ("t0", "test"): ["religion|celebration", "recreation"],
    ("t1", "test"): ["equipment|interior_room"],
    ("v0", "val"): ["animal"],
}


def write_release_file(path, size=8):
    """A tiny file written with plain h5py exactly as apple/ml-flair's prepare_dataset.py does."""
    with h5py.File(path, "w") as h5:
        value = 0
        for (user, split), labels in USERS.items():
            images = np.zeros((len(labels), size, size, 3), dtype=np.uint8)
            for i in range(len(labels)):
                images[i] = value
                value += 10
            h5[f"/{split}/{user}/labels"] = np.asarray(labels, dtype="S")
            h5[f"/{split}/{user}/fine_grained_labels"] = np.asarray(["x"] * len(labels), dtype="S")
            h5[f"/{split}/{user}/image_ids"] = np.asarray(
                [f"{user}{i}" for i in range(len(labels))], dtype="S"
            )
            h5.create_dataset(f"/{split}/{user}/images", data=images)
        h5["/metadata/label_counter"] = json.dumps({"animal": 2})
    return path


def test_labels_are_the_sorted_coarse_names():
    assert len(FLAIR_LABELS) == 17 and list(FLAIR_LABELS) == sorted(FLAIR_LABELS)
    y = encode_labels([b"structure|animal", b""])
    assert y[0].nonzero()[0].tolist() == [0, 16] and y[1].sum() == 0
    with pytest.raises(ConfigError, match="coarse"):
        encode_labels([b"cat"])


def test_reader_orders_users_by_id_and_keeps_image_order(tmp_path):
    path = write_release_file(tmp_path / "flair.hdf5")
    part = read_split(path, "train")
    assert part.users == ["u0", "u1", "u2"] and part.owner.tolist() == [0, 0, 1, 1, 1, 2, 2, 2, 2]
    assert part.images.shape == (9, 8, 8, 3)
    # u0 was written second: its images hold 30 and 40
    assert part.images[:2, 0, 0, 0].tolist() == [30, 40] and part.images[2, 0, 0, 0] == 0
    names = lambda row: {FLAIR_LABELS[i] for i in np.flatnonzero(row)}  # noqa: E731
    assert names(part.labels[0]) == {"food", "liquid", "material"} and names(part.labels[4]) == set()


def test_flair_dataset_loads_train_and_test_as_multilabel(tmp_path):
    path = write_release_file(tmp_path / "flair_federated.hdf5")
    by_folder = load_dataset("flair", tmp_path)  # a folder: its flair_federated.hdf5 is read ...
    splits = load_dataset("flair", path)  # ... or the file itself
    assert torch.equal(by_folder.train_x, splits.train_x)
    assert splits.task == "multilabel" and splits.num_classes == 17
    assert splits.train_x.shape == (9, 3, 8, 8) and splits.test_x.shape == (3, 3, 8, 8)
    assert splits.train_y.shape == (9, 17) and int(splits.test_y.sum()) == 5
    torch.testing.assert_close(splits.train_x.mean(dim=(0, 2, 3)), torch.zeros(3), rtol=0, atol=1e-5)


def test_missing_file_and_missing_h5py_are_config_errors(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="data.root"):
        load_dataset("flair", tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="download"):
        load_dataset("flair", tmp_path, download=True)
    monkeypatch.setattr(flair, "_H5PY", False)
    path = write_release_file(tmp_path / "flair.hdf5")
    with pytest.raises(ConfigError, match="h5py"):
        load_dataset("flair", path)


def _break(path, how):
    """Damage a release-format file the way a bad conversion or copy would."""
    if how == "truncated":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 3])
        return
    if how == "not_hdf5":
        path.write_bytes(b"not an HDF5 file at all\n" * 100)
        return
    with h5py.File(path, "a") as h5:
        if how == "no_images":
            del h5["/train/u1/images"]
        elif how == "no_labels":
            del h5["/train/u1/labels"]
        elif how == "float_images":
            del h5["/train/u1/images"]
            h5["/train/u1/images"] = np.zeros((3, 8, 8, 3), dtype=np.float32)
        elif how == "gray_images":
            del h5["/train/u1/images"]
            h5["/train/u1/images"] = np.zeros((3, 8, 8), dtype=np.uint8)
        elif how == "label_count":
            del h5["/train/u1/labels"]
            h5["/train/u1/labels"] = np.asarray(["animal"], dtype="S")
        elif how == "numeric_labels":
            del h5["/train/u1/labels"]
            h5["/train/u1/labels"] = np.zeros(3, dtype=np.int64)
        elif how == "user_is_dataset":
            del h5["/train/u1"]
            h5["/train/u1"] = np.zeros(3)
        elif how == "image_size":
            del h5["/train/u1/images"]
            h5["/train/u1/images"] = np.zeros((3, 4, 4, 3), dtype=np.uint8)
        elif how == "no_test_split":
            del h5["/test"]


@pytest.mark.parametrize(
    ("how", "says"),
    [
        ("truncated", "cannot read the FLAIR file .* as HDF5"),
        ("not_hdf5", "cannot read the FLAIR file .* as HDF5"),
        ("no_images", "/train/u1 has no 'images' dataset"),
        ("no_labels", "/train/u1 has no 'labels' dataset"),
        ("float_images", r"/train/u1/images is float32 \[3, 8, 8, 3\], expected uint8 \[n, H, W, 3\]"),
        ("gray_images", r"/train/u1/images is uint8 \[3, 8, 8\], expected uint8 \[n, H, W, 3\]"),
        ("label_count", r"/train/u1/labels is \|S6 \[1\], expected 3 label strings"),
        ("numeric_labels", r"/train/u1/labels is int64 \[3\], expected 3 label strings"),
        ("user_is_dataset", "/train/u1 is not a group"),
        ("image_size", r"/train/u1/images are \[4, 4, 3\] but earlier users' are \[8, 8, 3\]"),
        ("no_test_split", "has no 'test' split"),
    ],
)
def test_a_malformed_file_is_a_one_line_config_error_naming_it(tmp_path, how, says):
    path = write_release_file(tmp_path / "flair.hdf5")
    _break(path, how)
    with pytest.raises(ConfigError, match=says) as info:
        load_dataset("flair", path)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("data.root: ") and str(path) in msg


@pytest.mark.parametrize("how", ["not_hdf5", "no_images"])
def test_a_malformed_file_is_a_config_error_for_natural_users_and_the_cache(tmp_path, how):
    path = write_release_file(tmp_path / "flair.hdf5")
    _break(path, how)
    with pytest.raises(ConfigError, match=f"^data.partition.path: .*{path}"):
        NaturalUsers(str(path))(np.zeros(9), 3, np.random.default_rng(0))
    with pytest.raises(ConfigError, match=f"^src: .*{path}"):
        prepare_flair_cache(path, tmp_path / "out.hdf5", num_users=2)


def test_natural_users_gives_one_client_per_user(tmp_path):
    path = write_release_file(tmp_path / "flair.hdf5")
    labels = np.zeros(9, dtype=np.int64)
    parts = NaturalUsers(str(path))(labels, 3, np.random.default_rng(0))
    assert [p.tolist() for p in parts] == [[0, 1], [2, 3, 4], [5, 6, 7, 8]]
    two = NaturalUsers(str(path))(labels, 2, np.random.default_rng(0))
    assert len(two) == 2 and all(p.tolist() in ([0, 1], [2, 3, 4], [5, 6, 7, 8]) for p in two)
    with pytest.raises(ConfigError, match="data.num_clients"):
        NaturalUsers(str(path))(labels, 4, np.random.default_rng(0))
    with pytest.raises(ConfigError, match="data.partition.path"):
        NaturalUsers(str(path))(np.zeros(5), 2, np.random.default_rng(0))


def test_datamodule_with_natural_users(tmp_path):
    path = write_release_file(tmp_path / "flair.hdf5")
    dm = FederatedDataModule("flair", str(path), num_clients=3, partition=NaturalUsers(str(path)))
    dm.setup()
    assert [c.num_samples + c.test_idx.numel() for c in dm.clients] == [2, 3, 4]
    assert dm.counts.shape == (3, 17) and dm.task == "multilabel"


def test_cache_samples_users_resizes_and_caps(tmp_path):
    src = write_release_file(tmp_path / "flair.hdf5", size=16)
    counts = prepare_flair_cache(
        src, tmp_path / "cache.hdf5", num_users=2, image_size=4, max_images_per_user=3
    )
    train = read_split(tmp_path / "cache.hdf5", "train")
    assert len(train.users) == 2 and counts["train_users"] == 2 and counts["test_images"] == 3
    assert train.images.shape[1:] == (4, 4, 3) and max(np.bincount(train.owner)) <= 3
    original = read_split(src, "train")
    for u in train.users:  # labels travel with their images
        mine, theirs = (
            train.labels[train.owner == train.users.index(u)],
            original.labels[original.owner == original.users.index(u)],
        )
        assert np.array_equal(mine, theirs[: len(mine)])


def test_flair_format_federation_trains_with_multilabel_metrics_in_tensorboard(tmp_path, fit):
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    path = tmp_path / "digits_flair.hdf5"
    write_digits_as_flair(path, num_users=6, num_test_users=2, image_size=8)
    dm = FederatedDataModule(
        "flair", str(path), num_clients=6, partition=NaturalUsers(str(path)), batch_size=16
    )
    torch.manual_seed(0)
    client = ClientModule(SmallCNN(3, 17, width=4, hidden=16), task="multilabel", lr=0.5, momentum=0.0)
    strategy = FedCOG(FedAvg(), start_round=1, num_generated=16, gen_steps=2, weighting="balanced")
    module = FederatedModule(client, strategy, clients_per_round=3, local_steps=3)
    logger = TensorBoardLogger(str(tmp_path), name="tb")
    fit(module, data=dm, rounds=2, logger=logger)
    events = EventAccumulator(logger.log_dir)
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for key in ("c_precision", "c_recall", "c_f1", "o_f1", "map_macro"):
        assert f"global/{key}" in tags and f"personal/{key}" in tags
    assert {f"z_client/{c}/c_f1" for c in range(6)} <= tags
    assert module.history[-1].clients == 3


def test_summary_of_a_multilabel_run_reports_o_f1():
    from fl_lightning.callbacks import summarize

    history = [
        RoundRecord(r, 2, 0, 10, 10, 1.0, metrics={"global/o_f1": f, "global/c_f1": 0.1})
        for r, f in enumerate([0.2, 0.5, 0.4])
    ]
    s = summarize(history, {0: {"o_f1": 0.3}, 1: {"o_f1": 0.5}}, 3.0)
    assert s["metric"] == "o_f1" and "final_global_acc" not in s
    assert (s["final_global_o_f1"], s["best_global_o_f1"], s["best_round"]) == (0.4, 0.5, 2)
    assert s["client_o_f1"]["n"] == 2 and s["client_o_f1"]["mean"] == pytest.approx(0.4)
