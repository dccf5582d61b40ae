"""FedDyn (Acar et al., 2021): dynamic regularisation with a per-client dual."""

from __future__ import annotations

import torch
from torch import nn

from fl_lightning.api import Aggregator, ClientContext, RoundInfo, Strategy, TensorBuffers, register_strategy
from fl_lightning.errors import check_number
from fl_lightning.functional.corrections import (
    add_grads_,
    feddyn_dual_updates,
    feddyn_gradients,
    fill_missing,
    trainable_parameters,
)
from fl_lightning.functional.tensor import Payload, load_tensors

#: ``ctx.state`` prefix of the client dual ``lambda_i`` (one entry per trainable parameter).
DUAL = "dual/"
_TERMS = "feddyn/terms"


@register_strategy
class FedDyn(Strategy):
    """FedDyn, Acar et al., "Federated Learning Based on Dynamic Regularization" (ICLR 2021), Alg. 1.

    In the notation of the FedSMOO paper (Sun et al., ICML 2023, Sec. 3.3, eqs. 12-13 and the FedDyn
    part of its Alg. 1, lines 11, 14, 18, 19, with ``alpha = 1/beta``): client ``i`` keeps a dual
    ``lambda_i`` (= ``grad L_i(theta_i)`` of Acar et al.; ``ctx.state["dual/<name>"]``, zero until
    first sampled) and minimises from ``w^t``::

        L_i(w) - <lambda_i, w> + alpha/2 ||w - w^t||^2

    by ``K`` local optimizer steps on the gradient ``g - lambda_i + alpha (w - w^t)`` (the two terms
    are added in ``on_before_optimizer_step``, before clipping; weight decay stays with the
    optimizer). After the round::

        lambda_i <- lambda_i - alpha (w_i - w^t)                          (clients in S only)
        h        <- h - alpha/m sum_{i in S} (w_i - w^t)                  (m = ALL clients)
        w^{t+1}   = mean_{i in S} w_i - h / alpha

    so ``h = (1/m) sum_{j in [m]} lambda_j`` at all times (never-sampled clients count as zero) and
    ``w^{t+1} = mean_S w_i - beta lambda^{t+1}``; round 0 gives ``w^1 = w^0 + mean_S Delta_i +
    (1/m) sum_S Delta_i``, not FedAvg. Acar et al. average uniformly over the active clients; so do
    all groups here (the same as sample weighting on equal-size clients). The server step is the
    pseudo-gradient ``w^t - (mean_S w_i - h/alpha)`` under SGD with ``server_lr`` (1 lands on
    ``w^{t+1}``; the reference code has no global lr). One model each way per round.

    The reference code (FL-Simulator) stores ``h_i = -lambda_i / alpha`` and puts ``alpha w`` into the
    optimizer's weight decay: the same step, except that its gradient clipping leaves ``alpha w`` out
    (``model.grad_clip_norm`` here clips the whole corrected gradient). FedSMOO with ``r = 0`` is this
    strategy with ``alpha = 1/beta``.

    Args:
        alpha: Regularisation coefficient ``alpha = 1/beta`` (0.1 on CIFAR-10, 0.01 on CIFAR-100 in
            the FedSMOO paper).
        server_lr: Server learning rate on the pseudo-gradient (1 is the paper's update).
    """

    name = "feddyn"
    changes_gradients = True
    prepares_clients = True
    vectorizable = True  # alpha (w - w^t) - lambda_i is elementwise

    def __init__(self, alpha: float = 0.1, server_lr: float = 1.0) -> None:
        super().__init__(server_lr=server_lr)
        check_number(
            alpha,
            "model.strategy.alpha",
            low=0,
            low_open=True,
            hint="(FedDyn coefficient 1/beta); papers use 0.01-0.1",
        )
        self.alpha = alpha

    def setup(self, model: nn.Module, num_clients: int) -> None:
        super().setup(model, num_clients)
        self.h = TensorBuffers.zeros_like({n: p.detach() for n, p in trainable_parameters(model).items()})

    # ------------------------------------------------------------------------------ client side
    def on_client_start(self, module: nn.Module, ctx: ClientContext) -> None:
        super().on_client_start(module, ctx)
        anchor = ctx.message["weights"]
        named = trainable_parameters(module, anchor)
        params = list(named.values())
        duals = fill_missing([ctx.state.get(DUAL + n) for n in named], params)
        # aligned lists, built once per client and round: each step is a few multi-tensor ops
        ctx.scratch[_TERMS] = (list(named), params, [anchor[n] for n in named], duals)

    def on_before_optimizer_step(
        self, module: nn.Module, optimizer: torch.optim.Optimizer, ctx: ClientContext
    ) -> None:
        _, params, anchors, duals = ctx.scratch[_TERMS]
        add_grads_(params, feddyn_gradients(params, anchors, duals, self.alpha))

    def upload(self, module: nn.Module, ctx: ClientContext) -> Payload:
        payload = super().upload(module, ctx)
        names, params, anchors, duals = ctx.scratch[_TERMS]
        new = feddyn_dual_updates(duals, params, anchors, self.alpha)
        ctx.state.update({DUAL + n: d for n, d in zip(names, new)})
        return payload

    # ------------------------------------------------------------------------------ server side
    def aggregator(self) -> Aggregator:
        """Every group uniformly over the round's clients (Acar et al.)."""
        return Aggregator(weighting="uniform")

    @torch.no_grad()
    def server_update(self, model: nn.Module, means: Payload, info: RoundInfo) -> None:
        weights = means.get("weights", {})
        count = info.weight_totals.get("weights", 0.0)  # uniform weights: |S| of the aggregated clients
        params = dict(model.named_parameters())
        for name, p in params.items():
            if name not in weights:
                continue
            target = weights[name]
            if name in self.h:
                h = self.h[name]
                h.sub_(target - p, alpha=self.alpha * count / info.num_clients)
                target = target - h / self.alpha
            p.grad = (p.detach() - target).to(p.dtype)
        load_tensors(model, {n: v for n, v in weights.items() if n not in params})

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, server_lr={self.server_lr}"
