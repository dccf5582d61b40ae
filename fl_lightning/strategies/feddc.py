"""FedDC (Gao et al., 2022): local drift decoupling and correction."""

from __future__ import annotations

import torch
from torch import nn

from fl_lightning.api import Aggregator, ClientContext, RoundInfo, TensorBuffers, register_strategy
from fl_lightning.errors import check_number
from fl_lightning.functional.corrections import (
    add_grads_,
    feddc_gradients,
    fill_missing,
    trainable_parameters,
)
from fl_lightning.functional.tensor import Payload
from fl_lightning.strategies.scaffold import TERMS, Scaffold

#: ``ctx.state`` prefix of the client's local drift ``h_i`` (one entry per trainable parameter).
DRIFT = "drift/"
_LISTS = "feddc/anchors_drifts"


@register_strategy
class FedDC(Scaffold):
    """FedDC, Gao et al., "FedDC: Federated Learning with Non-IID Data via Local Drift Decoupling and
    Correction" (CVPR 2022), Sec. 3 and Alg. 1.

    Each client keeps a local drift ``h_i`` (``ctx.state["drift/<name>"]``) besides SCAFFOLD's control
    variate ``c_i`` (inherited from :class:`Scaffold`; the server sends ``w`` and ``c``). From
    ``theta = w`` it minimises::

        L_i(theta) + alpha/2 ||h_i + theta - w||^2 + <theta, c - c_i>      (R: drift penalty, G: correction)

    with ``K`` local optimizer steps on the gradient ``g + alpha (theta + h_i - w) + (c - c_i)``
    (added in ``on_before_optimizer_step``, before clipping). After the round, with
    ``Delta theta_i = theta_i - w`` and the round's local learning rate ``eta``::

        h_i  <- h_i + Delta theta_i                                  (drift update)
        c_i+  = c_i - c - Delta theta_i / (K eta)                     (SCAFFOLD option II)
        upload theta_i and Delta c_i = c_i+ - c_i
        H    <- H + (1/N) sum_{i in S} Delta theta_i                  (H = mean_{j in [N]} h_j, server)
        c    <- c + (1/N) sum_{i in S} Delta c_i
        w    <- mean_{i in S} theta_i + H                              (drift-corrected aggregation)

    Choices (the paper writes the aggregation as the mean of ``theta_i + h_i``): the server rule is
    the one of the authors' code (``gaoliang13/FedDC``, ``train_FedDC``), which under partial
    participation adds the mean drift of ALL clients, kept on the server as ``H`` (updated from the
    uploaded ``theta_i``, so no drift is communicated), like FedDyn's ``h``. Clients are averaged
    uniformly as in that code (its per-client size weights are 1 on equal-size clients, and then
    dropped here). ``K eta`` uses the round's decayed learning rate (the code uses the initial
    one). With local momentum, Adam or AdamW, ``c_i+`` is instead the mean over the ``K`` steps of
    ``g + alpha (theta + h_i - w)``, which option II equals under plain SGD (see :class:`Scaffold`):
    option II's closed form overestimates it by up to ``1/(1 - momentum)`` and the variates diverge.
    Two model-size vectors go each way per round, as in SCAFFOLD.

    Args:
        alpha: Drift penalty coefficient ``alpha > 0``.
        server_lr: Server learning rate on the pseudo-gradient ``w - (mean_S theta_i + H)``.
    """

    name = "feddc"
    vectorizable = True  # alpha (theta + h_i - w) + c - c_i is elementwise

    def __init__(self, alpha: float = 0.1, server_lr: float = 1.0) -> None:
        super().__init__(server_lr=server_lr)
        check_number(
            alpha, "model.strategy.alpha", low=0, low_open=True, hint="(FedDC drift penalty); e.g. 0.01-0.1"
        )
        self.alpha = alpha

    def setup(self, model: nn.Module, num_clients: int) -> None:
        super().setup(model, num_clients)
        self.drift = TensorBuffers.zeros_like({n: p.detach() for n, p in trainable_parameters(model).items()})

    # ------------------------------------------------------------------------------ client side
    def on_client_start(self, module: nn.Module, ctx: ClientContext) -> None:
        super().on_client_start(module, ctx)
        names, params, _ = ctx.scratch[TERMS]
        anchors = [ctx.message["weights"][n] for n in names]
        ctx.scratch[_LISTS] = (anchors, fill_missing([ctx.state.get(DRIFT + n) for n in names], params))

    def on_before_optimizer_step(
        self, module: nn.Module, optimizer: torch.optim.Optimizer, ctx: ClientContext
    ) -> None:
        _, params, corrections = ctx.scratch[TERMS]
        anchors, drifts = ctx.scratch[_LISTS]
        add_grads_(params, feddc_gradients(params, anchors, drifts, corrections, self.alpha))
        self.keep_step_gradients(optimizer, ctx)  # for c_i+ with optimizers other than plain SGD

    def upload(self, module: nn.Module, ctx: ClientContext) -> Payload:
        payload = super().upload(module, ctx)  # c_i+ (option II) and Delta c_i
        names, params, _ = ctx.scratch[TERMS]
        anchors, drifts = ctx.scratch[_LISTS]
        with torch.no_grad():
            steps = torch._foreach_sub(params, anchors)  # h_i <- h_i + (theta_i - w)
            new = steps if drifts is None else torch._foreach_add(drifts, steps)
        ctx.state.update({DRIFT + n: h for n, h in zip(names, new)})
        return payload

    # ------------------------------------------------------------------------------ server side
    def aggregator(self) -> Aggregator:
        """Every group uniformly over the round's clients (as FedDyn)."""
        return Aggregator(weighting="uniform")

    @torch.no_grad()
    def server_update(self, model: nn.Module, means: Payload, info: RoundInfo) -> None:
        super().server_update(model, means, info)  # p.grad = w - mean_S theta_i; c updated
        count = info.weight_totals.get("weights", 0.0)
        for name, p in trainable_parameters(model, means.get("weights", {})).items():
            if p.grad is None or name not in self.drift:
                continue
            h = self.drift[name]
            h.sub_(p.grad, alpha=count / info.num_clients)  # H += (1/N) sum_S (theta_i - w)
            p.grad.sub_(h)  # w - (mean_S theta_i + H)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, server_lr={self.server_lr}"
