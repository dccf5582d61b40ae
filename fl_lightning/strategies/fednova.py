"""FedNova (Wang, Liu, Liang, Joshi & Poor, NeurIPS 2020): normalised averaging of the local updates."""

from __future__ import annotations

import torch
from torch import nn

from fl_lightning.api import (
    Aggregator,
    ClientContext,
    Payload,
    RoundInfo,
    RunSpec,
    Vectorizable,
    register_strategy,
)
from fl_lightning.errors import ConfigError
from fl_lightning.functional.corrections import fednova_norm
from fl_lightning.strategies.fedprox import FedProx

#: Upload group carrying the client's ``||a_i||_1`` and its inverse (8 bytes).
GROUP = "fednova"
#: ``ctx.scratch`` keys: the local steps actually taken this round, and the local optimizer's momentum.
STEPS, MOMENTUM = "fednova/steps", "fednova/momentum"


def normalised_weight(upload: Payload, num_samples: int) -> float:
    """The aggregation weight of a client's model in FedNova's mean: ``n_i / ||a_i||_1`` (0 for a client
    that took no step: its update ``d_i`` is zero)."""
    inverse = float(upload[GROUP]["inv_a"]) if GROUP in upload else 1.0
    return num_samples * inverse


@register_strategy
class FedNova(FedProx):
    """FedNova, Wang, Liu, Liang, Joshi & Poor, "Tackling the Objective Inconsistency Problem in
    Heterogeneous Federated Optimization" (NeurIPS 2020), Sec. 4-5 and Appendix.

    Client ``i`` runs ``tau_i`` local steps of SGD from ``x^t`` (plain, with heavy-ball momentum ``rho``,
    and with FedProx's proximal term ``mu/2 ||x - x^t||^2`` when ``mu > 0``), so that its local change is
    ``x^t - x_i = eta G_i a_i`` with ``G_i`` its stochastic gradients; ``tau_i`` is the number of steps it
    actually took (counted in :meth:`on_after_optimizer_step`: clients with more data under
    ``model.local_epochs``, or stopped early, take their own number) and ``||a_i||_1``
    (:func:`~fl_lightning.functional.corrections.fednova_norm`, Sec. 4 and Appendix) is

    .. math:: \\lVert a_i \\rVert_1 = \\tau_i \\ \\text{(SGD)}, \\quad
              \\frac{\\tau_i - \\rho (1 - \\rho^{\\tau_i}) / (1 - \\rho)}{1 - \\rho} \\ \\text{(momentum)},
              \\quad \\frac{1 - (1 - \\eta\\mu)^{\\tau_i}}{\\eta\\mu} \\ \\text{(proximal)}

    with ``eta`` the round's local learning rate. The normalised update is
    ``d_i = (x^t - x_i) / ||a_i||_1`` and the server takes (Sec. 5, ``w_i = p_i = n_i / sum_j n_j`` over the
    aggregated clients, ``tau_eff = sum_i p_i ||a_i||_1``)

    .. math:: x^{t+1} = x^t - \\eta_s \\, \\tau_{\\text{eff}} \\sum_i p_i d_i

    through the server optimizer's step (FedOpt framing; ``server_lr`` ``eta_s = 1`` is the paper's update).
    Uploads stay models: client ``i`` sends ``x_i`` and ``(||a_i||_1, 1/||a_i||_1)``; the server averages the
    models with weights ``n_i / ||a_i||_1``, so that ``x^t - mean = sum_i p_i d_i / sum_i (p_i / ||a_i||_1)``,
    and scales that pseudo-gradient by ``tau_eff * sum_i p_i / ||a_i||_1`` (both means by sample count).
    When every client takes the same steps with plain SGD, ``d_i = (x^t - x_i) / tau`` and ``tau_eff = tau``:
    FedAvg, up to float rounding. A simulated attack, DP clipping or a robust reduction then act on models,
    as with every other strategy.

    ``||a_i||_1`` follows NIID-Bench's FedNova (Li et al., ICDE 2022; ``experiments.py``): the momentum
    formula with the local optimizer's ``rho``, and weight decay counted as part of the gradient (it does
    not change ``a_i``). Unlike NIID-Bench, which applies the FedNova step to every state entry, float
    buffers (BatchNorm statistics) are assigned the same normalised mean, a convex combination (the step
    can extrapolate a running variance below zero). The local optimizer must be torch's SGD without
    Nesterov or dampening (refused before round 1 otherwise).

    Args:
        mu: FedProx's proximal coefficient ``mu >= 0`` (0: plain local SGD).
        server_lr: Server learning rate ``eta_s`` on the pseudo-gradient.
    """

    name = "fednova"
    vectorizable = Vectorizable(scratch=(STEPS, MOMENTUM))  # FedProx's term; a step count per client

    def __init__(self, mu: float = 0.0, server_lr: float = 1.0) -> None:
        super().__init__(mu=mu, server_lr=server_lr)

    def check(self, model: nn.Module, spec: RunSpec) -> None:
        super().check(model, spec)
        configure = getattr(model, "configure_optimizers", None)
        optimizer = configure() if callable(configure) else None
        if optimizer is None:
            return
        sgd = type(optimizer) is torch.optim.SGD
        if sgd and not any(g.get("nesterov") or g.get("dampening") for g in optimizer.param_groups):
            return
        what = "SGD with Nesterov momentum or dampening" if sgd else type(optimizer).__name__
        raise ConfigError(
            f"model.strategy=FedNova normalises the steps of SGD (plain or with heavy-ball momentum), not of "
            f"{what}; set model.client.init_args.optimizer=sgd"
        )

    # ------------------------------------------------------------------------------ client side
    def on_after_optimizer_step(
        self, module: nn.Module, optimizer: torch.optim.Optimizer, ctx: ClientContext
    ) -> None:
        super().on_after_optimizer_step(module, optimizer, ctx)
        ctx.scratch[STEPS] = ctx.scratch.get(STEPS, 0) + 1
        ctx.scratch[MOMENTUM] = float(optimizer.param_groups[0].get("momentum", 0.0))

    def upload(self, module: nn.Module, ctx: ClientContext) -> Payload:
        """``x_i`` and ``(||a_i||_1, 1 / ||a_i||_1)`` of the steps this client took (``1/0`` is sent as 0)."""
        payload = super().upload(module, ctx)
        norm = fednova_norm(ctx.scratch.get(STEPS, 0), ctx.scratch.get(MOMENTUM, 0.0), self.mu * ctx.lr)
        device = next(iter(payload["weights"].values())).device
        values = torch.tensor([norm, 1.0 / norm if norm > 0 else 0.0], dtype=torch.float32, device=device)
        return {**payload, GROUP: {"a": values[0], "inv_a": values[1]}}

    # ------------------------------------------------------------------------------ server side
    def aggregator(self) -> Aggregator:
        """The models weighted by ``n_i / ||a_i||_1``; ``||a_i||_1`` and its inverse by sample count."""
        return Aggregator(weighting={"weights": normalised_weight, GROUP: "samples"})

    @torch.no_grad()
    def server_update(self, model: nn.Module, means: Payload, info: RoundInfo) -> None:
        """``p.grad = tau_eff * sum_i p_i d_i``: FedAvg's pseudo-gradient on the normalised mean, scaled by
        ``tau_eff * sum_i p_i / ||a_i||_1``; buffers get the normalised mean."""
        if not info.weight_totals.get("weights", 1.0):  # no client took a step: nothing moves
            return
        super().server_update(model, means, info)  # p.grad = x^t - sum_i (p_i/a_i) x_i / sum_i (p_i/a_i)
        nova = means.get(GROUP)
        if nova is None:
            return
        scale = nova["a"] * nova["inv_a"]  # tau_eff * sum_i p_i / ||a_i||_1, on the device (no host sync)
        for p in model.parameters():
            if p.grad is not None:
                p.grad.mul_(scale.to(p.grad.dtype))
