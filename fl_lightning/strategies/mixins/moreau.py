"""Moreau-envelope personalisation: the bi-level client loop that pFedMe and TDPFed share.

pFedMe (Dinh et al., "Personalized Federated Learning with Moreau Envelopes", NeurIPS 2020, Alg. 1) and
TDPFed (Wang et al., Sec. V-A and Alg. 1) give client ``k`` a dense personalised model ``theta_k`` tied
to its local model ``w_k`` by ``lam/2 ||theta_k - W(w_k)||^2``, where ``W`` maps the local model to dense
weights: the identity for dense layers (pFedMe) and the CP reconstruction ``[[A]]`` for factored layers
(TDPFed, eq. 4). In every global round client ``k`` runs::

    w_k <- w_t,  theta_k <- W(w_t)                                   (round reset)
    for t' = 1..tau                 (tau = model.local_steps; one mini-batch B per local round)
        s times:  theta_k <- step on  f_k(theta_k; B) + lam/2 ||theta_k - W(w_k)||^2     (eqs. 13/15;
                                       W(w_k) held fixed; SGD/Nesterov, lr eta_p)
        outer:    w_k <- fit to theta~_k: one GD step w - eta*lam*(w - theta~) (pFedMe)
                                          or s' optimizer steps on lam/2 ||theta~ - [[A]]||^2 (TDPFed)
    upload w_k;  theta~_k stays on the client (its personalised model)

The dense model ``theta`` has the keys of :func:`~fl_lightning.models.cp.dense_weights` and is run on
the client module with :func:`torch.func.functional_call`. Its optimizer state (Nesterov momentum)
and the local optimizer's state live for one global round, as the loop's client optimizer does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from fl_lightning.api import ClientContext, Strategy
from fl_lightning.errors import ConfigError, check_number
from fl_lightning.functional.moreau import personal_steps, squared_distance
from fl_lightning.functional.tensor import Payload
from fl_lightning.models.cp import DenseView, clear_dense_weights, dense_weights, set_dense_weights

#: Prefix of the personalised model ``theta~_k`` in a client's state (kept for evaluation only).
THETA = "theta/"
#: ``ctx.scratch`` key of the round's :class:`PersonalModel`.
SCRATCH = "moreau"


def fit_loss(
    module: nn.Module, theta: dict[str, Tensor], lam: float, view: DenseView | None = None
) -> Tensor:
    """The outer objective ``lam/2 ||theta - W(w)||^2`` as a function of ``module``'s parameters (eq. 14).

    Touches no data: the gradient w.r.t. the factors depends on ``theta`` and ``A`` only (eq. 25).
    ``view``: a cached :class:`DenseView` of ``module`` (built here if None).
    """
    dense = (view or DenseView(module))()
    return 0.5 * lam * squared_distance({n: t.detach() for n, t in theta.items()}, dense)


@dataclass
class PersonalModel:
    """A client's personalised model during one round and what trains it."""

    theta: dict[str, Tensor]
    view: DenseView
    lr0: float = 0.0
    optimizer: torch.optim.Optimizer | None = None


class MoreauEnvelope(Strategy):
    """The pFedMe client loop with a pluggable outer step; pFedMe's own step by default.

    Server: ``w_{t+1} = (1 - beta) w_t + beta * sum_k p_k w_k`` (pFedMe Alg. 1 line 11), i.e. the FedOpt
    step with server learning rate ``beta``. Client: the loop of the module docstring; the default
    :meth:`outer_step` is pFedMe's ``w <- w - eta * lam * (w - theta~)`` (Alg. 1 line 8, ``eta`` = the
    client's learning rate after decay), taken as one gradient step on :func:`fit_loss` so it also
    applies to CP-factored layers. Personalised evaluation (``z_client/<id>/*``, ``personal/*``) runs
    ``theta~_k`` of the client's last round on its local test split; a client that never trained
    deploys the global model.

    Args:
        lam: ``lambda >= 0``, weight of ``lam/2 ||theta - W(w)||^2``.
        personal_lr: ``eta_p``, learning rate of the personalised model.
        personal_steps: ``s`` (pFedMe's ``K``), steps on ``theta`` per local round.
        personal_momentum: Momentum of the ``theta`` optimizer; > 0 uses Nesterov's (TDPFed), 0 plain GD
            (pFedMe).
        beta: Server mixing ``beta > 0`` (1: plain weighted average; > 1 extrapolates).
    """

    steps_itself = True
    changes_gradients = True
    deploys_personal_model = True
    prepares_clients = True

    def __init__(
        self,
        lam: float = 15.0,
        personal_lr: float = 0.1,
        personal_steps: int = 5,
        personal_momentum: float = 0.0,
        beta: float = 1.0,
    ) -> None:
        check_number(beta, "model.strategy.beta", low=0, low_open=True, hint="(1.0: plain averaging)")
        super().__init__(server_lr=beta)
        check_number(lam, "model.strategy.lam", low=0, hint="(the papers use 12-15)")
        check_number(personal_lr, "model.strategy.personal_lr", low=0, low_open=True)
        if personal_steps < 1:
            raise ConfigError(f"model.strategy.personal_steps={personal_steps} must be >= 1 (papers: 5)")
        check_number(personal_momentum, "model.strategy.personal_momentum", low=0, high=1, high_open=True)
        self.lam = lam
        self.beta = beta
        self.personal_lr = personal_lr
        self.personal_steps = personal_steps
        self.personal_momentum = personal_momentum

    # --------------------------------------------------------------------------------- client side
    def initial_theta(self, module: nn.Module, ctx: ClientContext) -> dict[str, Tensor]:
        """The personalised model at the start of a round: ``W(w_t)`` (the received model, dense)."""
        return {n: t.detach() for n, t in dense_weights(module).items()}

    def on_client_start(self, module: nn.Module, ctx: ClientContext) -> None:
        super().on_client_start(module, ctx)
        clear_dense_weights(module)
        theta = {n: t.clone().requires_grad_(True) for n, t in self.initial_theta(module, ctx).items()}
        ctx.scratch[SCRATCH] = PersonalModel(theta, DenseView(module))

    def configure_client_optimizer(self, module: nn.Module, ctx: ClientContext) -> torch.optim.Optimizer:
        optimizer = super().configure_client_optimizer(module, ctx)
        ctx.scratch[SCRATCH].lr0 = optimizer.param_groups[0]["lr"]
        return optimizer

    def local_step(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        ctx: ClientContext,
        batch: Any,
        closure: Callable[[], Tensor],
    ) -> None:
        """One local round ``t'``: ``s`` steps on ``theta`` with this batch, then :meth:`outer_step`."""
        p: PersonalModel = ctx.scratch[SCRATCH]
        if p.optimizer is None:
            decay = ctx.lr / p.lr0 if p.lr0 else 1.0  # the loop's per-round lr decay, applied to eta_p too
            m = self.personal_momentum
            p.optimizer = torch.optim.SGD(
                list(p.theta.values()), lr=self.personal_lr * decay, momentum=m, nesterov=m > 0
            )
        with torch.no_grad():
            reference = p.view()
        outputs, loss = personal_steps(
            module, p.theta, reference, batch, p.optimizer, self.lam, self.personal_steps
        )
        track = getattr(module, "_track_train", None)  # ClientModule's train statistics (theta's loss)
        if track is not None:
            track(outputs, batch[1].to(outputs.device), loss)
        self.outer_step(module, optimizer, ctx, p)

    def outer_step(
        self, module: nn.Module, optimizer: torch.optim.Optimizer, ctx: ClientContext, personal: PersonalModel
    ) -> None:
        """pFedMe's local-model update ``w <- w - eta * grad_w lam/2 ||theta~ - W(w)||^2`` (one GD step)."""
        params = [q for q in module.parameters() if q.requires_grad]
        loss = fit_loss(module, personal.theta, self.lam, personal.view)
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        pairs = [(q, g) for q, g in zip(params, grads) if g is not None]
        if pairs:
            with torch.no_grad():  # one multi-tensor step
                torch._foreach_add_([q for q, _ in pairs], [g for _, g in pairs], alpha=-ctx.lr)

    def upload(self, module: nn.Module, ctx: ClientContext) -> Payload:
        p: PersonalModel = ctx.scratch[SCRATCH]
        ctx.state.update({THETA + n: t.detach().clone() for n, t in p.theta.items()})
        return super().upload(module, ctx)

    def personalize(self, module: nn.Module, client_id: int, state: dict[str, Tensor]) -> None:
        """Deploy ``theta~_k``: dense weights into the CP layers' slots, other parameters loaded."""
        super().personalize(module, client_id, state)
        clear_dense_weights(module)
        theta = {k[len(THETA) :]: v for k, v in state.items() if k.startswith(THETA)}
        if theta:
            set_dense_weights(module, theta)

    def extra_repr(self) -> str:
        return (
            f"lam={self.lam}, personal_lr={self.personal_lr}, personal_steps={self.personal_steps}, "
            f"personal_momentum={self.personal_momentum}, beta={self.beta}"
        )
