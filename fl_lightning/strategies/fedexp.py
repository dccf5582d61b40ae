"""FedExP (Jhunjhunwala, Wang & Joshi, ICLR 2023): server-side extrapolation with an adaptive step."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from fl_lightning.api import ClientContext, RoundInfo, Strategy, register_strategy
from fl_lightning.errors import check_number
from fl_lightning.functional.tensor import Payload

_GROUP = "fedexp"


def extrapolation_step(mean_sq_norm: float, sq_norm_of_mean: float, eps: float) -> float:
    """FedExP's server step size (Jhunjhunwala et al., 2023, Alg. 1, eq. 9).

    .. math:: \\eta_g = \\max\\Big\\{1, \\frac{\\sum_k p_k \\lVert\\Delta_k\\rVert^2}
              {2(\\lVert\\sum_k p_k \\Delta_k\\rVert^2 + \\epsilon)}\\Big\\}

    With uniform weights ``p_k = 1/M`` this is the paper's
    ``sum_k ||Delta_k||^2 / (2M(||Delta_bar||^2 + eps))``.
    By Jensen the ratio is ``>= 1/2``; it exceeds 1 when the client updates disagree (their average is
    much shorter than they are), which is when extrapolating past the average helps.

    Args:
        mean_sq_norm: ``sum_k p_k ||Delta_k||^2``.
        sq_norm_of_mean: ``||sum_k p_k Delta_k||^2``.
        eps: ``epsilon > 0`` guarding the division.
    """
    return max(1.0, mean_sq_norm / (2.0 * (sq_norm_of_mean + eps)))


@register_strategy
class FedExP(Strategy):
    """FedExP, Jhunjhunwala, Wang & Joshi (2023), Alg. 1: FedAvg with an adaptive server step ``eta_g >= 1``.

    Clients train as in FedAvg and also upload the scalar ``||Delta_k||^2`` with
    ``Delta_k = w^t - w_k`` over the parameters (4 bytes; it aggregates like the weights, so it works
    with a sum-only aggregator). The server takes

    .. math:: w^{t+1} = w^t - \\eta_g \\, \\bar\\Delta,\\qquad \\bar\\Delta = \\sum_k p_k \\Delta_k

    with ``eta_g`` from :func:`extrapolation_step`, by scaling the pseudo-gradient before the
    ``SGD(lr=server_lr)`` step (``server_lr = 1`` is the paper). Float buffers (BatchNorm statistics) are
    assigned the average as in FedAvg. The last step size is kept in the buffer ``step_size``.

    Deviations: the weights ``p_k`` are the framework's sample-count weights (the paper assumes equal
    weights; use equal client sizes to match it exactly); the paper's optional averaging of the last
    two global iterates for evaluation is not done.

    Args:
        eps: ``epsilon`` in the step size (paper and FedCOG: 1e-3).
        server_lr: Extra factor on the server step (1 in the paper).
    """

    name = "fedexp"
    vectorizable = True  # FedAvg's steps; ||Delta_k||^2 is computed per client in upload

    def __init__(self, eps: float = 1e-3, server_lr: float = 1.0) -> None:
        super().__init__(server_lr=server_lr)
        check_number(eps, "model.strategy.eps", low=0, low_open=True, hint="(the paper uses 1e-3)")
        self.eps = eps

    def setup(self, model: nn.Module, num_clients: int) -> None:
        super().setup(model, num_clients)
        self.register_buffer("step_size", torch.ones(()))

    def upload(self, module: nn.Module, ctx: ClientContext) -> Payload:
        payload = super().upload(module, ctx)
        sent = ctx.message["weights"]
        sq = sum(
            (p.detach().float() - sent[n].float()).pow(2).sum()
            for n, p in module.named_parameters()
            if n in sent
        )
        return {**payload, _GROUP: {"sq_norm": torch.as_tensor(sq, dtype=torch.float32).reshape(())}}

    @torch.no_grad()
    def server_update(self, model: nn.Module, means: Payload, info: RoundInfo) -> None:
        super().server_update(model, means, info)
        grads: list[Tensor] = [p.grad for p in model.parameters() if p.grad is not None]
        sq_of_mean = float(sum(g.float().pow(2).sum() for g in grads))
        eta = extrapolation_step(float(means[_GROUP]["sq_norm"]), sq_of_mean, self.eps)
        for g in grads:
            g.mul_(eta)
        self.step_size.fill_(eta)

    def extra_repr(self) -> str:
        return f"eps={self.eps}, server_lr={self.server_lr}"
