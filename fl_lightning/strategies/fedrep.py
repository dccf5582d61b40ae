"""FedRep (Collins et al., ICML 2021): a shared representation, personal heads, head then body."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from fl_lightning.api import ClientContext, register_strategy
from fl_lightning.errors import ConfigError
from fl_lightning.functional.tensor import Payload
from fl_lightning.strategies.fedper import FedPer


def head_steps(num_steps: int, head_epochs: int, body_epochs: int) -> int:
    """Local steps of the head phase: the ``head_epochs / (head_epochs + body_epochs)`` share of a round.

    With ``model.local_epochs = head_epochs + body_epochs`` this is exactly ``head_epochs`` epochs; the
    rest of the round's ``num_steps`` steps train the body.
    """
    return num_steps * head_epochs // (head_epochs + body_epochs)


@register_strategy
class FedRep(FedPer):
    """FedRep, Collins et al., "Exploiting Shared Representations for Personalized Federated Learning"
    (ICML 2021), Alg. 1.

    Personal head ``h_k`` and shared representation ``phi`` as in FedPer, but a sampled client trains
    them in turn. With the received ``phi^t`` fixed it first updates its head for ``tau_h`` local steps,

    .. math:: h_k \\leftarrow h_k - \\eta \\nabla_{h} F_k(\\phi^t, h_k),

    then, with the new head fixed, the representation for ``tau_phi`` steps,

    .. math:: \\phi_k \\leftarrow \\phi_k - \\eta \\nabla_{\\phi} F_k(\\phi_k, h_k),
              \\qquad \\phi^{t+1} = \\sum_k \\tfrac{n_k}{n} \\phi_k .

    Only ``phi`` is communicated; the deployed model of a client is ``(phi^t, h_k)``. The round's local
    steps are split ``head_epochs : body_epochs`` (:func:`head_steps`): with the paper's 10 head epochs
    and 1 body epoch ("Collins et al. settings", Chen & Qiu App. G) set ``model.local_epochs: 11``. The
    frozen part has ``requires_grad`` off during a phase, so it gets no gradient, no momentum and no weight
    decay (the local optimizer's momentum of each part starts at its phase).

    Args:
        head: The personal layers: a count of last ``nn.Linear`` layers or module names (see
            :func:`fl_lightning.functional.representation.head_names`).
        head_epochs: Share of the head phase (paper: 10).
        body_epochs: Share of the representation phase (paper: 1).
        server_lr: Server learning rate on the pseudo-gradient of the representation.
    """

    name = "fedrep"
    steps_itself = True
    changes_gradients = True
    prepares_clients = True

    def __init__(
        self,
        head: int | Sequence[str] = 1,
        head_epochs: int = 10,
        body_epochs: int = 1,
        server_lr: float = 1.0,
    ) -> None:
        super().__init__(head=head, server_lr=server_lr)
        if head_epochs < 0 or body_epochs < 0 or head_epochs + body_epochs == 0:
            raise ConfigError(
                f"model.strategy.head_epochs={head_epochs} and model.strategy.body_epochs={body_epochs} must "
                "be >= 0 with a positive sum (Collins et al.: 10 and 1)"
            )
        self.head_epochs = head_epochs
        self.body_epochs = body_epochs
        self._trainable: set[str] | None = None

    def setup(self, model: nn.Module, num_clients: int) -> None:
        super().setup(model, num_clients)
        self._trainable = {n for n, p in model.named_parameters() if p.requires_grad}

    def _all_trainable(self, module: nn.Module) -> set[str]:
        if self._trainable is None:
            self._trainable = {n for n, p in module.named_parameters() if p.requires_grad}
        return self._trainable

    def on_client_start(self, module: nn.Module, ctx: ClientContext) -> None:
        super().on_client_start(module, ctx)
        train_only(module, self._all_trainable(module))  # both parts in the optimizer

    def local_step(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        ctx: ClientContext,
        batch: Any,
        closure: Callable[[], Tensor],
    ) -> None:
        switch = head_steps(ctx.num_steps, self.head_epochs, self.body_epochs)
        if ctx.step in (0, switch):
            trainable = self._all_trainable(module)
            head = self.personal_names(module) & trainable
            train_only(module, head if ctx.step < switch else trainable - head)
        super().local_step(module, optimizer, ctx, batch, closure)

    def upload(self, module: nn.Module, ctx: ClientContext) -> Payload:
        train_only(module, self._all_trainable(module))
        return super().upload(module, ctx)

    def extra_repr(self) -> str:
        return (
            f"head={self.head}, head_epochs={self.head_epochs}, body_epochs={self.body_epochs}, "
            f"server_lr={self.server_lr}"
        )


def train_only(module: nn.Module, names: set[str]) -> None:
    """Set ``requires_grad`` of ``module``'s parameters: on for those in ``names``, off for the rest."""
    for name, param in module.named_parameters():
        param.requires_grad_(name in names)
