"""Tests of fl_lightning.data.local_files: a node's own data folder, on tiny files in each documented layout
(an array file, the idx files of (Fashion-)MNIST, an image-folder tree), its own local test split, and the
one-line errors of a folder that is missing, unreadable or holds none of the layouts."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fl_lightning.data.local_files import read_node_files
from fl_lightning.errors import ConfigError


def write_idx(path: Path, array: np.ndarray, compress: bool = False) -> None:
    """``array`` (uint8) as an IDX file of unsigned bytes, gzip-compressed if ``compress``."""
    head = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    data = head + np.ascontiguousarray(array, dtype=np.uint8).tobytes()
    path.write_bytes(gzip.compress(data) if compress else data)


def write_png(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


def one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg and "Traceback" not in msg, msg
    return msg


# ------------------------------------------------------------------------------------------ layouts
def test_an_array_file_with_its_own_test_split(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (6, 1, 4, 4), dtype=np.uint8)
    np.savez(tmp_path / "data.npz", x=x, y=np.arange(6) % 3, x_test=x[:2], y_test=np.array([2, 0]))
    files = read_node_files(tmp_path)
    assert files.layout == "npz" and files.num_samples == 6
    assert files.x.dtype == torch.float32 and torch.allclose(files.x, torch.from_numpy(x).float() / 255)
    assert files.y.tolist() == [0, 1, 2, 0, 1, 2] and files.test_y.tolist() == [2, 0]
    train_idx, test_idx = files.split(0.5, (0, 0))  # the files' test split: nothing held out of x
    assert train_idx.tolist() == list(range(6)) and test_idx.tolist() == [0, 1]


def test_float_inputs_are_used_as_stored_then_normalised(tmp_path):
    x = np.linspace(0, 1, 12, dtype=np.float32).reshape(3, 4)
    np.savez(tmp_path / "data.npz", x=x, y=np.array([0.0, 1.0, 1.0]))  # integral float labels are taken
    files = read_node_files(tmp_path, normalize=(0.5, 0.25))
    assert torch.allclose(files.x, (torch.from_numpy(x) - 0.5) / 0.25)
    assert files.y.dtype == torch.int64 and files.y.tolist() == [0, 1, 1]


def test_multilabel_targets_are_kept_as_floats(tmp_path):
    y = np.array([[1, 0, 1], [0, 1, 0]], dtype=np.uint8)
    np.savez(tmp_path / "d.npz", x=np.zeros((2, 5), np.float32), y=y)
    files = read_node_files(tmp_path)
    assert files.y.dtype == torch.float32 and files.y.tolist() == y.tolist()


def test_without_test_files_a_seeded_fraction_is_the_local_test_split(tmp_path):
    np.savez(tmp_path / "data.npz", x=np.zeros((10, 2), np.float32), y=np.arange(10) % 2)
    files = read_node_files(tmp_path)
    assert files.test_x is None
    train_idx, test_idx = files.split(0.3, (7, 1))
    assert len(test_idx) == 3 and len(train_idx) == 7
    assert sorted(train_idx.tolist() + test_idx.tolist()) == list(range(10))
    again = files.split(0.3, (7, 1))
    assert torch.equal(again[1], test_idx)  # the same seed, the same split
    others = {tuple(files.split(0.3, (7, c))[1].tolist()) for c in range(2, 8)}
    assert len(others) > 1  # the seed (data.seed, client id) draws it
    assert files.split(1.0, (0, 0))[0].numel() == 1  # at least one training sample is kept


@pytest.mark.parametrize("compress", [False, True])
def test_mnist_idx_files_with_the_t10k_files_as_test_split(tmp_path, compress):
    suffix = ".gz" if compress else ""
    images = np.arange(5 * 3 * 3, dtype=np.uint8).reshape(5, 3, 3)
    write_idx(tmp_path / f"train-images-idx3-ubyte{suffix}", images, compress)
    write_idx(tmp_path / f"train-labels-idx1-ubyte{suffix}", np.array([0, 9, 3, 3, 1], np.uint8), compress)
    write_idx(tmp_path / "t10k-images-idx3-ubyte", images[:2])  # one compressed, one not: both read
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.array([4, 5], np.uint8), True)
    files = read_node_files(tmp_path)
    assert files.layout == "idx"
    assert files.x.shape == (5, 1, 3, 3) and torch.allclose(files.x[:, 0], torch.from_numpy(images) / 255)
    assert files.y.tolist() == [0, 9, 3, 3, 1]
    assert files.test_x.shape == (2, 1, 3, 3) and files.test_y.tolist() == [4, 5]


def test_idx_files_without_test_files_hold_out_a_fraction(tmp_path):
    write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros((4, 2, 2), np.uint8))
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(4, np.uint8))
    files = read_node_files(tmp_path)
    assert files.test_x is None and len(files.split(0.25, (0, 0))[1]) == 1


def test_an_image_folder_tree_with_train_and_test_and_named_classes(tmp_path):
    rgb = np.full((4, 5, 3), 255, np.uint8)
    write_png(tmp_path / "train" / "cat" / "a.png", rgb)
    write_png(tmp_path / "train" / "cat" / "b.png", rgb // 2)
    write_png(tmp_path / "train" / "dog" / "c.png", np.zeros_like(rgb))
    write_png(tmp_path / "test" / "dog" / "d.png", rgb)
    (tmp_path / "train" / "dog" / "notes.txt").write_text("not an image: ignored")
    files = read_node_files(tmp_path, classes=["bird", "cat", "dog"])  # this node lacks "bird"
    assert files.layout == "image-folder"
    assert files.x.shape == (3, 3, 4, 5)  # [N, C, H, W]
    assert files.y.tolist() == [1, 1, 2] and files.test_y.tolist() == [2]
    assert files.x[0].max() == 1.0 and files.x[2].max() == 0.0


def test_an_image_folder_tree_of_numbered_classes_directly_in_the_folder(tmp_path):
    write_png(tmp_path / "0" / "a.png", np.zeros((3, 3), np.uint8))  # grayscale: one channel
    write_png(tmp_path / "7" / "b.png", np.full((3, 3), 51, np.uint8))
    files = read_node_files(tmp_path)
    assert files.x.shape == (2, 1, 3, 3) and files.y.tolist() == [0, 7] and files.test_x is None
    assert torch.allclose(files.x[1], torch.full((1, 3, 3), 0.2))


# ------------------------------------------------------------------------------------------- errors
def test_a_missing_folder_is_one_line_naming_it(tmp_path):
    with pytest.raises(ConfigError) as err:
        read_node_files(tmp_path / "nowhere")
    assert one_line(err).startswith(f"data-dir '{tmp_path / 'nowhere'}': does not exist; give the SuperNode")


def test_a_file_in_place_of_the_folder_is_one_line(tmp_path):
    (tmp_path / "data.npz").write_bytes(b"")
    with pytest.raises(ConfigError, match="is a file, not a folder") as err:
        read_node_files(tmp_path / "data.npz")
    one_line(err)


def test_an_unreadable_folder_is_one_line(tmp_path, monkeypatch):
    folder = tmp_path / "locked"
    folder.mkdir()
    real = Path.iterdir

    def denied(self):  # chmod 0 does not stop root, who may run these tests
        if self == folder:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "iterdir", denied)
    with pytest.raises(ConfigError, match="cannot be read \\(Permission denied\\)") as err:
        read_node_files(folder)
    assert "let the SuperNode's user read it" in one_line(err)


def test_a_folder_of_none_of_the_layouts_names_them(tmp_path):
    (tmp_path / "readme.txt").write_text("hello")
    with pytest.raises(ConfigError) as err:
        read_node_files(tmp_path)
    msg = one_line(err)
    assert "holds none of the data layouts" in msg and ".npz" in msg and "idx" in msg and "<class>" in msg


@pytest.mark.parametrize(
    ("arrays", "expected"),
    [
        ({"x": np.zeros((2, 2)), "labels": np.zeros(2)}, "no array 'y'"),
        ({"x": np.zeros((3, 2)), "y": np.zeros(2, int)}, "3 inputs x but 2 labels y"),
        ({"x": np.zeros((2, 2)), "y": np.zeros(2, int), "x_test": np.zeros((1, 2))}, "x_test without"),
        ({"x": np.zeros((2, 2)), "y": np.array([0.5, 1.0])}, "labels of type float64"),
        ({"x": np.zeros((0, 2)), "y": np.zeros(0, int)}, "no samples"),
    ],
)
def test_a_bad_array_file_is_one_line(tmp_path, arrays, expected):
    np.savez(tmp_path / "data.npz", **arrays)
    with pytest.raises(ConfigError, match=expected) as err:
        read_node_files(tmp_path)
    assert str(tmp_path / "data.npz") in one_line(err)


def test_an_unreadable_array_file_is_one_line(tmp_path):
    (tmp_path / "data.npz").write_bytes(b"not a zip archive")
    with pytest.raises(ConfigError, match="cannot read it") as err:
        read_node_files(tmp_path)
    assert "replace it with a numpy.savez file" in one_line(err)


def test_two_array_files_are_one_line(tmp_path):
    for name in ("a.npz", "b.npz"):
        np.savez(tmp_path / name, x=np.zeros((1, 1)), y=np.zeros(1, int))
    with pytest.raises(ConfigError, match="2 .npz files") as err:
        read_node_files(tmp_path)
    one_line(err)


def test_bad_idx_files_are_one_line(tmp_path):
    write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros((4, 2, 2), np.uint8))
    with pytest.raises(ConfigError, match="train-labels-idx1-ubyte\\(.gz\\) is missing") as err:
        read_node_files(tmp_path)
    one_line(err)
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(b"\0\0\x08\x01\0\0\0\x09abc")  # 3 of 9 labels
    with pytest.raises(ConfigError, match="cannot read it \\(truncated") as err:
        read_node_files(tmp_path)
    assert "train-labels-idx1-ubyte" in one_line(err)
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(3, np.uint8))
    with pytest.raises(ConfigError, match="4 images but train-labels-idx1-ubyte has 3 labels") as err:
        read_node_files(tmp_path)
    one_line(err)


def test_bad_image_folders_are_one_line(tmp_path):
    write_png(tmp_path / "0" / "a.png", np.zeros((3, 3), np.uint8))
    (tmp_path / "0" / "b.png").write_bytes(b"not a png")
    with pytest.raises(ConfigError, match="cannot read the image") as err:
        read_node_files(tmp_path)
    assert str(tmp_path / "0" / "b.png") in one_line(err)
    write_png(tmp_path / "0" / "b.png", np.zeros((4, 4), np.uint8))
    with pytest.raises(ConfigError, match="an image of shape \\[1, 4, 4\\] among images of \\[1, 3, 3\\]"):
        read_node_files(tmp_path)
    (tmp_path / "0" / "b.png").unlink()
    write_png(tmp_path / "cats" / "c.png", np.zeros((3, 3), np.uint8))
    with pytest.raises(ConfigError, match="class folder 'cats' is not a label number") as err:
        read_node_files(tmp_path)
    assert "data-classes" in one_line(err)
    with pytest.raises(ConfigError, match="class folder '0' is not one of the classes"):
        read_node_files(tmp_path, classes=["cats", "dogs"])
