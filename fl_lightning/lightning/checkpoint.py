"""Checkpoints: atomic writes, ``last.ckpt`` after every round, and what a resume must agree on.

* :class:`AtomicCheckpointIO` writes each checkpoint to a temporary file in the destination folder,
  flushes it to disk and renames it over the target (``os.replace``), so a kill or a full disk
  leaves the previous file intact; it loads with ``weights_only=True`` and turns a file that is not
  a checkpoint into one ``ckpt_path:`` line.
* :class:`LastRoundCheckpoint` keeps ``checkpoints/last.ckpt`` the last completed round (Lightning
  2.6's ``ModelCheckpoint(monitor=..., save_last=True)`` rewrites it only when the monitored metric
  improves, see the class docstring).
* :func:`check_resume` refuses a checkpoint from another config (its fingerprint) or one that has
  already done ``trainer.max_steps`` rounds, and warns about changed hyperparameters.

:func:`~fl_lightning.lightning.trainer.federated_trainer` installs the first two (the command line's Trainer
and Python's alike).
"""

from __future__ import annotations

import inspect
import logging
import os
import pickle
import re
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from fsspec.utils import get_protocol
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn

from fl_lightning.engine.config import upgrade_model_hparams
from fl_lightning.errors import ConfigError

log = logging.getLogger("fl_lightning")

#: A checkpoint's path (a local path or an fsspec URL such as ``s3://...``).
PathLike = str | os.PathLike


def _is_local(path: PathLike) -> bool:
    """Whether ``path`` is on the local file system (fsspec's protocol ``file``)."""
    return get_protocol(str(path)) == "file"


#: Name of a checkpoint's temporary file while it is written: ``.<name>.tmp-<pid>``.
_TEMP = re.compile(r"^\..+\.tmp-(\d+)$")
#: The file in which Lightning's spawn and fork launchers (``trainer.strategy=ddp_spawn``/``ddp_fork``) hand
#: rank 0's final weights to the main process: a bare ``state_dict``, not a checkpoint.
LAUNCHER_WEIGHTS = ".temp.ckpt"

_CKPT_FIX = (
    "give a .ckpt file written by `fit` "
    "(e.g. lightning_logs/version_0-fedavg-dirichlet/checkpoints/last.ckpt)"
)

#: Constructor arguments that change how a run is executed or evaluated, not what it trains.
_NOT_TRAINING = frozenset(
    {
        "model.eval_clients_every",
        "model.eval_fraction",
        "model.runtime.state_dir",
        "model.runtime.state_memory_mb",
        "model.runtime.threads_per_process",
    }
)


class AtomicCheckpointIO(TorchCheckpointIO):
    """``torch.save``/``torch.load`` checkpoints, written atomically and loaded with ``weights_only=True``.

    Saving writes ``.<name>.tmp-<pid>`` in the destination folder, flushes and ``fsync``s it, then
    ``os.replace``s it over ``<name>`` (atomic on POSIX and Windows within one file system) and
    syncs the folder. A failed write (full disk, exception, Ctrl-C) removes its temporary file and
    leaves the previous checkpoint untouched; temporary files of killed processes are removed by the
    next save into the same folder. Lightning's own writer stages the bytes in the system temporary
    folder and moves them, which copies (non-atomically) when that folder is on another file system.
    Non-local paths (``s3://``, ...) keep Lightning's writer.
    """

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: PathLike, storage_options: Any | None = None
    ) -> None:
        if storage_options is not None or not _is_local(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        target = Path(path).expanduser().absolute()
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(target.parent)
        temp = target.parent / f".{target.name}.tmp-{os.getpid()}"
        try:
            with open(temp, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, target)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        _fsync_dir(target.parent)

    def load_checkpoint(
        self,
        path: PathLike,
        map_location: Callable | None = lambda storage, loc: storage,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        """Load ``path`` with ``weights_only=True`` unless the caller passes ``False`` explicitly.

        Raises:
            ConfigError: one ``ckpt_path:`` line for a file that is not a checkpoint
                (see :func:`load_checkpoint_file`).
        """
        if not _is_local(path):
            return super().load_checkpoint(path, map_location, weights_only)
        if Path(path).name == LAUNCHER_WEIGHTS:  # rank 0's weights for the main process (spawn/fork)
            return torch.load(path, map_location=map_location, weights_only=True)
        return load_checkpoint_file(path, map_location, True if weights_only is None else weights_only)


def load_checkpoint_file(
    path: PathLike, map_location: Any = None, weights_only: bool = True, mmap: bool = False
) -> dict[str, Any]:
    """``torch.load`` a local Lightning checkpoint; anything else is one ``ckpt_path:`` line.

    Args:
        path: The checkpoint file.
        map_location: As for ``torch.load``.
        weights_only: As for ``torch.load``; never ``False`` for a file a user names.
        mmap: Map tensor storages instead of reading them (a cheap check of a large file).

    Raises:
        ConfigError: if the file is missing, empty, truncated or not a torch zip file, holds objects
            ``weights_only`` refuses, or is not a Lightning checkpoint. torch's own message is not
            passed on: it advises ``weights_only=False``, which would run code from the file.
    """
    file = Path(path).expanduser()
    if not file.exists():
        raise ConfigError(f"ckpt_path: {file} does not exist; {_CKPT_FIX}")
    if not file.is_file():
        raise ConfigError(f"ckpt_path: {file} is not a file; {_CKPT_FIX}")
    if file.stat().st_size == 0:
        raise ConfigError(f"ckpt_path: {file} is empty (0 bytes; an interrupted copy?); {_CKPT_FIX}")
    if not zipfile.is_zipfile(file):  # torch.save writes a zip archive; its index is at the end
        raise ConfigError(
            f"ckpt_path: {file} is not a checkpoint (truncated, or not written by torch.save); {_CKPT_FIX}"
        )
    try:
        checkpoint = torch.load(file, map_location=map_location, weights_only=weights_only, mmap=mmap)
    except pickle.UnpicklingError:
        raise ConfigError(
            f"ckpt_path: {file} holds Python objects other than tensors and plain values, which fl_lightning "
            f"does not unpickle (it loads with weights_only=True); {_CKPT_FIX}"
        ) from None
    except (RuntimeError, EOFError, ValueError, zipfile.BadZipFile, OSError) as err:
        raise ConfigError(
            f"ckpt_path: {file} is corrupted ({type(err).__name__} while reading it); {_CKPT_FIX}"
        ) from None
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        what = (
            "a dict without state_dict" if isinstance(checkpoint, dict) else f"a {type(checkpoint).__name__}"
        )
        raise ConfigError(f"ckpt_path: {file} holds {what}, not a Lightning checkpoint; {_CKPT_FIX}")
    return checkpoint


def remove_stale_temps(folder: Path) -> None:
    """Remove ``.<name>.tmp-<pid>`` files in ``folder`` whose writing process no longer exists."""
    try:
        entries = list(folder.iterdir())
    except OSError:
        return
    for entry in entries:
        match = _TEMP.match(entry.name)
        if match is None or _pid_alive(int(match.group(1))):
            continue
        try:
            entry.unlink()
            log.info("removed %s, left by a checkpoint write that was killed", entry)
        except OSError:
            pass


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True  # a write of ours in another thread (ours that fail remove their own file)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # another user's process, or a platform without signal 0
    return True


def _fsync_dir(folder: Path) -> None:
    """Persist the rename itself (POSIX; a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class LastRoundCheckpoint(ModelCheckpoint):
    """Writes ``last.ckpt`` after every completed round (and at the end of fit).

    Lightning 2.6's ``ModelCheckpoint(save_last=True)`` writes ``last.ckpt`` only in a step where it
    also wrote a top-k checkpoint (``on_validation_end``: "Only save last checkpoint if a checkpoint
    was actually saved in this step"). With ``monitor=...`` that is a step where the metric improved,
    so ``last.ckpt`` is the best round, not the last, and resuming replays rounds. Here one training
    step is one round and validation runs after every step (``val_check_interval: 1``), so this
    callback saves in ``on_validation_end`` (after the round's ``global/*`` metrics are in the
    history, the point from which resume is bit-exact), in ``on_train_epoch_end`` for rounds without
    validation, and in ``on_train_end``; each round is written once. It keeps no top-k files: add
    a ``ModelCheckpoint(monitor=...)`` for the best round.

    Args:
        dirpath: Folder of ``last.ckpt`` (default: ``<log_dir>/checkpoints``, as ModelCheckpoint).
    """

    def __init__(self, dirpath: PathLike | None = None) -> None:
        super().__init__(dirpath=dirpath, save_last=True, save_top_k=0, enable_version_counter=False)
        self.saved_round = -1  # the rounds done when last.ckpt was last written

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        """Nothing: a round is saved once its validation has run (or at the end of the epoch)."""

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._save_round(trainer)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._save_round(trainer)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._save_round(trainer)

    def _save_round(self, trainer: Trainer) -> None:
        if (
            trainer.fast_dev_run
            or trainer.state.fn != TrainerFn.FITTING
            or trainer.sanity_checking
            or self.saved_round == trainer.global_step
            or self.dirpath is None
        ):
            return
        # Lightning's public save (every process calls it; the global-zero one writes, through the
        # Trainer's CheckpointIO: AtomicCheckpointIO from the CLI)
        path = os.path.join(self.dirpath, self.CHECKPOINT_NAME_LAST + self.FILE_EXTENSION)
        trainer.save_checkpoint(path, weights_only=False)  # the whole state: resume needs the optimizer
        self.saved_round = trainer.global_step
        self.last_model_path = path


# ---------------------------------------------------------------------------------- resume checks
def hyperparameters(module: LightningModule) -> dict[str, Any]:
    """Flat ``{config field: value}`` of the module's constructor arguments and those it holds.

    Walks ``__init__`` signatures: ``model.<arg>`` for :class:`~fl_lightning.FederatedModule`
    (values read from the module or its engine's configuration), ``model.client.<arg>``,
    ``model.strategy.<arg>``, ... for nested objects (up to three levels). Only plain values
    (``None``, bool, int, float, str and lists of them) are kept, so the dict loads with
    ``weights_only=True``; an argument the object does not keep under its own name is skipped.
    """
    config = getattr(getattr(module, "engine", None), "config", None)
    sources = [config, config.local] if config is not None else []
    out: dict[str, Any] = {}
    _collect(module, "model", sources, out, depth=0)
    return out


def _collect(obj: Any, prefix: str, sources: list[Any], out: dict[str, Any], depth: int) -> None:
    try:
        params = inspect.signature(type(obj).__init__).parameters
    except (TypeError, ValueError):
        return
    for name, param in params.items():
        if name == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        found, value = False, None
        for src in (obj, *sources):
            if isinstance(inspect.getattr_static(type(src), name, None), property):
                continue  # computed, not a stored argument (and may need a trainer)
            try:
                value = getattr(src, name)
            except AttributeError:
                continue
            found = not inspect.isroutine(value)
            break
        if not found:
            continue
        key = f"{prefix}.{name}"
        if _plain(value):
            out[key] = _as_plain(value)
        elif depth < 3 and not isinstance(value, torch.Tensor) and hasattr(value, "__dict__"):
            _collect(value, key, [], out, depth + 1)


def _as_plain(value: Any) -> Any:
    """``value`` with built-in types only (a :class:`~fl_lightning.api.task.Task` is a ``str`` subclass;
    tuples become lists), so the checkpoint loads with ``weights_only=True``."""
    if isinstance(value, (list, tuple)):
        return [_as_plain(v) for v in value]
    return str(value) if isinstance(value, str) else value


def _plain(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    return isinstance(value, (list, tuple)) and all(
        v is None or isinstance(v, (bool, int, float, str)) for v in value
    )


class FingerprintError(ConfigError):
    """A checkpoint whose fingerprint differs from the config's; ``diffs`` lists the fields that differ.

    Its message says to use the config the checkpoint was written with; the CLI replaces that advice with
    the exact ``--config`` to give (the ``config.yaml`` of the run that wrote it).
    """

    def __init__(self, diffs: list[str]) -> None:
        super().__init__(
            "ckpt_path: the checkpoint comes from a different config: "
            + "; ".join(diffs)
            + ". Resume with the config it was written with, or start a new run without --ckpt_path"
        )
        self.diffs = diffs


def check_fingerprint(saved: dict[str, Any], current: dict[str, Any]) -> None:
    """Refuse a checkpoint whose fingerprint (data, seed, strategy, shapes) differs from the config.

    Raises:
        FingerprintError: naming every field that differs, with the checkpoint's and the config's value.
    """
    diffs = []
    for key in sorted(set(saved) | set(current)):
        a, b = saved.get(key), current.get(key)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            names = [n for n in sorted(set(a) | set(b)) if a.get(n) != b.get(n)]
            n = names[0]
            diffs.append(f"{key} ({n}: checkpoint {a.get(n)} vs config {b.get(n)})")
        else:
            diffs.append(f"{key} (checkpoint {a!r} vs config {b!r})")
    if diffs:
        raise FingerprintError(diffs)


def attached_trainer(module: LightningModule) -> Trainer | None:
    """``module.trainer``, or None when the module is not attached to one (Lightning raises then)."""
    try:
        return module.trainer
    except RuntimeError:
        return None


def check_resume(module: LightningModule, checkpoint: dict[str, Any], fingerprint: dict[str, Any]) -> None:
    """Checks run when ``module`` loads ``checkpoint`` (``fingerprint``: the module's current one).

    Always: the fingerprint must match. When fitting: ``trainer.max_steps`` must exceed the rounds
    the checkpoint has done (else fit would end at once, saving nothing), and every changed
    hyperparameter (``model.client.lr``, ``model.strategy.server_lr``, ...) is logged on one
    warning line as ``old -> new``: resuming with a changed schedule is legitimate, but the rounds
    already done used the old values.
    """
    fl = checkpoint["fl_lightning"]
    check_fingerprint(fl["fingerprint"], fingerprint)
    trainer = attached_trainer(module)
    if trainer is None or trainer.state.fn != TrainerFn.FITTING:
        return
    done = int(checkpoint.get("global_step", 0))
    if 0 <= trainer.max_steps <= done:
        raise ConfigError(
            f"trainer.max_steps={trainer.max_steps} but the checkpoint has already done {done} rounds; to "
            f"extend the run by N rounds, rerun with the same --config and --trainer.max_steps=<{done} + N> "
            f"(e.g. --trainer.max_steps={done + max(done, 1)})"
        )
    saved = fl.get("hparams")
    if saved is None or not trainer.is_global_zero:
        return
    saved = upgrade_model_hparams(saved)  # the round policy's and runtime's fields, saved elsewhere before
    current = hyperparameters(module)
    changed = [
        f"{key} {saved.get(key, 'unset')} -> {current.get(key, 'unset')}"
        for key in sorted(set(saved) | set(current))
        if key not in _NOT_TRAINING and saved.get(key) != current.get(key)
    ]
    if changed:
        log.warning(
            "resuming after round %d with changed hyperparameters: %s (earlier rounds used the old values)",
            done,
            ", ".join(changed),
        )
