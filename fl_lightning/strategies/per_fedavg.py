"""Per-FedAvg (Fallah, Mokhtari & Ozdaglar, NeurIPS 2020): FedAvg on the MAML objective, FO and HF."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from fl_lightning.api import ClientContext, LocalTraining, Strategy, register_strategy
from fl_lightning.data.federated import ClientData
from fl_lightning.errors import ConfigError, check_number
from fl_lightning.functional.personalized import hessian_free_direction
from fl_lightning.functional.tensor import derive_seed, module_device, to_device

_BATCH_STREAM = 0x9E7F
_ADAPT_STREAM = 0x9E7A


def _grads(module: nn.Module, params: list[nn.Parameter], batch: Any) -> list[Tensor]:
    """``grad f(w; batch)`` of the task loss at the module's current parameters."""
    x, y = batch
    loss = module.task_loss(module(x), y)
    return list(torch.autograd.grad(loss, params))


@torch.no_grad()
def _set(params: list[nn.Parameter], values: list[Tensor]) -> None:
    for p, v in zip(params, values):
        p.copy_(v)


@register_strategy
class PerFedAvg(Strategy):
    """Per-FedAvg, Fallah, Mokhtari & Ozdaglar, "Personalized Federated Learning with Theoretical Guarantees:
    A Model-Agnostic Meta-Learning Approach" (NeurIPS 2020), Alg. 1 and Sec. 5.

    Clients minimise the MAML objective ``F_k(w) = f_k(w - alpha grad f_k(w))``. Each local step takes
    the loop's mini-batch ``D`` and independent batches ``D'`` (and ``D''`` for HF) of the same size from
    the client's training split (shuffled passes seeded by ``(seed, round, client)``):

    .. math:: \\tilde w = w - \\alpha \\nabla f_k(w; D), \\qquad
              w \\leftarrow w - \\beta \\big(I - \\alpha \\tilde H\\big) \\nabla f_k(\\tilde w; D')

    FO (first order) drops the Hessian term (``tilde H = 0``); HF (Hessian-free) takes ``tilde H g`` on
    ``D''`` by finite differences (:func:`~fl_lightning.functional.personalized.hessian_free_direction`,
    step ``delta``). ``beta`` is the client optimizer's learning rate (``model.client.lr``, decayed per
    round; its momentum and weight decay apply to the outer step), ``alpha`` this strategy's. The server
    averages the models (FedAvg). A client's deployed model is the global model after one gradient step
    of size ``alpha`` on one batch of its training data (the one-step adaptation the method is built for;
    the batch drawn by a stream seeded by the client, in train mode).

    Args:
        alpha: The inner (adaptation) step size ``alpha > 0``.
        variant: ``"FO"`` or ``"HF"``.
        delta: The finite-difference step of HF (``delta > 0``).
        server_lr: Server learning rate on the pseudo-gradient (1: FedAvg's average).
    """

    name = "per_fedavg"
    steps_itself = True
    changes_gradients = True
    deploys_personal_model = True
    prepares_clients = True

    def __init__(
        self, alpha: float = 0.01, variant: str = "FO", delta: float = 1e-3, server_lr: float = 1.0
    ) -> None:
        super().__init__(server_lr=server_lr)
        check_number(alpha, "model.strategy.alpha", low=0, low_open=True, hint="(Per-FedAvg's inner step)")
        if variant not in ("FO", "HF"):
            raise ConfigError(f"model.strategy.variant={variant!r} must be FO or HF")
        check_number(delta, "model.strategy.delta", low=0, low_open=True, hint="e.g. 0.001")
        self.alpha = alpha
        self.variant = variant
        self.delta = delta

    def on_client_start(self, module: nn.Module, ctx: ClientContext) -> None:
        super().on_client_start(module, ctx)
        ctx.scratch["per_fedavg"] = torch.Generator().manual_seed(
            derive_seed(ctx.seed, _BATCH_STREAM, ctx.round, ctx.client_id)
        )

    def _extra_batches(self, ctx: ClientContext, size: int) -> Iterator[Any]:
        scratch = ctx.scratch
        if "per_fedavg/batches" not in scratch:
            extra = 2 if self.variant == "HF" else 1
            data: ClientData = ctx.data
            scratch["per_fedavg/batches"] = data.batches(size, extra * ctx.num_steps, scratch["per_fedavg"])
        return scratch["per_fedavg/batches"]

    def local_step(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        ctx: ClientContext,
        batch: Any,
        closure: Callable[[], Tensor],
    ) -> None:
        params = [p for g in optimizer.param_groups for p in g["params"]]
        device = params[0].device
        extra = self._extra_batches(ctx, len(batch[1]))
        w = [p.detach().clone() for p in params]
        closure()  # grad f(w; D), through the loop's hooks and clipping
        _set(params, [wi - self.alpha * (p.grad if p.grad is not None else 0) for wi, p in zip(w, params)])
        outer = _grads(module, params, to_device(next(extra), device))
        if self.variant == "HF":
            third = to_device(next(extra), device)
            _set(params, [wi + self.delta * g for wi, g in zip(w, outer)])
            plus = _grads(module, params, third)
            _set(params, [wi - self.delta * g for wi, g in zip(w, outer)])
            minus = _grads(module, params, third)
            outer = hessian_free_direction(outer, plus, minus, self.alpha, self.delta)
        _set(params, w)
        for p, g in zip(params, outer):
            p.grad = g
        optimizer.step()

    def adapt(
        self, module: nn.Module, data: ClientData, state: dict[str, Tensor], local: LocalTraining
    ) -> None:
        super().adapt(module, data, state, local)
        generator = torch.Generator().manual_seed(derive_seed(_ADAPT_STREAM, data.client_id))
        device = module_device(module)
        params = [p for p in module.parameters() if p.requires_grad]
        cuda = [device] if device.type == "cuda" else []
        was_training = module.training
        module.train()
        with torch.enable_grad(), torch.random.fork_rng(devices=cuda, device_type="cuda"):
            batch = to_device(next(data.batches(local.batch_size, 1, generator)), device)
            grads = _grads(module, params, batch)
        module.train(was_training)
        _set(params, [p.detach() - self.alpha * g for p, g in zip(params, grads)])

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, variant={self.variant}, delta={self.delta}, server_lr={self.server_lr}"
