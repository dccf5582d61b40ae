import numpy as np
import pytest
import torch
from PIL import Image

from fl_lightning.data import list_datasets, load_dataset
from fl_lightning.errors import ConfigError


def _fake_tiny_imagenet(root, wnids=("n01", "n02", "n03"), per_class=2):
    folder = root / "tiny-imagenet-200"
    rng = np.random.default_rng(0)
    (folder / "val" / "images").mkdir(parents=True)
    (folder / "wnids.txt").write_text("\n".join(wnids) + "\n")
    lines = []
    for i, w in enumerate(wnids):
        images = folder / "train" / w / "images"
        images.mkdir(parents=True)
        for j in range(per_class):
            Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(images / f"{w}_{j}.JPEG")
        Image.fromarray(rng.integers(0, 256, (64, 64), dtype=np.uint8)).save(
            folder / "val" / "images" / f"val_{i}.JPEG"
        )
        lines.append(f"val_{i}.JPEG\t{wnids[-1 - i]}\t0\t0\t63\t63")
    (folder / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")


def test_tiny_imagenet_reads_the_standard_folder(tmp_path):
    assert "TinyImageNet" in list_datasets()
    _fake_tiny_imagenet(tmp_path)
    splits = load_dataset("tiny_imagenet", tmp_path)
    assert splits.num_classes == 3 and splits.task == "multiclass"
    assert splits.train_x.shape == (6, 3, 64, 64) and splits.test_x.shape == (3, 3, 64, 64)  # grey val -> RGB
    assert splits.train_y.tolist() == [0, 0, 1, 1, 2, 2] and splits.test_y.tolist() == [2, 1, 0]
    mean = splits.train_x.mean(dim=(0, 2, 3))
    torch.testing.assert_close(mean, torch.zeros(3), rtol=0, atol=1e-4)  # normalised with train statistics


def test_missing_folder_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="unzip tiny-imagenet-200.zip"):
        load_dataset("tiny_imagenet", tmp_path)
