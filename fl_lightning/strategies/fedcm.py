"""FedCM (Xu et al., 2021): client-level momentum."""

from __future__ import annotations

import torch
from torch import nn

from fl_lightning.api import Aggregator, ClientContext, RoundInfo, Strategy, TensorBuffers, register_strategy
from fl_lightning.errors import check_number
from fl_lightning.functional.corrections import fedcm_directions_, trainable_parameters
from fl_lightning.functional.tensor import Payload

#: Upload group carrying the client's ``K * eta`` (one scalar) for the server's normalisation.
STEPS = "fedcm"
_TERMS = "fedcm/terms"


@register_strategy
class FedCM(Strategy):
    """FedCM, Xu et al., "FedCM: Federated Learning with Client-level Momentum" (2021), Alg. 1.

    The server sends ``w^t`` and the global update direction ``Delta^t`` (group ``"momentum"``,
    ``Delta^0 = 0``); every local step of client ``i`` follows the momentum direction::

        v = alpha g + (1 - alpha) Delta^t,      w <- w - eta v

    (the gradient is replaced in ``on_before_optimizer_step``, before clipping; weight decay stays
    with the optimizer, as in the reference code whose loss is ``alpha CE + (1 - alpha) <w, Delta>``).
    The server aggregates as FedAvg and keeps the new direction, the mean local update per unit of
    step size::

        w^{t+1}     = w^t - eta_g (w^t - mean_S w_i)
        Delta^{t+1} = (w^t - mean_S w_i) / mean_S(K_i eta_t)

    ``alpha`` is the weight of the fresh gradient (FedSMOO paper Sec. 5.1: 0.1, "90% shared
    direction"); ``alpha = 1`` is FedAvg exactly. Communication: two model-size vectors down (the
    "double vectors" of the FedSMOO paper's Table 3) and one up, plus the client's ``K eta_t`` as one
    float32 scalar (group ``"fedcm"``, 4 bytes) since the server knows neither ``K`` nor the decayed
    local learning rate; with equal ``K`` (the paper's equal-size clients) the normalisation is
    exactly Xu et al.'s ``1/(eta K)``.

    Args:
        alpha: Client-level momentum coefficient in (0, 1]: weight of the local gradient.
        server_lr: Server learning rate ``eta_g`` on the pseudo-gradient.
    """

    name = "fedcm"
    changes_gradients = True
    prepares_clients = True
    vectorizable = True  # alpha g + (1 - alpha) Delta^t is elementwise (Delta^t broadcasts)

    def __init__(self, alpha: float = 0.1, server_lr: float = 1.0) -> None:
        super().__init__(server_lr=server_lr)
        check_number(
            alpha,
            "model.strategy.alpha",
            low=0,
            high=1,
            low_open=True,
            hint="(client-level momentum); the paper uses 0.1",
        )
        self.alpha = alpha

    def setup(self, model: nn.Module, num_clients: int) -> None:
        super().setup(model, num_clients)
        self.momentum = TensorBuffers.zeros_like(
            {n: p.detach() for n, p in trainable_parameters(model).items()}
        )

    def message(self, model: nn.Module, client_id: int, round: int) -> Payload:
        return {**super().message(model, client_id, round), "momentum": self.momentum.as_dict()}

    # ------------------------------------------------------------------------------ client side
    def on_client_start(self, module: nn.Module, ctx: ClientContext) -> None:
        super().on_client_start(module, ctx)
        direction = ctx.message["momentum"]
        named = trainable_parameters(module, direction)
        ctx.scratch[_TERMS] = (list(named.values()), [direction[n] for n in named])

    def on_before_optimizer_step(
        self, module: nn.Module, optimizer: torch.optim.Optimizer, ctx: ClientContext
    ) -> None:
        fedcm_directions_(*ctx.scratch[_TERMS], self.alpha)

    def upload(self, module: nn.Module, ctx: ClientContext) -> Payload:
        payload = super().upload(module, ctx)
        device = next(iter(payload["weights"].values())).device
        steps_lr = torch.tensor(ctx.num_steps * ctx.lr, dtype=torch.float32, device=device)
        return {**payload, STEPS: {"steps_x_lr": steps_lr}}

    # ------------------------------------------------------------------------------ server side
    def aggregator(self) -> Aggregator:
        """The weights by sample count (FedAvg's), ``K_i eta_t`` uniformly (``mean_S``)."""
        return Aggregator(weighting={STEPS: "uniform"})

    @torch.no_grad()
    def server_update(self, model: nn.Module, means: Payload, info: RoundInfo) -> None:
        super().server_update(model, means, info)  # p.grad = w^t - mean_S w_i
        steps_lr = means.get(STEPS, {}).get("steps_x_lr")
        if steps_lr is None:
            return
        for name, p in trainable_parameters(model, self.momentum.as_dict()).items():
            if p.grad is not None:
                self.momentum[name].copy_(p.grad / steps_lr.to(p.grad))

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, server_lr={self.server_lr}"
