"""Named server-side tensors of a strategy, checkpointed and moved to the device with it."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch
from torch import Tensor, nn


class TensorBuffers(nn.Module):
    """A dict of tensors registered as buffers, keyed by model parameter names (dots allowed).

    Server state of a strategy that has the shape of the model (SCAFFOLD's control variate ``c``,
    FedDyn's dual ``h``) lives here: as buffers of a submodule of the strategy it
    is saved and restored by Lightning's checkpoint and follows the strategy to the device. Buffer
    names cannot contain ``.``, so ``net.conv1.weight`` is stored as ``net/conv1/weight``; every
    accessor takes and returns the parameter names.

    Args:
        tensors: Initial entries (copied).
    """

    def __init__(self, tensors: Mapping[str, Tensor] | None = None) -> None:
        super().__init__()
        for name, value in (tensors or {}).items():
            self.register_buffer(_key(name), value.detach().clone())

    @classmethod
    def zeros_like(cls, tensors: Mapping[str, Tensor]) -> TensorBuffers:
        """Zeros with the names, shapes, dtypes and devices of ``tensors``."""
        return cls({name: torch.zeros_like(t) for name, t in tensors.items()})

    def __getitem__(self, name: str) -> Tensor:
        return self._buffers[_key(name)]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and _key(name) in self._buffers

    def __len__(self) -> int:
        return len(self._buffers)

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def keys(self) -> list[str]:
        return [_name(k) for k in self._buffers]

    def items(self) -> list[tuple[str, Tensor]]:
        return [(_name(k), v) for k, v in self._buffers.items()]

    def as_dict(self) -> dict[str, Tensor]:
        """The entries as a plain ``{name: tensor}`` dict (the tensors themselves, not copies)."""
        return dict(self.items())

    def nbytes(self) -> int:
        """Bytes held by all entries."""
        return sum(t.numel() * t.element_size() for t in self._buffers.values())


def _key(name: str) -> str:
    return name.replace(".", "/")


def _name(key: str) -> str:
    return key.replace("/", ".")
