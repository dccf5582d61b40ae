"""APFL (Deng, Kamani & Mahdavi, 2020): a learned mixture of a local and the global model per client."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call

from fl_lightning.api import ClientContext, Strategy, TensorBuffers, register_strategy
from fl_lightning.errors import check_number
from fl_lightning.functional.personalized import apfl_mixture
from fl_lightning.functional.tensor import Payload, load_tensors, shared_state
from fl_lightning.strategies.ditto import personal_copy
from fl_lightning.strategies.side import SideSGD

#: Prefix of a client's local model ``v_k`` in its state; ``ALPHA`` is its mixing weight ``alpha_k``.
LOCAL = "apfl/"
ALPHA = "apfl_alpha"


@register_strategy
class APFL(Strategy):
    """APFL, Deng, Kamani & Mahdavi, "Adaptive Personalized Federated Learning" (2020), Alg. 1 and Sec. 3.

    The global model ``w`` is FedAvg's: a sampled client trains ``w_k`` from ``w^t`` by local SGD on
    ``f_k`` and uploads it. Besides, it keeps a local model ``v_k`` (never communicated) and a weight
    ``alpha_k``; its personalised model is the mixture ``v_bar_k = alpha_k v_k + (1 - alpha_k) w_k``
    (:func:`~fl_lightning.functional.personalized.apfl_mixture`).
    At every local step, on the same mini-batch ``xi`` and from the values before the step,

    .. math:: w_k \\leftarrow w_k - \\eta \\nabla f_k(w_k; \\xi), \\qquad
              v_k \\leftarrow v_k - \\eta\\, \\alpha_k \\nabla f_k(\\bar v_k; \\xi),

    .. math:: \\alpha_k \\leftarrow \\Pi_{[0,1]}\\big(\\alpha_k - \\eta_\\alpha
              \\langle v_k - w_k, \\nabla f_k(\\bar v_k; \\xi) \\rangle\\big)

    (the adaptive ``alpha`` update; ``eta_alpha`` = ``alpha_lr``, the round's local learning rate if None).
    ``v_k`` starts from the initial model ``w^0``, ``alpha_k`` from ``alpha``; ``v_k`` takes its steps with
    the client optimizer's momentum and weight decay and keeps its own BatchNorm statistics. The deployed
    model of a client is ``alpha_k v_k + (1 - alpha_k) w^t`` with the current global model. The personal
    computation runs on forked RNG streams, so the global trajectory is FedAvg's bit for bit.

    Args:
        alpha: The initial mixing weight ``alpha_k`` in ``[0, 1]`` (1: the local model alone).
        adaptive: Learn ``alpha_k`` (False: it stays ``alpha``).
        alpha_lr: ``eta_alpha`` (None: the round's local learning rate, as in Alg. 1).
        server_lr: Server learning rate on the pseudo-gradient (1: FedAvg).
    """

    name = "apfl"
    steps_itself = True
    changes_gradients = True
    deploys_personal_model = True
    prepares_clients = True

    def __init__(
        self, alpha: float = 0.5, adaptive: bool = True, alpha_lr: float | None = None, server_lr: float = 1.0
    ) -> None:
        super().__init__(server_lr=server_lr)
        check_number(alpha, "model.strategy.alpha", low=0, high=1, hint="(APFL's initial mixing weight)")
        if alpha_lr is not None:
            check_number(alpha_lr, "model.strategy.alpha_lr", low=0, low_open=True, hint="(or null)")
        self.alpha = alpha
        self.adaptive = adaptive
        self.alpha_lr = alpha_lr
        self.initial = TensorBuffers()

    def setup(self, model: nn.Module, num_clients: int) -> None:
        super().setup(model, num_clients)
        self.initial = TensorBuffers(shared_state(model))  # w^0, where every v_k starts

    def on_client_start(self, module: nn.Module, ctx: ClientContext) -> None:
        super().on_client_start(module, ctx)
        v = personal_copy(module, ctx.state, LOCAL, self.initial.as_dict())
        alpha = ctx.state.get(ALPHA, torch.tensor(float(self.alpha), dtype=torch.float64))
        alpha = alpha.detach().clone().to(next(iter(v.values())).device).requires_grad_(self.adaptive)
        ctx.scratch["apfl"] = (v, alpha, SideSGD([t for t in v.values() if t.requires_grad]))

    def local_step(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        ctx: ClientContext,
        batch: Any,
        closure: Callable[[], Tensor],
    ) -> None:
        v, alpha, sgd = ctx.scratch["apfl"]
        w = {n: p.detach().clone() for n, p in module.named_parameters()}  # w_k before this step

        def loss() -> Tensor:
            x, y = batch
            a = alpha.to(next(iter(w.values())).dtype)
            mixed = {**v, **apfl_mixture({n: v[n] for n in w}, w, a)}
            return module.task_loss(functional_call(module, mixed, (x,)), y)

        alpha.grad = None
        sgd.step(module, ctx.lr, batch[0].device, loss)  # v_k; alpha's gradient from the same backward
        if self.adaptive:
            with torch.no_grad():
                lr = ctx.lr if self.alpha_lr is None else self.alpha_lr
                alpha.sub_(lr * alpha.grad).clamp_(0.0, 1.0)
        super().local_step(module, optimizer, ctx, batch, closure)

    def upload(self, module: nn.Module, ctx: ClientContext) -> Payload:
        v, alpha, _ = ctx.scratch["apfl"]
        floating = set(shared_state(module))
        ctx.state.update({LOCAL + n: t.detach().clone() for n, t in v.items() if n in floating})
        ctx.state[ALPHA] = alpha.detach().clone()
        return super().upload(module, ctx)

    def personalize(self, module: nn.Module, client_id: int, state: dict[str, Tensor]) -> None:
        super().personalize(module, client_id, state)
        v = {k[len(LOCAL) :]: t for k, t in state.items() if k.startswith(LOCAL)}
        if not v:
            return  # never trained: the global model
        alpha = float(state[ALPHA])
        params = {n: p.detach() for n, p in module.named_parameters()}
        mixed = apfl_mixture({n: v[n].to(p.device) for n, p in params.items()}, params, alpha)
        load_tensors(module, {**v, **mixed})

    def extra_repr(self) -> str:
        return (
            f"alpha={self.alpha}, adaptive={self.adaptive}, alpha_lr={self.alpha_lr}, "
            f"server_lr={self.server_lr}"
        )
