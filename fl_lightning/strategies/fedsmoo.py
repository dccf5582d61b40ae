"""FedSMOO (Sun et al., ICML 2023): dynamic regularisation plus SAM with a global perturbation."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from fl_lightning.api import ClientContext, RoundInfo, TensorBuffers, Vectorizable, register_strategy
from fl_lightning.errors import ConfigError, check_number
from fl_lightning.functional.corrections import trainable_parameters
from fl_lightning.functional.sharpness import Grads, sam_offsets
from fl_lightning.functional.tensor import Payload
from fl_lightning.strategies.feddyn import FedDyn
from fl_lightning.strategies.mixins.sharpness import SAM_PARAMS, SharpnessAware, check_sam_args

MU = "fedsmoo/mu/"
LAST = "fedsmoo/last_offsets"
GROUP = "perturbation"
_LISTS = "fedsmoo/lists"


@register_strategy
class FedSMOO(SharpnessAware, FedDyn):
    """FedSMOO, Sun et al., "Dynamic Regularized Sharpness Aware Minimization in Federated Learning:
    Approaching Global Consistency and Smooth Landscape", ICML 2023, Sec. 4.1, Algorithm 1 (alpha = 1).

    The FedDyn model dual ``lambda_i`` (Sec. 4.1.2, eqs. 12-13; :class:`FedDyn` with ``alpha = 1/beta``)
    plus SAM whose perturbation is corrected towards one global perturbation ``s`` (Sec. 4.1.1,
    eqs. 9-11) through a per-client dual ``mu_i``. Client ``i`` receives ``w^t`` and ``s^t`` and at each
    local step ``k`` on mini-batch ``xi`` (Alg. 1 lines 7-11)::

        g      = grad f_i(w_k; xi)
        d      = g - mu_i - s                  s_hat_k = r * d / (||d|| + 1e-7)   (one global norm)
        mu_i  <- mu_i + s_hat_k - s                                              (line 9)
        g_hat  = grad f_i(w_k + s_hat_k; xi)                                      (same batch, line 10)
        w_k+1  = w_k - eta [ clip(g_hat - lambda_i + (w_k - w^t) / beta) + wd w_k ]  (line 11)

    then ``lambda_i <- lambda_i - (w_K - w^t) / beta`` (line 14, by :class:`FedDyn`) and it uploads
    ``w_K`` and ``s~_i``. The server updates the model as FedDyn (lines 18-19:
    ``lambda <- lambda - sum_S (w_i - w^t) / (beta m)``, ``w^{t+1} = mean_S w_i - beta lambda``) and the
    global perturbation (line 17) ``s^{t+1} = r * mean_S s~_i / ||mean_S s~_i||`` (plain mean over the
    clients of the round, ``s^0 = 0``), with

    - ``s_rule="paper"``: ``s~_i = mu_i - s_hat_{K-1}`` (Alg. 1 line 13, the last perturbation computed);
    - ``s_rule="simulator"``: ``s~_i = mu_i`` (the reference code, FL-Simulator v2.0, which drops the
      ``s_hat`` term; spec §1.7 and P18).

    Per round each client receives two model-size vectors (``w``, ``s``) and sends two (``w_i``,
    ``s~_i``), 2x FedAvg (Sec. 5.2, Table 3). Persistent client state: ``lambda_i`` and ``mu_i``
    (zero-initialised, kept by the client state store off the accelerator); server state: ``lambda``
    (FedDyn) and ``s``, both checkpointed. With ``rho = 0``: ``s_hat = mu = s = 0``
    and the trajectory is FedDyn's with ``alpha = 1/beta`` (spec P7).

    Choices where the paper is silent (spec §1.6-1.7): the gradient of the ascent is the task loss only
    and both passes use the same mini-batch (as the reference); weight decay is applied by the optimizer
    and not clipped; ``clip_norm`` clips ``g_hat`` plus the FedDyn correction (the reference clips at 10
    and keeps ``w / beta`` in the unclipped weight decay, here it is clipped with the rest); the
    penalty of the perturbation constraint (the paper's alpha, eq. 9) is 1 as in Alg. 1 (``self.alpha``
    is FedDyn's ``1/beta``).

    Args:
        beta: Penalty coefficient ``beta`` of the model constraint; the prox coefficient is ``1/beta``
            (10 on CIFAR-10, 100 on CIFAR-100, Sec. 5.1).
        rho: SAM radius ``r`` of the perturbations (0.1 in the paper).
        s_rule: Server rule of the global perturbation: ``"paper"`` (Alg. 1 line 17) or
            ``"simulator"`` (the reference code).
        clip_norm: Clip each step's gradient to this global norm (the reference: 10); None: no clipping.
        server_lr: Server learning rate (1 in the paper; used as in :class:`FedDyn`).
    """

    name = "fedsmoo"
    vectorizable = Vectorizable(scratch=(LAST,))  # per-client norms through ctx.stacked; mu_i in ctx.state

    def __init__(
        self,
        beta: float = 10.0,
        rho: float = 0.1,
        s_rule: Literal["paper", "simulator"] = "paper",
        clip_norm: float | None = 10.0,
        server_lr: float = 1.0,
    ) -> None:
        check_number(
            beta,
            "model.strategy.beta",
            low=0,
            low_open=True,
            hint="(prox coefficient 1/beta); the paper uses 10",
        )
        if s_rule not in ("paper", "simulator"):
            raise ConfigError(f"model.strategy.s_rule={s_rule!r} must be 'paper' or 'simulator'")
        super().__init__(alpha=1.0 / beta, server_lr=server_lr)
        check_sam_args(rho, clip_norm)
        self.beta = beta
        self.rho = rho
        self.s_rule = s_rule
        self.clip_norm = clip_norm

    def setup(self, model: nn.Module, num_clients: int) -> None:
        super().setup(model, num_clients)
        self.perturbation = TensorBuffers.zeros_like(
            {n: p.detach() for n, p in trainable_parameters(model).items()}
        )

    # ---------------------------------------------------------------------------- server -> client
    def message(self, model: nn.Module, client_id: int, round: int) -> Payload:
        return {**super().message(model, client_id, round), GROUP: self.perturbation.as_dict()}

    # ---------------------------------------------------------------------------------- client side
    def _duals(self, ctx: ClientContext, names: list[str], like: Grads) -> tuple[list[Tensor], list[Tensor]]:
        """``(mu_i, s)`` as lists aligned with ``names``, built once per client and round.

        ``mu_i`` starts at zero for a client never sampled (materialised in ``ctx.state`` like the
        gradients ``like``, so stacked with them for vectorised clients; updated in place at every step).
        Rebuilt only if a step hands over another list of names (a parameter without a gradient in that
        step's first pass).
        """
        cached = ctx.scratch.get(_LISTS)
        if cached is not None and cached[0] is names:
            return cached[1], cached[2]
        s = [ctx.message[GROUP][n] for n in names]
        for n, t in zip(names, like):
            if MU + n not in ctx.state:
                ctx.state[MU + n] = torch.zeros_like(t)
        mu = [ctx.state[MU + n] for n in names]
        ctx.scratch[_LISTS] = (names, mu, s)
        return mu, s

    @torch.no_grad()
    def ascent_direction(
        self, module: nn.Module, ctx: ClientContext, names: list[str], grads: Grads
    ) -> Grads:
        mu, s = self._duals(ctx, names, grads)
        return torch._foreach_sub(grads, torch._foreach_add(mu, s))  # d = g - (mu_i + s)

    @torch.no_grad()
    def on_perturbation(
        self, module: nn.Module, ctx: ClientContext, names: list[str], offsets: Grads
    ) -> None:
        mu, s = self._duals(ctx, names, offsets)
        torch._foreach_add_(mu, torch._foreach_sub(offsets, s))  # mu_i <- mu_i + (s_hat - s), line 9
        ctx.scratch[LAST] = (names, offsets)

    def upload(self, module: nn.Module, ctx: ClientContext) -> Payload:
        up = super().upload(module, ctx)
        names = ctx.scratch[SAM_PARAMS][1] if SAM_PARAMS in ctx.scratch else list(ctx.message[GROUP])
        last_names, last_offsets = ctx.scratch.get(LAST, ([], []))
        last = dict(zip(last_names, last_offsets))
        s_tilde: dict[str, Tensor] = {}
        for n in names:
            mu = ctx.state.get(MU + n)
            if mu is None:
                mu = torch.zeros_like(ctx.message[GROUP][n])
                ctx.state[MU + n] = mu
            e = last.get(n)
            s_tilde[n] = mu - e if self.s_rule == "paper" and e is not None else mu
        up[GROUP] = s_tilde
        return up

    # ---------------------------------------------------------------------------------- server side
    @torch.no_grad()
    def on_after_server_step(self, model: nn.Module, means: Payload, info: RoundInfo) -> None:
        super().on_after_server_step(model, means, info)
        names = self.perturbation.keys()
        s = sam_offsets([means[GROUP][n] for n in names], self.rho)  # r * mean / (||mean|| + 1e-7)
        for n, value in zip(names, s):
            self.perturbation[n].copy_(value)

    def extra_repr(self) -> str:
        return (
            f"beta={self.beta}, rho={self.rho}, s_rule={self.s_rule!r}, clip_norm={self.clip_norm}, "
            f"server_lr={self.server_lr}"
        )
