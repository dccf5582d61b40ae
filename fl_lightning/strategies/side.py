"""Tensors a strategy trains beside the client's model during a round (Ditto's ``v_k``, local atoms)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn


class SideSGD:
    """One SGD step per local step on tensors that are not the module's own parameters.

    The optimizer is built at the first step with the round's learning rate and the client
    optimizer's momentum and weight decay (the ClientModule's ``momentum`` and ``weight_decay``), so
    the side tensors follow the same local SGD as the model. The loss is computed on forked RNG
    streams: the client's own trajectory (dropout, batch order) is the same with or without them.

    Args:
        params: The tensors trained (each with ``requires_grad``).
    """

    def __init__(self, params: list[Tensor]) -> None:
        self.params = params
        self.optimizer: torch.optim.Optimizer | None = None

    def step(self, module: nn.Module, lr: float, device: torch.device, loss: Callable[[], Tensor]) -> None:
        """``loss()`` (evaluated with the global RNG left as it was), backward, one optimizer step."""
        if self.optimizer is None:
            self.optimizer = torch.optim.SGD(
                self.params,
                lr=lr,
                momentum=getattr(module, "momentum", 0.0),
                weight_decay=getattr(module, "weight_decay", 0.0),
            )
        cuda = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda, device_type="cuda"):
            value = loss()
            self.optimizer.zero_grad(set_to_none=True)
            value.backward()
        self.optimizer.step()
