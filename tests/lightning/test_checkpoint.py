"""fl_lightning.lightning.checkpoint: atomic writes, last.ckpt each round, weights_only loads, resumes."""

import errno
import logging
import os
import signal
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from fl_lightning.errors import ConfigError
from fl_lightning.lightning.checkpoint import (
    LAUNCHER_WEIGHTS,
    AtomicCheckpointIO,
    LastRoundCheckpoint,
    hyperparameters,
    load_checkpoint_file,
)
from fl_lightning.strategies import FedAvg, FedProx, Scaffold, get_strategy, list_strategies

from conftest import global_weights, make_data, make_module, make_trainer

DEAD_PID = 2**31 - 2  # above any pid_max: no such process


def _ckpt(value: float) -> dict:
    return {"state_dict": {"w": torch.full((3,), value)}, "global_step": int(value)}


def _fit(tmp_path, module, rounds: int, ckpt_path=None, **kw):
    """Fit ``rounds`` rounds writing checkpoints as the CLI does (atomic IO, LastRoundCheckpoint)."""
    kw.setdefault("callbacks", [LastRoundCheckpoint(dirpath=tmp_path / "ckpts")])
    kw.setdefault("plugins", [AtomicCheckpointIO()])
    trainer = make_trainer(tmp_path, rounds=rounds, enable_checkpointing=True, **kw)
    trainer.fit(module, datamodule=make_data(), ckpt_path=ckpt_path)
    return trainer


# ---------------------------------------------------------------------------------- atomic writes
def test_a_save_round_trips_and_leaves_no_temporary_file(tmp_path):
    io = AtomicCheckpointIO()
    path = tmp_path / "sub" / "x.ckpt"
    io.save_checkpoint(_ckpt(1.0), path)
    io.save_checkpoint(_ckpt(2.0), path)  # replaces
    assert [p.name for p in path.parent.iterdir()] == ["x.ckpt"]
    loaded = io.load_checkpoint(path)
    assert torch.equal(loaded["state_dict"]["w"], torch.full((3,), 2.0)) and loaded["global_step"] == 2


def test_a_save_that_fails_midway_keeps_the_previous_file_and_no_temporary(tmp_path, monkeypatch):
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint(_ckpt(1.0), path)
    before = path.read_bytes()
    written_to = []

    def disk_full(obj, f, *args, **kwargs):
        written_to.append(Path(f.name))
        f.write(b"PK\x03\x04 partial bytes")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(OSError, match="No space left"):
        io.save_checkpoint(_ckpt(2.0), path)
    # the bytes went to a temporary file in the destination folder (rename is atomic only there)
    assert written_to == [tmp_path / f".last.ckpt.tmp-{os.getpid()}"]
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C during the write: same
        monkeypatch.setattr(torch, "save", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
        io.save_checkpoint(_ckpt(3.0), tmp_path / "new.ckpt")
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def test_a_killed_write_keeps_the_previous_file_and_its_temporary_is_removed_by_the_next_save(tmp_path):
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint(_ckpt(1.0), path)
    before = path.read_bytes()

    def killed(obj, f, *a, **k):
        f.write(b"PK partial")
        f.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    # a process killed while writing: forked from this one (a new Python importing torch, Lightning and
    # fl_lightning cost 14 s of CPU here); its torch.save writes part of the file, then it is killed
    pid = os.fork()
    if pid == 0:
        try:
            torch.save = killed  # in the forked process only
            AtomicCheckpointIO().save_checkpoint({"state_dict": {}}, path)
        finally:
            os._exit(1)  # never back into pytest: not reached when the write was killed
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
    assert path.read_bytes() == before
    (leftover,) = [p for p in tmp_path.iterdir() if p.name != "last.ckpt"]
    assert leftover.name == f".last.ckpt.tmp-{pid}"
    live = tmp_path / f".other.ckpt.tmp-{os.getppid()}"  # a write in progress in a live process
    live.write_bytes(b"")
    (tmp_path / f".x.ckpt.tmp-{DEAD_PID}").write_bytes(b"")
    io.save_checkpoint(_ckpt(2.0), path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["last.ckpt", live.name])
    assert io.load_checkpoint(path)["global_step"] == 2


# ---------------------------------------------------------------------------------- last.ckpt
def test_last_ckpt_is_the_last_round_even_when_a_monitored_checkpoint_saves_less_often(tmp_path):
    # round/clients is constant, so the monitored checkpoint only saves round 1 (never improves)
    best = ModelCheckpoint(dirpath=tmp_path / "best", monitor="round/clients", mode="max", save_last=True)
    last = LastRoundCheckpoint(dirpath=tmp_path / "ckpts")
    _fit(tmp_path, make_module(), rounds=3, callbacks=[best, last])
    assert torch.load(tmp_path / "best" / "last.ckpt", weights_only=True)["global_step"] == 1  # Lightning 2.6
    assert torch.load(tmp_path / "ckpts" / "last.ckpt", weights_only=True)["global_step"] == 3
    assert sorted(p.name for p in (tmp_path / "ckpts").iterdir()) == ["last.ckpt"]


def test_last_ckpt_is_written_after_every_round(tmp_path, monkeypatch):
    steps = []
    save = AtomicCheckpointIO.save_checkpoint

    def record(self, checkpoint, path, storage_options=None):
        steps.append((Path(path).name, checkpoint["global_step"], len(checkpoint["fl_lightning"]["history"])))
        save(self, checkpoint, path, storage_options)

    monkeypatch.setattr(AtomicCheckpointIO, "save_checkpoint", record)
    _fit(tmp_path, make_module(), rounds=3)
    assert steps == [("last.ckpt", r, r) for r in (1, 2, 3)]  # once per round, after its validation


def test_resume_from_last_ckpt_is_identical_to_the_uninterrupted_run(tmp_path):
    full = make_module(participation=0.5)
    _fit(tmp_path / "full", full, rounds=4)
    part = make_module(participation=0.5)
    _fit(tmp_path / "a", part, rounds=2)
    resumed = make_module(participation=0.5)
    _fit(tmp_path / "b", resumed, rounds=4, ckpt_path=tmp_path / "a" / "ckpts" / "last.ckpt")
    a, b = global_weights(full), global_weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert torch.load(tmp_path / "b" / "ckpts" / "last.ckpt", weights_only=True)["global_step"] == 4


def test_resume_restores_every_clients_state(tmp_path):
    """SCAFFOLD keeps a control variate c_i per client in the engine's state store: the checkpoint carries
    the store, so the resumed run corrects its clients' steps with the variates of the rounds before
    (FedAvg, in the test above, has no client state: a resume that lost the store would pass it)."""
    full = make_module(Scaffold(), participation=0.5)
    _fit(tmp_path / "full", full, rounds=4)
    _fit(tmp_path / "a", make_module(Scaffold(), participation=0.5), rounds=2)
    saved = torch.load(tmp_path / "a" / "ckpts" / "last.ckpt", weights_only=True)["fl_lightning"]
    assert saved["client_state"]  # the clients of rounds 1-2 have their c_i in the checkpoint
    resumed = make_module(Scaffold(), participation=0.5)
    _fit(tmp_path / "b", resumed, rounds=4, ckpt_path=tmp_path / "a" / "ckpts" / "last.ckpt")
    a, b = global_weights(full), global_weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    states_a, states_b = full.store.state_dict(), resumed.store.state_dict()
    assert sorted(states_a) == sorted(states_b)
    assert all(torch.equal(states_a[c][n], states_b[c][n]) for c in states_a for n in states_a[c])


#: Strategy arguments where the defaults' size is not what a test of every strategy checks: FedCOG generates
#: 16 inputs in 5 steps per client, not 256 in 100 (the same generation and distillation code runs; it cost
#: 10 s of CPU a test here, now 1 s; what the generation computes: tests/strategies/plugins/test_fedcog.py).
SMALL = {"FedCOG": {"num_generated": 16, "gen_steps": 5}}


# ---------------------------------------------------------------------------------- weights_only
@pytest.mark.parametrize("name", list_strategies())
def test_every_strategy_writes_a_checkpoint_that_loads_with_weights_only(name, tmp_path):
    _fit(tmp_path, make_module(get_strategy(name, **SMALL.get(name, {}))), rounds=2)
    checkpoint = torch.load(tmp_path / "ckpts" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 2 and checkpoint["fl_lightning"]["hparams"]


def test_loading_defaults_to_weights_only(tmp_path, monkeypatch):
    path = tmp_path / "x.ckpt"
    AtomicCheckpointIO().save_checkpoint(_ckpt(1.0), path)
    seen = []
    load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: seen.append(k["weights_only"]) or load(*a, **k))
    AtomicCheckpointIO().load_checkpoint(path)
    AtomicCheckpointIO().load_checkpoint(path, weights_only=None)
    assert seen == [True, True]


class NotAllowed:
    """A class torch's weights_only unpickler refuses."""


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "does not exist"),
        (b"", "is empty"),
        (b"\x8f\x01 random bytes \x00" * 100, "is not a checkpoint (truncated"),
        (b"trainer:\n  max_steps: 3\n", "is not a checkpoint (truncated"),
        (torch.zeros(3), "holds a Tensor, not a Lightning checkpoint"),
        ({"a": 1}, "holds a dict without state_dict"),
        ({"state_dict": {}, "x": NotAllowed()}, "holds Python objects other than tensors"),
    ],
    ids=["missing", "empty", "random", "yaml", "tensor", "dict", "object"],
)
def test_a_file_that_is_not_a_checkpoint_is_one_line(tmp_path, content, message):
    path = tmp_path / "x.ckpt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        torch.save(content, path)
    with pytest.raises(ConfigError) as info:
        load_checkpoint_file(path)
    text = str(info.value)
    assert text.startswith(f"ckpt_path: {path} {message}") and "\n" not in text
    assert "weights_only=False" not in text and "last.ckpt" in text  # the fix


def test_a_truncated_checkpoint_is_one_line(tmp_path):
    path = tmp_path / "x.ckpt"
    torch.save(_ckpt(1.0), path)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ConfigError, match=r"is not a checkpoint \(truncated"):
        AtomicCheckpointIO().load_checkpoint(path)


# ---------------------------------------------------------------------------------- resume checks
def test_hyperparameters_are_a_flat_dict_of_config_fields():
    module = make_module(FedProx(mu=0.3), lr_decay=0.9, clients_per_round=2)
    hp = hyperparameters(module)
    assert hp["model.client.lr"] == 0.1 and hp["model.strategy.mu"] == 0.3
    assert hp["model.strategy.server_lr"] == 1.0 and hp["model.lr_decay"] == 0.9
    assert hp["model.local_steps"] == 2 and hp["model.clients_per_round"] == 2
    assert all(v is None or isinstance(v, (bool, int, float, str, list)) for v in hp.values())


def test_resume_with_max_steps_not_above_the_rounds_done_is_refused(tmp_path):
    _fit(tmp_path / "a", make_module(), rounds=2)
    ckpt = tmp_path / "a" / "ckpts" / "last.ckpt"
    for rounds in (1, 2):
        with pytest.raises(ConfigError) as info:
            _fit(tmp_path / "b", make_module(), rounds=rounds, ckpt_path=ckpt)
        assert str(info.value) == (
            f"trainer.max_steps={rounds} but the checkpoint has already done 2 rounds; to extend the run "
            "by N rounds, rerun with the same --config and --trainer.max_steps=<2 + N> "
            "(e.g. --trainer.max_steps=4)"
        )
    make_trainer(tmp_path / "c", rounds=1).validate(make_module(), datamodule=make_data(), ckpt_path=ckpt)


def test_resume_with_changed_hyperparameters_warns_naming_each(tmp_path, caplog):
    _fit(tmp_path / "a", make_module(), rounds=1)
    ckpt = tmp_path / "a" / "ckpts" / "last.ckpt"
    same = make_module()
    with caplog.at_level(logging.WARNING, logger="fl_lightning"):
        _fit(tmp_path / "b", same, rounds=2, ckpt_path=ckpt)
    assert not [r for r in caplog.records if "changed hyperparameters" in r.getMessage()]
    changed = make_module(FedAvg(server_lr=0.5), lr_decay=0.9, eval_clients_every=2)
    changed.client.lr = 0.05
    with caplog.at_level(logging.WARNING, logger="fl_lightning"):
        _fit(tmp_path / "c", changed, rounds=2, ckpt_path=ckpt)
    (line,) = [r.getMessage() for r in caplog.records if "changed hyperparameters" in r.getMessage()]
    assert line == (
        "resuming after round 1 with changed hyperparameters: model.client.lr 0.1 -> 0.05, "
        "model.lr_decay 1.0 -> 0.9, model.strategy.server_lr 1.0 -> 0.5 (earlier rounds used the old values)"
    )


def test_the_spawn_and_fork_launchers_hand_over_rank_0s_weights_and_nothing_else_passes(tmp_path):
    """``trainer.strategy=ddp_fork``/``ddp_spawn``: rank 0 saves its bare ``state_dict`` as ``.temp.ckpt``
    for the main process, which loads it through the checkpoint IO; any other bare ``state_dict`` is still
    one line (a user's ``--ckpt_path``)."""
    io = AtomicCheckpointIO()
    weights = {"client.net.w": torch.arange(3.0)}
    handed = tmp_path / LAUNCHER_WEIGHTS
    io.save_checkpoint(weights, handed)
    assert torch.equal(io.load_checkpoint(handed)["client.net.w"], weights["client.net.w"])
    io.save_checkpoint(weights, tmp_path / "weights.ckpt")
    with pytest.raises(ConfigError, match=r"holds a dict without state_dict, not a Lightning checkpoint"):
        io.load_checkpoint(tmp_path / "weights.ckpt")
