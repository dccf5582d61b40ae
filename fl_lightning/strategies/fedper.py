"""FedPer (Arivazhagan et al., 2019): a shared body, a personal head per client."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from fl_lightning.api import Strategy, register_strategy
from fl_lightning.functional.representation import head_names


@register_strategy
class FedPer(Strategy):
    """FedPer, Arivazhagan et al., "Federated Learning with Personalization Layers" (2019), Sec. 3.

    The network is split into base (body) layers ``phi`` and personalisation (head) layers ``h_k``.
    A sampled client receives ``phi^t``, keeps its own ``h_k``, and trains both jointly by local SGD on
    its data (Alg. 1, client update):

    .. math:: (\\phi_k, h_k) \\leftarrow (\\phi_k, h_k) - \\eta \\nabla F_k(\\phi_k, h_k),
              \\qquad \\phi^{t+1} = \\sum_k \\tfrac{n_k}{n} \\phi_k

    Only the body goes up and down; the head never leaves the client (it starts from the initial
    model's head). The deployed model of a client is ``(phi^t, h_k)``.

    Args:
        head: The personal layers: a count of last ``nn.Linear`` layers (1: the classifier, as in
            the FedRep/FedPAC code for the CIFAR CNN) or module names (see
            :func:`fl_lightning.functional.representation.head_names`).
        server_lr: Server learning rate on the pseudo-gradient of the body.
    """

    name = "fedper"

    def __init__(self, head: int | Sequence[str] = 1, server_lr: float = 1.0) -> None:
        super().__init__(server_lr=server_lr)
        self.head = head if isinstance(head, int) else list(head)

    def setup(self, model: nn.Module, num_clients: int) -> None:
        super().setup(model, num_clients)
        self.personal_names(model)  # a bad ``head`` fails here, before any round

    def personal_names(self, model: nn.Module) -> set[str]:
        return head_names(model, self.head)

    def extra_repr(self) -> str:
        return f"head={self.head}, server_lr={self.server_lr}"
