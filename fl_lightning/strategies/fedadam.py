"""FedAdam (Reddi et al., 2021): Adam on the server over the averaged client update."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn

from fl_lightning.api import Strategy, register_strategy
from fl_lightning.errors import ConfigError, check_number


class FedAdamOptimizer(torch.optim.Optimizer):
    """The server optimizer of FedAdam: Reddi et al. (ICLR 2021), Alg. 2, as a ``torch.optim.Optimizer``.

    It receives the FedOpt pseudo-gradient ``g_t = x_t - sum_k p_k w_k = -Delta_t`` in ``p.grad`` (the
    negative averaged client update, so that it minimises like every torch optimizer) and steps::

        m_t     = b1 m_{t-1} + (1 - b1) g_t                      m_{-1} = 0
        v_t     = b2 v_{t-1} + (1 - b2) g_t^2                    v_{-1} = tau^2
        x_{t+1} = x_t - eta_t m_t / (sqrt(v_t) + tau)

    With ``g_t = -Delta_t`` this is Alg. 2 verbatim (its ``m_t`` is ``-exp_avg``). ``v_{-1} = tau^2`` is
    the smallest value the algorithm's input ``v_{-1} >= tau^2`` allows. Without bias correction (the
    paper) ``eta_t = eta``; with it ``eta_t = eta sqrt(1 - b2^t) / (1 - b1^t)``, ``t`` the number of
    steps taken (1 at the first), which is Kingma & Ba's (2015) Sec. 2 ``alpha_t`` form and the
    correction Flower's FedAdam applies: ``tau`` stays added to the uncorrected ``sqrt(v_t)`` (unlike
    ``torch.optim.Adam``, which adds its eps to the corrected one).

    State per parameter (checkpointed with the optimizer): ``step`` (a CPU tensor, as in
    ``torch.optim.Adam``), ``exp_avg`` (``m``) and ``exp_avg_sq`` (``v``), created at its first step;
    parameters whose ``grad`` is None are left unchanged. The update uses multi-tensor (foreach) ops
    over each param group.

    Args:
        params: Parameters or param groups.
        lr: Server learning rate ``eta``.
        betas: Moment decay rates ``(b1, b2)``.
        eps: Adaptivity ``tau > 0``.
        bias_correction: Scale the step by Adam's bias correction (see above).
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 0.1,
        betas: tuple[float, float] = (0.9, 0.99),
        eps: float = 1e-3,
        bias_correction: bool = False,
    ) -> None:
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "bias_correction": bias_correction}
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """One server step on the pseudo-gradients in ``p.grad`` (optionally re-evaluated by ``closure``)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params, grads, ms, vs, steps = [], [], [], [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.full_like(
                        p, group["eps"] ** 2, memory_format=torch.preserve_format
                    )
                params.append(p)
                grads.append(p.grad)
                ms.append(state["exp_avg"])
                vs.append(state["exp_avg_sq"])
                steps.append(state["step"])
            if params:
                _fedadam_step(params, grads, ms, vs, steps, group)
        return loss


def _fedadam_step(
    params: list[Tensor],
    grads: list[Tensor],
    ms: list[Tensor],
    vs: list[Tensor],
    steps: list[Tensor],
    group: dict[str, Any],
) -> None:
    """The multi-tensor update of :class:`FedAdamOptimizer` for one param group (in place)."""
    b1, b2 = group["betas"]
    lr, eps = group["lr"], group["eps"]
    torch._foreach_add_(steps, 1.0)  # CPU tensors: no device sync
    torch._foreach_mul_(ms, b1)
    torch._foreach_add_(ms, grads, alpha=1.0 - b1)
    torch._foreach_mul_(vs, b2)
    torch._foreach_addcmul_(vs, grads, grads, value=1.0 - b2)
    denom = torch._foreach_sqrt(vs)
    torch._foreach_add_(denom, eps)
    direction = torch._foreach_div(ms, denom)
    if group["bias_correction"]:
        rates = [-lr * math.sqrt(1.0 - b2**t) / (1.0 - b1**t) for t in (s.item() for s in steps)]
    else:
        rates = [-lr] * len(params)
    if all(r == rates[0] for r in rates):
        torch._foreach_add_(params, direction, alpha=rates[0])
    else:  # parameters that skipped rounds (grad None) have smaller step counts
        for p, d, r in zip(params, direction, rates, strict=True):
            p.add_(d, alpha=r)


@register_strategy
class FedAdam(Strategy):
    """FedAdam, Reddi et al., "Adaptive Federated Optimization" (ICLR 2021), Alg. 2.

    The clients train as in FedAvg. With ``Delta_t = sum_k p_k w_k - x_t`` the averaged client update
    (the negative FedOpt pseudo-gradient), the server keeps two model-size moments and steps::

        m_t     = b1 m_{t-1} + (1 - b1) Delta_t                  m_{-1} = 0
        v_t     = b2 v_{t-1} + (1 - b2) Delta_t^2                v_{-1} = tau^2
        x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)

    exactly as Alg. 2 writes it: by default no bias correction, and ``v_{-1} = tau^2``, the smallest
    value the algorithm's input ``v_{-1} >= tau^2`` allows. The server optimizer is
    :class:`FedAdamOptimizer` (``lr = eta``), so ``m``, ``v`` and the step count are optimizer state
    (checkpointed by Lightning) and LearningRateMonitor sees ``eta``.
    The FedSMOO paper (Sec. 5.1) uses ``eta = 0.1``; its reference code ``tau = 0.01``.

    Args:
        server_lr: Server learning rate ``eta``.
        betas: Moment decay rates ``(b1, b2)``, each in [0, 1).
        eps: Adaptivity ``tau > 0`` (added to ``sqrt(v)``).
        bias_correction: Scale the step by Adam's bias correction,
            ``eta_t = eta sqrt(1 - b2^t) / (1 - b1^t)`` at server step ``t = 1, 2, ...`` (as Flower's
            FedAdam does); false (default) is the paper's Alg. 2.
    """

    name = "fedadam"
    vectorizable = True  # FedAvg's clients; Adam on the server

    def __init__(
        self,
        server_lr: float = 0.1,
        betas: tuple[float, float] = (0.9, 0.99),
        eps: float = 1e-3,
        bias_correction: bool = False,
    ) -> None:
        super().__init__(server_lr=server_lr)
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):  # NaN fails the chained test
            raise ConfigError(
                f"model.strategy.betas={list(betas)} must be two values in [0, 1), e.g. [0.9, 0.99]"
            )
        check_number(
            eps, "model.strategy.eps", low=0, low_open=True, hint="(tau of Reddi et al.); e.g. 0.001"
        )
        self.betas = (float(betas[0]), float(betas[1]))
        self.eps = eps
        self.bias_correction = bias_correction

    def configure_server_optimizer(self, params: list[nn.Parameter]) -> torch.optim.Optimizer:
        """:class:`FedAdamOptimizer` over the global parameters (it receives the pseudo-gradient)."""
        return FedAdamOptimizer(
            params, lr=self.server_lr, betas=self.betas, eps=self.eps, bias_correction=self.bias_correction
        )

    def extra_repr(self) -> str:
        return (
            f"server_lr={self.server_lr}, betas={self.betas}, eps={self.eps}, "
            f"bias_correction={self.bias_correction}"
        )
