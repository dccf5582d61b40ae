"""Ditto (Li, Hu, Beirami & Smith, ICML 2021): FedAvg plus a proximal personal model per client."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call

from fl_lightning.api import ClientContext, Strategy, TensorBuffers, register_strategy
from fl_lightning.errors import check_number
from fl_lightning.functional.tensor import Payload, load_tensors, proximal_term, shared_state
from fl_lightning.strategies.side import SideSGD

#: Prefix of a client's personal model ``v_k`` in its state (not ``personal/``: it never replaces the
#: received global model during training, only at evaluation).
DITTO = "ditto/"


def ditto_objective(
    module: nn.Module,
    personal: Mapping[str, Tensor],
    batch: Any,
    reference: Mapping[str, Tensor],
    lam: float,
) -> Tensor:
    """Ditto's personal objective on a batch (Li et al., 2021, eq. 2):

    .. math:: h_k(v; w^t) = F_k(v) + \\frac{\\lambda}{2} \\lVert v - w^t \\rVert^2

    Args:
        module: The client module whose forward and ``task_loss`` define ``F_k``.
        personal: Every entry of ``module.state_dict()`` for the forward (``v``'s parameters with
            ``requires_grad``, its buffers); the proximal term covers the tensors that require grad.
        batch: ``(x, y)``.
        reference: ``w^t``, the received global model.
        lam: ``lambda >= 0``.
    """
    x, y = batch
    loss = module.task_loss(functional_call(module, dict(personal), (x,)), y)
    if lam == 0:
        return loss
    return loss + lam * proximal_term(personal, reference)


def personal_copy(
    module: nn.Module, state: dict[str, Tensor], prefix: str, initial: dict[str, Tensor]
) -> dict[str, Tensor]:
    """A client's personal model ``v_k``: its kept state (``prefix + name``) or, on its first round, ``w^0``
    (``initial``), on the module's device; trainable where the module's entry is a parameter."""
    params = {n for n, _ in module.named_parameters()}
    out: dict[str, Tensor] = {}
    for name, t in module.state_dict().items():
        start = state.get(prefix + name, initial.get(name, t))
        out[name] = start.detach().clone().to(t.device).requires_grad_(name in params)
    return out


@register_strategy
class Ditto(Strategy):
    """Ditto, Li et al., "Ditto: Fair and Robust Federated Learning Through Personalization", Alg. 1.

    The global model is FedAvg's: a sampled client ``k`` trains ``w_k`` from ``w^t`` by local SGD on
    ``F_k`` and uploads it. Besides, it keeps a personal model ``v_k`` (never communicated) and takes,
    at every local step and on the same mini-batch, one SGD step on ``h_k`` (:func:`ditto_objective`):

    .. math:: v_k \\leftarrow v_k - \\eta \\big(\\nabla F_k(v_k) + \\lambda (v_k - w^t)\\big)

    with the round's learning rate and the client optimizer's momentum and weight decay (SGD, momentum
    reset every round as for the global model). ``v_k`` starts from the initial model ``w^0`` (as in the
    authors' code, every personal model is a copy of the initial model) and has its own BatchNorm
    statistics; the deployed model of a client is ``v_k`` (the global model if it never trained). The
    personal forward runs on forked RNG streams, so the global trajectory is FedAvg's bit for bit.
    Chen & Qiu (ICML 2025, App. G) use ``lambda = 0.75`` everywhere. The authors' code trains ``v_k``
    in a separate pass over the local data; here it shares the global model's batches.

    Args:
        lam: ``lambda >= 0`` (0: ``v_k`` is local-only training from ``w^0``).
        server_lr: Server learning rate on the pseudo-gradient (1: FedAvg).
    """

    name = "ditto"
    steps_itself = True
    changes_gradients = True
    deploys_personal_model = True
    prepares_clients = True

    def __init__(self, lam: float = 0.75, server_lr: float = 1.0) -> None:
        super().__init__(server_lr=server_lr)
        check_number(lam, "model.strategy.lam", low=0, hint="(Ditto's lambda; the paper uses 0.75)")
        self.lam = lam
        self.initial = TensorBuffers()

    def setup(self, model: nn.Module, num_clients: int) -> None:
        super().setup(model, num_clients)
        self.initial = TensorBuffers(shared_state(model))  # w^0, where every v_k starts

    def on_client_start(self, module: nn.Module, ctx: ClientContext) -> None:
        super().on_client_start(module, ctx)
        ctx.scratch["ditto"] = _Personal(personal_copy(module, ctx.state, DITTO, self.initial.as_dict()))

    def local_step(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        ctx: ClientContext,
        batch: Any,
        closure: Callable[[], Tensor],
    ) -> None:
        super().local_step(module, optimizer, ctx, batch, closure)
        ctx.scratch["ditto"].step(module, batch, ctx.message["weights"], self.lam, ctx.lr)

    def upload(self, module: nn.Module, ctx: ClientContext) -> Payload:
        personal: _Personal = ctx.scratch["ditto"]
        floating = set(shared_state(module))
        ctx.state.update(
            {DITTO + n: t.detach().clone() for n, t in personal.tensors.items() if n in floating}
        )
        return super().upload(module, ctx)

    def personalize(self, module: nn.Module, client_id: int, state: dict[str, Tensor]) -> None:
        super().personalize(module, client_id, state)
        load_tensors(module, {k[len(DITTO) :]: v for k, v in state.items() if k.startswith(DITTO)})

    def extra_repr(self) -> str:
        return f"lam={self.lam}, server_lr={self.server_lr}"


class _Personal:
    """A client's personal model ``v_k`` during one round, trained by :class:`SideSGD`."""

    def __init__(self, tensors: dict[str, Tensor]) -> None:
        self.tensors = tensors
        self.sgd = SideSGD([t for t in tensors.values() if t.requires_grad])

    def step(
        self, module: nn.Module, batch: Any, reference: Mapping[str, Tensor], lam: float, lr: float
    ) -> None:
        """One SGD step on ``h_k(v; w^t)`` for the batch; leaves the global RNG as it was."""
        self.sgd.step(
            module, lr, batch[0].device, lambda: ditto_objective(module, self.tensors, batch, reference, lam)
        )
