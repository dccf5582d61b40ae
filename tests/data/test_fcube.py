"""fl_lightning.data.fcube: NIID-Bench's FCUBE (the cube, the label rule, the 4 parties' octants)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fl_lightning.data import FCUBE, IID, FederatedDataModule, NaturalUsers, get_dataset, load_dataset
from fl_lightning.data.fcube import fcube_label
from fl_lightning.errors import ConfigError

from conftest import run_folder


def test_sizes_cube_and_label_rule():
    s = load_dataset("fcube")
    assert (s.name, s.task, s.num_classes, s.input_shape) == ("fcube", "multiclass", 2, (3,))
    assert s.train_x.shape == (4000, 3) and s.test_x.shape == (1000, 3) and s.train_x.dtype == torch.float32
    for x, y in ((s.train_x, s.train_y), (s.test_x, s.test_y)):
        assert x.abs().max() <= 1  # inside the cube [-1, 1]^3
        assert torch.equal(y, torch.where(x[:, 0] > 0, 0, 1))  # label 0 iff x1 > 0, everywhere
    assert s.train_y.bincount().tolist() == [2000, 2000]
    assert (s.test_x < 0).any(dim=0).all() and (s.test_x > 0).any(dim=0).all()  # the whole cube
    assert fcube_label(np.array([[0.1, -1, -1], [-0.1, 1, 1], [0.0, 0, 0]])).tolist() == [0, 1, 1]


def test_each_party_holds_two_opposite_octants_one_per_class():
    s = load_dataset(FCUBE(samples_per_party=200, seed=5))
    assert s.users == ["party_0", "party_1", "party_2", "party_3"] and s.test_users is None
    assert np.bincount(s.train_users).tolist() == [200] * 4
    expected = {0: (1, 1, 1), 1: (1, 1, -1), 2: (1, -1, 1), 3: (1, -1, -1)}  # the class-0 octant
    seen = set()
    for party, octant in expected.items():
        x, y = s.train_x[s.train_users == party], s.train_y[s.train_users == party]
        signs = torch.sign(x).to(torch.int64)
        assert (signs[y == 0] == torch.tensor(octant)).all()
        assert (signs[y == 1] == -torch.tensor(octant)).all()  # the mirror image: the opposite octant
        assert y.tolist() == [0, 1] * 100  # even-numbered points class 0, odd-numbered their mirror
        seen |= {octant, tuple(-v for v in octant)}
    assert len(seen) == 8  # the four parties cover the cube's eight octants


def test_seeded():
    a, b, c = (load_dataset(FCUBE(seed=s)) for s in (1, 1, 2))
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_x, b.test_x)
    assert not torch.equal(a.train_x, c.train_x)
    assert get_dataset("FCUBE").args() == {"samples_per_party": 1000, "test_size": 1000, "seed": 0}
    with pytest.raises(ConfigError, match=r"^data\.dataset\.samples_per_party=7 must be even"):
        FCUBE(samples_per_party=7)


def test_natural_users_four_clients_and_another_partition_says_it_pools_them(caplog):
    dm = FederatedDataModule("fcube", partition=NaturalUsers(), local_test_fraction=0.0)
    dm.setup()
    assert dm.num_clients == 4 and [c.num_samples for c in dm.clients] == [1000] * 4
    for c in dm.clients:
        assert (dm.splits.train_users[c.train_idx.numpy()] == c.client_id).all()
    with caplog.at_level("INFO", logger="fl_lightning"):
        iid = FederatedDataModule(FCUBE(), partition=IID(), num_clients=8)
        iid.setup()
    assert iid.num_clients == 8
    notices = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert notices == [
        "data.dataset='fcube' brings its 4 users, but data.partition=IID pools their 4000 training samples "
        "and re-splits them over 8 clients; set data.partition=NaturalUsers for one client per user"
    ]


def test_fits_from_the_command_line_with_the_linear_model(tmp_path, capsys):
    from fl_lightning.cli import main

    main(
        [
            "fit",
            "--data.dataset=fcube",
            "--data.partition=NaturalUsers",
            "--model.client.net=LogisticRegression",
            "--trainer.max_steps=3",
            "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={tmp_path}",
        ]
    )
    config = (run_folder(tmp_path) / "config.yaml").read_text()
    assert "class_path: fl_lightning.data.FCUBE" in config
    out = capsys.readouterr().out
    assert "rounds: 3" in out and "per-client accuracy, global model (4 clients)" in out
