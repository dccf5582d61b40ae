"""SCAFFOLD (Karimireddy et al., 2020): control variates correct the client drift."""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from fl_lightning.api import (
    Aggregator,
    ClientContext,
    RoundInfo,
    Strategy,
    TensorBuffers,
    Vectorizable,
    register_strategy,
)
from fl_lightning.errors import ConfigError
from fl_lightning.functional.corrections import (
    add_grads_,
    fill_missing,
    scaffold_control_update,
    scaffold_step_correction_,
    trainable_parameters,
)
from fl_lightning.functional.tensor import Payload

#: ``ctx.state`` prefix of the client control variate ``c_i`` (one entry per trainable parameter).
CONTROL = "control/"
#: ``ctx.scratch`` key of the round's aligned lists ``(names, parameters, c - c_i)``.
TERMS = "scaffold/terms"
#: ``ctx.scratch`` keys of the raw-gradient running sum (optimizers other than plain SGD), its step
#: count, and the current step's raw gradients (kept from before the step until after it).
GRAD_SUM, GRAD_STEPS, _STEP_GRADS = "scaffold/grad_sum", "scaffold/grad_steps", "scaffold/step_grads"


def plain_sgd(optimizer: torch.optim.Optimizer) -> bool:
    """True for ``torch.optim.SGD`` without momentum: the model then moves by ``-lr`` times the gradient."""
    return type(optimizer) is torch.optim.SGD and all(g["momentum"] == 0 for g in optimizer.param_groups)


#: ``variate``: the client's new control variate (Alg. 1 line 12).
VARIATES = ("mean_gradient", "option_ii")
#: ``correction``: where ``c - c_i`` enters the local step (Alg. 1 line 10).
CORRECTIONS = ("in_gradient", "after_step")


@register_strategy
class Scaffold(Strategy):
    """SCAFFOLD, Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated
    Learning" (ICML 2020), Alg. 1 with option II.

    The server sends ``x`` and its control variate ``c`` (group ``"control"``); client ``i`` keeps
    ``c_i`` (``ctx.state["control/<name>"]``, zero until first sampled) and runs ``K`` steps of::

        y_i <- y_i - eta_l (g_i(y_i) + c - c_i)                          (Alg. 1 line 10)

    then computes its new variate ``c_i+`` (line 12, below) with the round's local learning rate
    ``eta_l`` (``ctx.lr``: the client's lr after ``model.lr_decay``) and its local steps ``K``
    (``ctx.num_steps``: the steps it ran, fewer under a system model's partial work), and uploads ``y_i``
    and ``Delta c_i = c_i+ - c_i``. The server (lines 16-17)::

        x <- x + eta_g mean_{i in S}(y_i - x)           (pseudo-gradient step; FedAvg weighting)
        c <- c + |S| / N * mean_{i in S} Delta c_i       (uniform mean over the aggregated clients)

    Two model-size vectors go each way per round (spec P10: SCAFFOLD costs 2x FedAvg). With zero
    variates (round 0) the correction is an exact ``+ 0``, so the first round equals FedAvg bit for
    bit.

    **The control variate** (``variate``). Alg. 1 line 12 offers option I, ``c_i+ = g_i(x)`` (a full
    gradient at the server model, an extra pass over the data), and option II, a closed form that reuses
    the local steps::

        c_i+ = c_i - c + (x - y_i) / (K eta_l)                            (option II)

    Under plain SGD (``momentum: 0``) ``x - y_i = eta_l sum_k (g_k + c - c_i)``, so option II is the
    mean of the local gradients along the trajectory, ``c_i+ = (1/K) sum_k g_k`` (weight decay's term
    ``lambda y_k`` included). With heavy-ball momentum, Nesterov, Adam or AdamW the model moves by the
    optimizer's buffers instead (with momentum 0.9 about ``1/(1 - 0.9) = 10`` times further once they fill
    up), and the two differ:

    - ``"mean_gradient"`` (default): ``c_i+ = (1/K) sum_k g_k``, each step's gradient without the
      correction ``c - c_i`` (the strategy's own local terms included, before clipping) added to a running
      sum; under plain SGD it is computed as option II, which it equals there, so plain SGD runs option
      II exactly as written.
    - ``"option_ii"``: option II's closed form under any local optimizer, as NIID-Bench's
      ``train_net_scaffold`` computes it with SGD momentum 0.9 (``K`` the batches it ran, ``eta_l`` its
      local lr; its server adds ``sum_{i in S} Delta c_i / N``, line 17 above). Under momentum the variate
      is then about ``1/(1 - beta)`` times the mean gradient.

    **Where the correction enters** (``correction``):

    - ``"in_gradient"`` (default): ``c - c_i`` is added to the gradient before the optimizer's step
      (``on_before_optimizer_step``, before clipping), so a momentum or adaptive optimizer transforms it
      with the gradient.
    - ``"after_step"``: the optimizer steps on the raw gradient, then ``y_i <- y_i - eta_l (c - c_i)``
      outside its momentum and weight decay, as NIID-Bench does.

    Under plain SGD without clipping both give the same steps (up to float rounding). With momentum, option
    II needs ``"after_step"``: with the correction inside the momentum, ``(x - y_i)/(K eta_l)`` amplifies
    ``c - c_i`` by about ``1/(1 - beta)`` each round, and the variates grow until training diverges.
    ``variate: option_ii`` with ``correction: after_step`` is SCAFFOLD as NIID-Bench runs it
    (``configs/heterogeneity/strategies/scaffold.yaml``).

    Args:
        server_lr: Global learning rate ``eta_g`` on the pseudo-gradient.
        variate: ``"mean_gradient"`` or ``"option_ii"`` (above).
        correction: ``"in_gradient"`` or ``"after_step"`` (above).
    """

    name = "scaffold"
    changes_gradients = True
    prepares_clients = True
    vectorizable = Vectorizable(scratch=(GRAD_SUM, GRAD_STEPS))  # c - c_i, the raw-gradient sum: elementwise

    def __init__(
        self,
        server_lr: float = 1.0,
        variate: Literal["mean_gradient", "option_ii"] = "mean_gradient",
        correction: Literal["in_gradient", "after_step"] = "in_gradient",
    ) -> None:
        super().__init__(server_lr=server_lr)
        choices = (("variate", variate, VARIATES), ("correction", correction, CORRECTIONS))
        for field, value, allowed in choices:
            if value not in allowed:
                raise ConfigError(
                    f"model.strategy.{field}={value!r} must be one of {', '.join(allowed)} "
                    "(NIID-Bench: variate=option_ii, correction=after_step)"
                )
        self.variate = variate
        self.correction = correction

    def setup(self, model: nn.Module, num_clients: int) -> None:
        super().setup(model, num_clients)
        self.control = TensorBuffers.zeros_like(
            {n: p.detach() for n, p in trainable_parameters(model).items()}
        )

    def message(self, model: nn.Module, client_id: int, round: int) -> Payload:
        return {**super().message(model, client_id, round), "control": self.control.as_dict()}

    # ------------------------------------------------------------------------------ client side
    def on_client_start(self, module: nn.Module, ctx: ClientContext) -> None:
        super().on_client_start(module, ctx)
        c = ctx.message["control"]
        named = trainable_parameters(module, c)
        server = [c[n] for n in named]
        client = fill_missing([ctx.state.get(CONTROL + n) for n in named], server)
        corrections = server if client is None else torch._foreach_sub(server, client)
        ctx.scratch[TERMS] = (list(named), list(named.values()), corrections)

    def on_before_optimizer_step(
        self, module: nn.Module, optimizer: torch.optim.Optimizer, ctx: ClientContext
    ) -> None:
        _, params, corrections = ctx.scratch[TERMS]
        if self.correction == "in_gradient":
            add_grads_(params, corrections)
        self.keep_step_gradients(optimizer, ctx)

    def keep_step_gradients(self, optimizer: torch.optim.Optimizer, ctx: ClientContext) -> None:
        """With ``variate="mean_gradient"`` and an optimizer other than plain SGD, keep this step's gradient
        without ``c - c_i`` (called after the corrections were added, if they go into the gradient; the
        last call before a step wins, as for a SAM-type step)."""
        if self.variate == "mean_gradient" and not plain_sgd(optimizer):
            _, params, corrections = ctx.scratch[TERMS]
            grads = [p.grad for p in params]
            if self.correction == "in_gradient":
                grads = torch._foreach_sub(grads, corrections)
            else:
                grads = [g.clone() for g in grads]
            ctx.scratch[_STEP_GRADS] = grads

    def on_after_optimizer_step(
        self, module: nn.Module, optimizer: torch.optim.Optimizer, ctx: ClientContext
    ) -> None:
        super().on_after_optimizer_step(module, optimizer, ctx)
        if self.correction == "after_step":
            _, params, corrections = ctx.scratch[TERMS]
            scaffold_step_correction_(params, corrections, ctx.lr)
        grads = ctx.scratch.pop(_STEP_GRADS, None)
        if grads is None:
            return
        total = ctx.scratch.get(GRAD_SUM)
        if total is None:
            ctx.scratch[GRAD_SUM] = grads
        else:
            torch._foreach_add_(total, grads)
        ctx.scratch[GRAD_STEPS] = ctx.scratch.get(GRAD_STEPS, 0) + 1

    def upload(self, module: nn.Module, ctx: ClientContext) -> Payload:
        payload = super().upload(module, ctx)
        c, x = ctx.message["control"], ctx.message["weights"]
        total = ctx.scratch.get(GRAD_SUM)
        delta = {}
        names, params, _ = ctx.scratch[TERMS]
        for i, (name, p) in enumerate(zip(names, params)):
            old = ctx.state.get(CONTROL + name)
            if total is None:  # option II (under plain SGD: the mean gradient)
                new = scaffold_control_update(old, c[name], x[name], p.detach(), ctx.num_steps, ctx.lr)
            else:  # the mean of the raw gradients, which option II equals under plain SGD
                new = total[i] / ctx.scratch[GRAD_STEPS]
            delta[name] = new if old is None else new - old
            ctx.state[CONTROL + name] = new
        return {**payload, "control": delta}

    # ------------------------------------------------------------------------------ server side
    def aggregator(self) -> Aggregator:
        """``x`` weighted by sample count (FedAvg's), the variates' ``Delta c_i`` uniformly (line 17)."""
        return Aggregator(weighting={"control": "uniform"})

    @torch.no_grad()
    def server_update(self, model: nn.Module, means: Payload, info: RoundInfo) -> None:
        super().server_update(model, means, info)
        # c <- c + |S|/N * mean_S(Delta c_i); |S| = the uniform weight total of the aggregated clients
        scale = info.weight_totals.get("control", 0.0) / info.num_clients
        for name, d in means.get("control", {}).items():
            self.control[name].add_(d, alpha=scale)

    def extra_repr(self) -> str:
        return f"server_lr={self.server_lr}, variate={self.variate!r}, correction={self.correction!r}"
