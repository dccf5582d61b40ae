"""Networks whose sizes follow the data: the ``fit_data`` hook.

A network that leaves a size unset (None: ``vocab_size``, ``input_dim``, ``num_classes``) implements
``fit_data(input_shape, num_classes, vocab_size)``: it builds its layers from the dataset's facts. The
server module calls :func:`size_to_data` on its client module once the data is loaded, before anything
reads the parameters (the model check, the round engine, the optimizers), so ``--model.client.net=CharLSTM``
needs no sizes on the command line. Sizes given explicitly are kept (a mismatch is then the model
check's one-line error).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from torch import nn

__all__ = ["FollowsData", "size_to_data"]


@runtime_checkable
class FollowsData(Protocol):
    """A module that takes unset sizes from the data."""

    def fit_data(self, input_shape: tuple[int, ...], num_classes: int, vocab_size: int | None) -> None:
        """Build the layers whose sizes were left unset.

        Args:
            input_shape: Shape of one input (``[C, H, W]``, ``[D]``, or ``[T]`` for token sequences).
            num_classes: Classes of the task (the logits).
            vocab_size: Token ids of token inputs (None: float inputs).
        """


def size_to_data(
    module: nn.Module, input_shape: tuple[int, ...], num_classes: int, vocab_size: int | None
) -> int:
    """Call ``fit_data`` on every submodule of ``module`` that has it; returns how many were sized."""
    sized = [m for m in module.modules() if isinstance(m, FollowsData)]
    for m in sized:
        m.fit_data(tuple(input_shape), int(num_classes), vocab_size)
    return len(sized)
