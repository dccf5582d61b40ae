"""Per-client persistent state (control variates, duals, personal layers, previous models)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor


def _nbytes(state: Mapping[str, Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


class ClientStateStore:
    """Each client's state tensors, off the accelerator: in host memory, spilling to disk past a budget.

    The round loop reads a client's state before its local work (:meth:`get`; the caller moves it to
    the training device) and writes it back after (:meth:`put`, stored as CPU copies), so only the
    clients of the current round are on the GPU. With ``memory_budget`` set, the least recently used
    states beyond that many bytes are written to ``directory`` as safetensors files (one per client)
    and read back when their client is sampled again, so resident memory follows the clients of a
    round, not the size of the federation. The whole store is part of the run's checkpoint
    (:meth:`state_dict` / :meth:`load_state_dict`); spilled states enter the checkpoint as
    memory-mapped tensors of their files (read through the page cache while the checkpoint is written,
    not copied into process memory).

    Args:
        memory_budget: Bytes of state kept in memory (None: no limit, never touch the disk).
        directory: Where spilled states go (default: a temporary folder removed at exit).
    """

    def __init__(self, memory_budget: int | None = None, directory: str | os.PathLike | None = None) -> None:
        self.memory_budget = memory_budget
        self._dir = Path(directory) if directory is not None else None
        self._own_dir = False
        self._resident: OrderedDict[int, dict[str, Tensor]] = OrderedDict()
        self._resident_bytes = 0
        self._spilled: set[int] = set()

    # ------------------------------------------------------------------------------ access
    def get(self, client_id: int) -> dict[str, Tensor]:
        """A copy of the client's state (empty for a client never trained); edits do not reach the store."""
        if client_id in self._resident:
            self._resident.move_to_end(client_id)
            return {k: v.clone() for k, v in self._resident[client_id].items()}
        if client_id in self._spilled:
            return load_file(str(self._path(client_id)))
        return {}

    def put(self, client_id: int, state: Mapping[str, Tensor]) -> None:
        """Store ``state`` for ``client_id`` (detached CPU copies; an empty state removes it)."""
        self._drop(client_id)
        if not state:
            return
        copy = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in state.items()}
        self._resident[client_id] = copy
        self._resident_bytes += _nbytes(copy)
        self._enforce_budget(keep=client_id)

    def __contains__(self, client_id: int) -> bool:
        return client_id in self._resident or client_id in self._spilled

    def __len__(self) -> int:
        return len(self._resident) + len(self._spilled)

    def nbytes(self) -> int:
        """Bytes of state held in memory (spilled states are not counted)."""
        return self._resident_bytes

    def spilled(self) -> int:
        """Number of clients whose state is on disk."""
        return len(self._spilled)

    # ------------------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[int, dict[str, Tensor]]:
        out = {cid: dict(s) for cid, s in self._resident.items()}
        for cid in self._spilled:
            out[cid] = load_file(str(self._path(cid)))
        return dict(sorted(out.items()))

    def load_state_dict(self, state: Mapping[int, Mapping[str, Tensor]]) -> None:
        for cid in list(self._resident) + list(self._spilled):
            self._drop(cid)
        for cid, s in state.items():
            self.put(int(cid), {k: torch.as_tensor(v) for k, v in s.items()})

    # ------------------------------------------------------------------------------ disk
    def _path(self, client_id: int) -> Path:
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="fl_client_state_"))
            self._own_dir = True
        self._dir.mkdir(parents=True, exist_ok=True)
        return self._dir / f"client_{client_id}.safetensors"

    def _drop(self, client_id: int) -> None:
        old = self._resident.pop(client_id, None)
        if old is not None:
            self._resident_bytes -= _nbytes(old)
        if client_id in self._spilled:
            self._spilled.discard(client_id)
            self._path(client_id).unlink(missing_ok=True)

    def _enforce_budget(self, keep: int) -> None:
        if self.memory_budget is None:
            return
        while self._resident_bytes > self.memory_budget and len(self._resident) > 1:
            cid = next(iter(self._resident))
            if cid == keep:
                self._resident.move_to_end(cid)
                cid = next(iter(self._resident))
            state = self._resident.pop(cid)
            self._resident_bytes -= _nbytes(state)
            save_file(state, str(self._path(cid)))
            self._spilled.add(cid)

    def __del__(self) -> None:
        if getattr(self, "_own_dir", False) and self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
