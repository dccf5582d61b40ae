"""SCAFFOLD (Karimireddy et al., 2020): control variates correct the client drift."""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from fl_lightning.core.buffers import TensorBuffers
from fl_lightning.core.types import ClientContext, RoundInfo
from fl_lightning.functional.corrections import (
    add_grads_,
    fill_missing,
    scaffold_control_update,
    trainable_parameters,
)
from fl_lightning.functional.tensor import Payload
from fl_lightning.strategies.base import Strategy, register_strategy

#: ``ctx.state`` prefix of the client control variate ``c_i`` (one entry per trainable parameter).
CONTROL = "control/"
#: ``ctx.scratch`` key of the round's aligned lists ``(names, parameters, c - c_i)``.
TERMS = "scaffold/terms"


@register_strategy
class Scaffold(Strategy):
    """SCAFFOLD, Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated
    Learning" (ICML 2020), Alg. 1 with option II.

    The server sends ``x`` and its control variate ``c`` (group ``"control"``); client ``i`` keeps
    ``c_i`` (``ctx.state["control/<name>"]``, zero until first sampled) and runs ``K`` steps of::

        y_i <- y_i - eta_l (g_i(y_i) + c - c_i)                          (Alg. 1 line 10)

    (the correction is added to the gradient in ``on_before_optimizer_step``, before clipping), then
    with option II of line 12 and the round's local learning rate ``eta_l``::

        c_i+ = c_i - c + (x - y_i) / (K eta_l)

    and uploads ``y_i`` and ``Delta c_i = c_i+ - c_i``. The server (lines 16-17)::

        x <- x + eta_g mean_{i in S}(y_i - x)           (pseudo-gradient step; FedAvg weighting)
        c <- c + |S| / N * mean_{i in S} Delta c_i       (uniform mean over the aggregated clients)

    Two model-size vectors go each way per round (spec P10: SCAFFOLD costs 2x FedAvg). With zero
    variates (round 0) the correction is an exact ``+ 0``, so the first round equals FedAvg bit for
    bit. Option II assumes plain local SGD: with client momentum or Adam ``(x - y_i)/(K eta_l)`` is
    only an estimate of the mean corrected gradient; the papers use SGD without momentum.

    Args:
        server_lr: Global learning rate ``eta_g`` on the pseudo-gradient.
    """

    name = "scaffold"

    def setup(self, model: nn.Module, num_clients: int) -> None:
        super().setup(model, num_clients)
        self.control = TensorBuffers.zeros_like(
            {n: p.detach() for n, p in trainable_parameters(model).items()}
        )

    def message(self, model: nn.Module, client_id: int, round: int) -> Payload:
        return {**super().message(model, client_id, round), "control": self.control.as_dict()}

    # ------------------------------------------------------------------------------ client side
    def on_client_start(self, module: nn.Module, ctx: ClientContext) -> None:
        super().on_client_start(module, ctx)
        c = ctx.message["control"]
        named = trainable_parameters(module, c)
        server = [c[n] for n in named]
        client = fill_missing([ctx.state.get(CONTROL + n) for n in named], server)
        corrections = server if client is None else torch._foreach_sub(server, client)
        ctx.scratch[TERMS] = (list(named), list(named.values()), corrections)

    def on_before_optimizer_step(
        self, module: nn.Module, optimizer: torch.optim.Optimizer, ctx: ClientContext
    ) -> None:
        _, params, corrections = ctx.scratch[TERMS]
        add_grads_(params, corrections)

    def upload(self, module: nn.Module, ctx: ClientContext) -> Payload:
        payload = super().upload(module, ctx)
        c, x = ctx.message["control"], ctx.message["weights"]
        delta = {}
        names, params, _ = ctx.scratch[TERMS]
        for name, p in zip(names, params):
            old = ctx.state.get(CONTROL + name)
            new = scaffold_control_update(old, c[name], x[name], p.detach(), ctx.num_steps, ctx.lr)
            delta[name] = new if old is None else new - old
            ctx.state[CONTROL + name] = new
        return {**payload, "control": delta}

    # ------------------------------------------------------------------------------ server side
    def weighting(self, group: str) -> Literal["samples", "uniform"]:
        return "uniform" if group == "control" else super().weighting(group)

    @torch.no_grad()
    def server_update(self, model: nn.Module, means: Payload, info: RoundInfo) -> None:
        super().server_update(model, means, info)
        # c <- c + |S|/N * mean_S(Delta c_i); |S| = the uniform weight total of the aggregated clients
        scale = info.weight_totals.get("control", 0.0) / info.num_clients
        for name, d in means.get("control", {}).items():
            self.control[name].add_(d, alpha=scale)
