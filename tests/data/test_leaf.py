"""fl_lightning.data.leaf: LEAF's train/test JSON files (FEMNIST, Shakespeare, Sent140, CelebA, Synthetic),
written by the test in LEAF's exact layout."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from PIL import Image

from fl_lightning.data import FederatedDataModule, Leaf, NaturalUsers, load_dataset
from fl_lightning.data.leaf import guess_kind, sent140_tokens, split_line
from fl_lightning.data.text import LEAF_LETTERS, OOV
from fl_lightning.errors import ConfigError


def write_split(folder, users: dict[str, tuple[list, list]], files: int = 1) -> None:
    """LEAF's layout: ``{"users", "num_samples", "user_data": {u: {"x", "y"}}}``, users spread over files."""
    folder.mkdir(parents=True, exist_ok=True)
    names = list(users)
    for f in range(files):
        mine = names[f::files]
        data = {
            "users": mine,
            "num_samples": [len(users[u][1]) for u in mine],
            "user_data": {u: {"x": users[u][0], "y": users[u][1]} for u in mine},
        }
        (folder / f"all_data_{f}_niid_1_keep_0_{folder.name}_8.json").write_text(json.dumps(data))


def write_leaf(root, train: dict, test: dict, files: int = 1):
    write_split(root / "train", train, files)
    write_split(root / "test", test, files)
    return root


def femnist_user(n: int, rng, label: int) -> tuple[list, list]:
    return [rng.random(784).round(3).tolist() for _ in range(n)], [label] * n


def test_femnist_users_images_and_per_user_test(tmp_path):
    rng = np.random.default_rng(0)
    root = write_leaf(
        tmp_path / "femnist" / "data",
        {"f0": femnist_user(5, rng, 3), "f1": femnist_user(4, rng, 61), "f2": femnist_user(3, rng, 0)},
        {"f0": femnist_user(2, rng, 3), "f1": femnist_user(1, rng, 61), "f2": femnist_user(1, rng, 0)},
        files=2,
    )
    splits = load_dataset("leaf", root)
    assert splits.name == "leaf:femnist" and splits.num_classes == 62 and splits.task == "multiclass"
    assert splits.train_x.shape == (12, 1, 28, 28) and splits.train_x.dtype == torch.float32
    assert abs(splits.train_x.mean().item()) < 1e-5  # normalised with the training statistics
    assert sorted(splits.users) == ["f0", "f1", "f2"]  # files sorted by name: f0, f2 then f1
    assert splits.users == ["f0", "f2", "f1"]
    assert np.bincount(splits.train_users).tolist() == [5, 3, 4]
    assert np.bincount(splits.test_users).tolist() == [2, 1, 1]
    assert splits.train_y[splits.train_users == 2].tolist() == [61] * 4
    dm = FederatedDataModule("leaf", str(root), partition=NaturalUsers())
    dm.setup()
    assert dm.num_clients == 3 and [c.test_idx.numel() for c in dm.clients] == [2, 1, 1]
    assert dm.splits.test_y[dm.clients[2].test_idx].tolist() == [61]


def test_shakespeare_json_uses_leafs_vocabulary(tmp_path):
    text = "To be, or not to be: that is the question: Whether 'tis nobler in the mind to suffer"
    x = [text[i : i + 80] for i in range(3)]
    y = [text[80], text[81], "é"]
    root = write_leaf(tmp_path, {"HAMLET": (x, y)}, {"HAMLET": ([text[3:83]], [text[83]])})
    splits = load_dataset("leaf", root)
    assert splits.name == "leaf:shakespeare" and splits.num_classes == splits.vocab_size == 80
    assert splits.train_x.shape == (3, 80) and splits.train_x.dtype == torch.uint8
    assert "".join(LEAF_LETTERS[i] for i in splits.train_x[0]) == x[0]
    assert splits.train_y.tolist() == [LEAF_LETTERS.index(text[80]), LEAF_LETTERS.index(text[81]), OOV]


def test_sent140_tokens_bag_of_words_vocabulary(tmp_path):
    assert split_line("I can't wait!! ok.") == ["I", "can't", "wait", "!", "!", "ok", "."]
    train_ids, test_ids = sent140_tokens(["a b b c", "b c d"], ["b z"], vocab_size=2, max_words=3)
    # most frequent: b (3), c (2); a and d are out of the vocabulary (id 2, as the padding)
    assert train_ids.tolist() == [[2, 0, 0], [0, 1, 2]] and test_ids.tolist() == [[0, 2, 2]]
    tweet = ["1467810369", "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", "user", "so happy today"]
    root = write_leaf(
        tmp_path,
        {"u1": ([tweet, [*tweet[:4], "sad sad day"]], [1, 0]), "u2": ([[*tweet[:4], "happy"]], [1])},
        {"u1": ([[*tweet[:4], "happy day"]], [1]), "u2": ([[*tweet[:4], "sad"]], [0])},
    )
    splits = load_dataset(Leaf(vocab_size=4, max_words=5), root)
    assert splits.name == "leaf:sent140" and splits.num_classes == 2 and splits.vocab_size == 5
    assert splits.train_x.shape == (3, 5) and splits.train_x.dtype == torch.int64
    assert splits.train_x.max().item() == 4  # unknown words and padding


def test_celeba_reads_leafs_raw_images(tmp_path):
    images = tmp_path / "raw" / "img_align_celeba"
    images.mkdir(parents=True)
    for i in range(4):
        Image.fromarray(np.full((20, 16, 3), 60 * i, dtype=np.uint8)).save(images / f"{i:06d}.jpg")
    root = write_leaf(
        tmp_path,
        {"c1": (["000000.jpg", "000001.jpg"], [0.0, 1.0])},
        {"c1": (["000002.jpg", "000003.jpg"], [1, 0])},
    )
    splits = load_dataset(Leaf(image_size=8), root)
    assert splits.name == "leaf:celeba" and splits.num_classes == 2
    assert splits.train_x.shape == (2, 3, 8, 8) and splits.test_y.tolist() == [1, 0]
    missing = write_leaf(tmp_path / "other", {"c1": (["0.jpg"], [1])}, {"c1": (["1.jpg"], [0])})
    with pytest.raises(
        ConfigError, match=r"^data\.dataset\.image_root: no CelebA image folder .*img_align_celeba"
    ):
        load_dataset("leaf", missing)


def test_synthetic_vectors_and_a_by_user_split(tmp_path):
    rng = np.random.default_rng(0)

    def user(n, label):
        return rng.normal(size=(n, 60)).tolist(), [label] * n

    root = write_leaf(tmp_path, {"a": user(4, 0), "b": user(3, 4)}, {"c": user(2, 2)})
    splits = load_dataset("leaf", root)
    assert splits.name == "leaf:synthetic" and splits.num_classes == 5
    assert splits.train_x.shape == (7, 60) and splits.test_x.shape == (2, 60)
    assert splits.users == ["a", "b"] and splits.test_users is None  # the test users are others
    dm = FederatedDataModule("leaf", str(root), partition=NaturalUsers(), local_test_fraction=0.25)
    dm.setup()
    assert [c.num_samples + c.test_idx.numel() for c in dm.clients] == [4, 3]
    assert dm.clients[0].test_x is None  # local test split carved from its training data


def test_guess_kind():
    assert guess_kind([0.5] * 784) == "femnist"
    assert guess_kind([0.5] * 60) == "synthetic"
    assert guess_kind("x" * 80) == "shakespeare"
    assert guess_kind("000001.jpg") == "celeba"
    assert guess_kind(["1", "d", "q", "u", "t"]) == "sent140"
    with pytest.raises(ConfigError, match="set data.dataset.name"):
        guess_kind({"a": 1})


# ---------------------------------------------------------------------------------------- bad files
def _one_line(build) -> str:
    with pytest.raises(ConfigError) as info:
        build()
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_a_missing_folder_is_one_line(tmp_path):
    msg = _one_line(lambda: load_dataset("leaf", tmp_path / "nowhere"))
    assert msg.startswith(f"data.root='{tmp_path / 'nowhere'}' is not a LEAF data folder")
    (tmp_path / "train").mkdir()
    assert "train has no .json files" in _one_line(lambda: load_dataset("leaf", tmp_path))


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("{not json", r"is not valid JSON \(line 1, column 2"),
        ("[1, 2]", "holds a JSON list"),
        (json.dumps({"users": ["u"], "num_samples": [1]}), "has no 'user_data'"),
        (json.dumps({"users": "u", "user_data": {}}), "has a str as 'users'"),
        (json.dumps({"users": ["u"], "user_data": {}}), r"user_data\['u'\] needs 'x' and 'y'"),
        (json.dumps({"users": ["u"], "user_data": {"u": {"x": [[1.0]], "y": []}}}), "has 1 'x' but 0 'y'"),
        (
            json.dumps({"users": ["u"], "user_data": {"u": {"x": [[1.0]], "y": ["cat"]}}}),
            "not a class number",
        ),
    ],
)
def test_a_malformed_file_names_its_path_and_key(tmp_path, content, says):
    rng = np.random.default_rng(0)
    root = write_leaf(tmp_path, {"u": femnist_user(2, rng, 1)}, {"u": femnist_user(1, rng, 1)})
    bad = next((root / "test").glob("*.json"))
    bad.write_text(content)
    msg = _one_line(lambda: load_dataset(Leaf(name="synthetic"), root))
    assert msg.startswith(f"data.root: {bad}") and re.search(says, msg), msg


def test_download_is_refused(tmp_path):
    assert "data.download=true is not supported" in _one_line(lambda: load_dataset("leaf", tmp_path, True))


# ------------------------------------------------------------------------------------------ nothing silent
def test_a_user_without_test_data_is_left_out_of_client_evaluation_with_one_line(tmp_path, caplog):
    rng = np.random.default_rng(0)
    root = write_leaf(
        tmp_path,
        {"f0": femnist_user(5, rng, 3), "f1": femnist_user(4, rng, 7), "f2": femnist_user(3, rng, 0)},
        {"f0": femnist_user(2, rng, 3), "f2": femnist_user(1, rng, 0)},  # f1 has no test data
    )
    with caplog.at_level("INFO", logger="fl_lightning"):
        dm = FederatedDataModule("leaf", str(root), partition=NaturalUsers())
        dm.setup()
    notices = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert notices == [
        "leaf: 1 of the 3 training users have no test data: they are left out of client evaluation "
        "(personal/*, z_client/*), not scored on their training data"
    ]
    assert dm.splits.test_users is not None  # the others keep their own test data
    f1 = dm.clients[dm.splits.users.index("f1")]
    assert not f1.evaluable and f1.test_idx.numel() == 0 and list(f1.eval_batches(100)) == []
    assert dm.eval_clients == [c.client_id for c in dm.clients if c is not f1]
    f0 = dm.clients[dm.splits.users.index("f0")]
    assert f0.evaluable and sum(len(y) for _, y in f0.eval_batches(100)) == 2


def test_a_user_only_in_the_test_files_stays_in_the_global_test_set_with_one_line(tmp_path, caplog):
    rng = np.random.default_rng(1)
    root = write_leaf(
        tmp_path,
        {"f0": femnist_user(5, rng, 3), "f1": femnist_user(4, rng, 7)},
        {"f0": femnist_user(2, rng, 3), "f1": femnist_user(1, rng, 7), "x9": femnist_user(3, rng, 1)},
    )
    with caplog.at_level("INFO", logger="fl_lightning"):
        dm = FederatedDataModule("leaf", str(root), partition=NaturalUsers())
        dm.setup()
    notices = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(notices) == 1 and notices[0].startswith(
        "leaf: 1 user(s) appear only in the test files (3 samples, e.g. 'x9'): their samples stay in the "
        "global test set and belong to no client"
    )
    # not the by-user mode: every client's local test split is still its user's own test data
    assert dm.splits.test_users.tolist() == [0, 0, 1, -1, -1, -1]
    assert [c.test_idx.tolist() for c in dm.clients] == [[0, 1], [2]]
    assert all(c.test_x is dm.splits.test_x for c in dm.clients)
    assert [c.num_samples for c in dm.clients] == [5, 4]  # no training data lost to a local split
    assert len(dm.splits.test_y) == 6  # the test-only user's samples are in the global test set


def test_leafs_by_user_split_says_where_the_local_test_splits_come_from(tmp_path, caplog):
    rng = np.random.default_rng(2)
    root = write_leaf(tmp_path, {"f0": femnist_user(4, rng, 3)}, {"t0": femnist_user(2, rng, 3)})
    with caplog.at_level("INFO", logger="fl_lightning"):
        splits = load_dataset("leaf", root)
    assert splits.test_users is None
    notices = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert notices == [
        "leaf: none of the 1 test users is a training user (LEAF's by-user split): the test files are the "
        "global test set only, and each client's local test split is data.local_test_fraction of its "
        "training data"
    ]
