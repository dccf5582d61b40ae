"""FedReg (Xu, Hong, Huang & Jiang, ICLR 2022): local steps regularised by the global model's pseudo data."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call

from fl_lightning.api import ClientContext, RunSpec, Strategy, register_strategy
from fl_lightning.errors import ConfigError, check_number
from fl_lightning.functional.representation import frozen
from fl_lightning.functional.synthetic import (
    projection_coefficient,
    signed_gradient_steps,
    soft_cross_entropy,
)

_PARAMS = "fedreg/params"


@register_strategy
class FedReg(Strategy):
    """FedReg, Xu et al., "Acceleration of Federated Learning with Alleviated Forgetting in Local
    Training" (ICLR 2022), Sec. 3.

    Local step ``k`` of client ``i`` in round ``t`` on a real batch ``(x, y)``, with ``theta^t`` the
    global model received this round:

    1. **Pseudo and perturbed data** from the global model (the knowledge the local update must not
       forget): ``x_s`` = ``iters`` FGSM steps up the global model's loss
       ``x <- clamp(x + eta_s sign(grad_x CE(f(theta^t; x), y)))`` starting from ``x``, labelled with the
       global model's soft predictions ``q_s = softmax f(theta^t; x_s)``; ``x_p`` the same with step
       ``eta_p`` (default ``eta_s / 100``), labelled ``y``.
    2. **Slow update**: the gradient of the local objective (task loss plus any local term) is taken at
       ``theta_gamma = gamma theta + (1 - gamma) theta^t`` and applied at ``theta`` by the local
       optimizer: ``theta' = theta - eta g(theta_gamma)``.
    3. **Regularisation**: with ``Delta = theta' - theta^t`` and the gradients at the midpoint
       ``(theta' + theta^t) / 2`` of the pseudo loss ``g_s = grad CE_soft(f(.; x_s), q_s)`` and of the
       perturbed loss ``g_p = grad CE(f(.; x_p), y)``:
       ``w_s = max(0, <Delta, g_s> / ||g_s||^2)``, ``w_p = max(0, <Delta - w_s g_s, g_p> / ||g_p||^2)``,
       ``theta <- theta' - w_s g_s - w_p g_p``: the update keeps no component that increases, to first
       order, the loss on the global model's pseudo data.

    The server aggregates as FedAvg. With ``gamma = 1`` the gradient is FedAvg's; the step then differs
    from FedAvg's only by step 3's corrections (zero while the update does not increase the pseudo and
    perturbed losses to first order).
    Frozen passes (generation and the gradients of step 3) run in eval mode, so BatchNorm statistics
    are only updated by the training pass. 16-bit mixed precision with a gradient scaler bypasses
    ``local_step`` and is rejected.

    **Compared with the official code**: the pseudo/perturbed data are computed at each step from that
    step's batch rather than for all batches at the start of the round (the same tensors, since the
    global model is fixed during the round); the midpoint (``beta = 0.5``) is the code's constant.

    Args:
        gamma: Slow-update weight ``gamma`` in ``(0, 1]`` (the FedCOG authors' baseline: 0.5).
        eta_s: Input step of the pseudo data (FedCOG authors' code: 1e-3).
        eta_p: Input step of the perturbed data (None: ``eta_s / 100`` as the official code).
        iters: Signed gradient steps per generated batch (official code: 10).
        server_lr: Server learning rate on the pseudo-gradient.
    """

    name = "fedreg"
    steps_itself = True
    changes_gradients = True

    def __init__(
        self,
        gamma: float = 0.5,
        eta_s: float = 1e-3,
        eta_p: float | None = None,
        iters: int = 10,
        server_lr: float = 1.0,
    ) -> None:
        super().__init__(server_lr=server_lr)
        check_number(
            gamma, "model.strategy.gamma", low=0, high=1, low_open=True, hint="(slow-update weight; 0.5)"
        )
        check_number(eta_s, "model.strategy.eta_s", low=0, hint="(input step of the pseudo data; 1e-3)")
        if eta_p is not None:
            check_number(eta_p, "model.strategy.eta_p", low=0, hint="(or null: eta_s / 100)")
        check_number(iters, "model.strategy.iters", low=1, hint="(signed gradient steps; 10)")
        self.gamma = gamma
        self.eta_s = eta_s
        self.eta_p = eta_s / 100 if eta_p is None else eta_p
        self.iters = int(iters)

    def pseudo_data(self, module: nn.Module, ctx: ClientContext, x: Tensor, y: Tensor) -> tuple[Tensor, ...]:
        """``(x_s, q_s, x_p)``: pseudo inputs with the global model's soft labels, perturbed inputs."""
        glob = ctx.message["weights"]

        def forward(inp: Tensor) -> Tensor:
            return functional_call(module, glob, (inp,))

        with frozen(module):
            xs = signed_gradient_steps(forward, x, y, self.eta_s, self.iters)
            xp = signed_gradient_steps(forward, x, y, self.eta_p, self.iters)
            with torch.no_grad():
                qs = forward(xs).float().softmax(dim=-1)
        return xs, qs, xp

    def check(self, model: nn.Module, spec: RunSpec) -> None:
        super().check(model, spec)
        if spec.task.multilabel:
            raise ConfigError(
                "model.strategy=FedReg supports multiclass data only (its pseudo data are labelled by the "
                "global model's softmax); choose another strategy for multilabel data"
            )

    def local_step(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        ctx: ClientContext,
        batch: Any,
        closure: Callable[[], Tensor],
    ) -> None:
        names, params, anchors, saved = self._params(module, optimizer, ctx)
        x, y = batch[0], batch[1]
        xs, qs, xp = self.pseudo_data(module, ctx, x, y)
        with torch.no_grad():  # theta_gamma = gamma theta + (1 - gamma) theta^t
            torch._foreach_copy_(saved, params)
            torch._foreach_lerp_(params, anchors, 1.0 - self.gamma)
        closure()
        with torch.no_grad():
            torch._foreach_copy_(params, saved)
        optimizer.step()  # theta' = theta - eta g(theta_gamma)
        with torch.no_grad():
            delta = torch._foreach_sub(params, anchors)
            mid = torch._foreach_add(anchors, delta, alpha=0.5)
        g_s = self._grads(module, names, mid, xs, lambda z: soft_cross_entropy(z.float(), qs))
        g_p = self._grads(module, names, mid, xp, lambda z: nn.functional.cross_entropy(z.float(), y))
        with torch.no_grad():
            w_s = projection_coefficient(delta, g_s)
            torch._foreach_sub_(delta, torch._foreach_mul(g_s, w_s))
            w_p = projection_coefficient(delta, g_p)
            torch._foreach_sub_(params, torch._foreach_mul(g_s, w_s))
            torch._foreach_sub_(params, torch._foreach_mul(g_p, w_p))

    @staticmethod
    def _grads(
        module: nn.Module,
        names: list[str],
        values: list[Tensor],
        x: Tensor,
        loss_fn: Callable[[Tensor], Tensor],
    ) -> list[Tensor]:
        """Gradients of ``loss_fn(f(values; x))`` w.r.t. ``values`` (eval mode, no ``.grad`` touched)."""
        leaves = [v.detach().requires_grad_(True) for v in values]
        with frozen(module):
            logits = functional_call(module, dict(zip(names, leaves)), (x,))
        grads = torch.autograd.grad(loss_fn(logits), leaves, allow_unused=True)
        return [torch.zeros_like(v) if g is None else g for g, v in zip(grads, values)]

    def _params(
        self, module: nn.Module, optimizer: torch.optim.Optimizer, ctx: ClientContext
    ) -> tuple[list[str], list[Tensor], list[Tensor], list[Tensor]]:
        """Names, parameters, their global values ``theta^t`` and save buffers (built once per round)."""
        cached = ctx.scratch.get(_PARAMS)
        if cached is None:
            by_id = {id(p): n for n, p in module.named_parameters()}
            glob = ctx.message["weights"]
            params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
            names = [by_id[id(p)] for p in params]
            anchors = [glob[n].to(p.device, p.dtype) for n, p in zip(names, params)]
            cached = ctx.scratch[_PARAMS] = (names, params, anchors, [torch.empty_like(p) for p in params])
        return cached

    def extra_repr(self) -> str:
        return (
            f"gamma={self.gamma}, eta_s={self.eta_s}, eta_p={self.eta_p}, iters={self.iters}, "
            f"server_lr={self.server_lr}"
        )
