"""The Moreau envelope's inner problem (pFedMe, Dinh et al. NeurIPS 2020, eq. 7; TDPFed Sec. V-A, eq. 15).

The personalised model ``theta`` solves ``min_theta f(theta; B) + lam/2 ||theta - W(w)||^2``; these are the
plain functions of that problem. The client loop that uses them is
``fl_lightning.strategies.mixins.moreau.MoreauEnvelope``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call

from fl_lightning.functional.tensor import to_device


def squared_distance(a: dict[str, Tensor], b: dict[str, Tensor]) -> Tensor:
    """``sum_n ||a_n - b_n||^2`` over the keys of ``a``, differentiable in both.

    Multi-tensor ops (one subtraction, one norm per group, then ``sum_n norm_n^2``), so the term costs
    the same few kernels per step whatever the number of tensors.
    """
    if not a:
        return torch.zeros(())
    diffs = torch._foreach_sub(list(a.values()), [b[n] for n in a])
    return torch.stack(torch._foreach_norm(diffs, 2)).square().sum()


def personal_steps(
    module: nn.Module,
    theta: dict[str, Tensor],
    reference: dict[str, Tensor],
    batch: Any,
    optimizer: torch.optim.Optimizer,
    lam: float,
    steps: int,
) -> tuple[Tensor, Tensor]:
    """``steps`` optimizer steps on ``f(theta; B) + lam/2 ||theta - reference||^2``, one batch (eq. 15).

    ``theta`` (leaf tensors, the keys of :func:`dense_weights`) is updated in place; ``reference`` is
    ``W(w_k)``, constant during the steps. Returns the outputs and task loss of the first step. The
    batch is moved to ``theta``'s device (a no-op when the data already lives there).
    """
    x, y = to_device(batch, next(iter(theta.values())).device)
    first: tuple[Tensor, Tensor] | None = None
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        outputs = functional_call(module, theta, (x,))
        loss = module.task_loss(outputs, y)
        if first is None:
            first = (outputs.detach(), loss.detach())
        total = loss + 0.5 * lam * squared_distance(theta, reference) if lam else loss
        total.backward()
        optimizer.step()
    assert first is not None
    return first
