"""MOON (Li, He & Song, CVPR 2021): model-contrastive federated learning."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from fl_lightning.api import ClientContext, Strategy, register_strategy
from fl_lightning.errors import check_number
from fl_lightning.functional.representation import (
    FeatureTap,
    features_of,
    frozen,
    model_contrastive_loss,
    previous_model,
    save_previous_model,
)
from fl_lightning.functional.tensor import Payload

_TAP = "moon/tap"


@register_strategy
class MOON(Strategy):
    """MOON, Li, He & Song (2021), Sec. 3.2, eqs. 3-4: a model-contrastive local term.

    Client ``k`` minimises, over each local batch,

    .. math:: \\ell = \\ell_{sup}(w; (x, y)) + \\mu \\, \\ell_{con}(z, z_{glob}, z_{prev}),\\quad
              \\ell_{con} = -\\log\\frac{e^{\\mathrm{sim}(z, z_{glob})/\\tau}}
              {e^{\\mathrm{sim}(z, z_{glob})/\\tau} + e^{\\mathrm{sim}(z, z_{prev})/\\tau}}

    where ``z``, ``z_glob`` and ``z_prev`` are the representations of ``x`` under the local model being
    trained, the global model ``w^t`` and the client's local model of the last round it trained in
    (kept in its state as ``previous/<name>``, off the GPU); cosine similarity ``sim``. The server
    aggregates as FedAvg.

    The representation is the input of the network's last linear layer (see
    :mod:`fl_lightning.functional.representation`): the FedCOG paper's CNNs have no projection head, unlike
    MOON's own networks. ``z`` is read from the training forward pass itself (no extra pass); the frozen
    global and previous models run in eval mode without gradients. A client with no previous model
    (its first round) uses the global model in its place, as MOON's code does in round 0; the term is
    then the constant ``log 2`` and is skipped. With ``mu = 0`` it is FedAvg exactly.

    Args:
        mu: Weight ``mu`` of the contrastive term (MOON: 5 for CIFAR-10, 1 for CIFAR-100; the FedCOG
            paper's baseline uses 0.01).
        temperature: ``tau`` of the contrastive term (MOON: 0.5).
        server_lr: Server learning rate on the pseudo-gradient.
    """

    name = "moon"
    changes_gradients = True
    prepares_clients = True

    def __init__(self, mu: float = 1.0, temperature: float = 0.5, server_lr: float = 1.0) -> None:
        super().__init__(server_lr=server_lr)
        check_number(mu, "model.strategy.mu", low=0, hint="(contrastive weight; MOON uses 1 or 5)")
        check_number(temperature, "model.strategy.temperature", low=0, low_open=True, hint="(MOON uses 0.5)")
        self.mu = mu
        self.temperature = temperature

    def on_client_start(self, module: nn.Module, ctx: ClientContext) -> None:
        super().on_client_start(module, ctx)
        if self.mu != 0 and previous_model(ctx.state) is not None:
            FeatureTap(module, ctx.scratch, _TAP)

    def local_loss(self, module: nn.Module, ctx: ClientContext, batch: Any, outputs: Tensor) -> Tensor | None:
        tap: FeatureTap | None = ctx.scratch.get(_TAP)
        if tap is None:
            return None
        x = batch[0]
        z = tap.features_for(outputs)
        if z is None:  # the last forward was not the training one (e.g. another plug-in ran since)
            z, _ = features_of(module, x)
        prev = previous_model(ctx.state)
        with torch.no_grad(), frozen(module):
            z_glob, _ = features_of(module, x, ctx.message["weights"])
            z_prev, _ = features_of(module, x, prev)
        return self.mu * model_contrastive_loss(z.float(), z_glob.float(), z_prev.float(), self.temperature)

    def upload(self, module: nn.Module, ctx: ClientContext) -> Payload:
        FeatureTap.release(ctx.scratch, _TAP)
        payload = super().upload(module, ctx)
        if self.mu != 0:
            save_previous_model(module, ctx.state)
        return payload

    def extra_repr(self) -> str:
        return f"mu={self.mu}, temperature={self.temperature}, server_lr={self.server_lr}"
