"""TDPFed (Wang et al.): tensor-decomposition based personalised FL, with AFM or ACT aggregation."""

from __future__ import annotations

import logging
from typing import Literal

import torch
from torch import Tensor, nn

from fl_lightning.api import Aggregator, ClientContext, RoundInfo, register_strategy
from fl_lightning.errors import ConfigError
from fl_lightning.functional.cp import cp_als, cp_reconstruct
from fl_lightning.functional.tensor import Payload, load_tensors, pseudo_gradient
from fl_lightning.models.cp import DENSE, cp_layers, dense_weights
from fl_lightning.strategies.mixins.moreau import MoreauEnvelope, PersonalModel, fit_loss

log = logging.getLogger(__name__)


@register_strategy
class TDPFed(MoreauEnvelope):
    """TDPFed, Wang et al., "Tensor Decomposition based Personalized Federated Learning", Alg. 1.

    The global and local models are CP-factored (``CPLinear``/``CPConv2d``, e.g. ``DNN(ratio=2)``); each
    client also has a dense personalised model ``theta_k``. Local objective (eq. 4):

    .. math:: F_k(A) = \\min_{\\theta} f_k(\\theta) + \\frac{\\lambda}{2} \\lVert \\theta - [[A]] \\rVert^2

    Client ``k`` in round ``t`` (Sec. V-A): ``A_k <- A_t``, ``theta_k <- [[A_t]]``; then ``tau``
    (``model.local_steps``) local rounds, each on one mini-batch ``B``: ``s`` (``personal_steps``)
    gradient steps at ``eta_p`` (``personal_lr``) on ``f_k(theta; B) + lam/2 ||theta - [[A_k]]||^2``
    (eq. 15; Nesterov's with ``personal_momentum > 0``, see below), then ``s'`` (``factor_steps``)
    steps of the client optimizer (the paper: Adam at ``eta`` = ``model.client.init_args.lr``) on
    ``lam/2 ||theta~_k - [[A_k]]||^2`` (eqs. 14, 19, 25: all factors at once, by autograd, which
    equals the closed-form gradient; no data is touched). Clients upload
    their factors ``A_{k,t,tau}``; ``theta~_k`` stays on the client as its personalised model.

    Server, ``aggregation``:

    * ``"afm"`` (eq. 20): ``A_{t+1}^(n) = (1 - beta) A_t^(n) + beta sum_k (|B_k| / sum_j |B_j|) A_k^(n)``
      per layer and mode; all clients use the same batch size, so the weights are uniform
      (``afm_weights="samples"`` uses ``|D_k|`` instead, a deviation). Factors down, factors up.
    * ``"act"`` (eqs. 21-22): the server composes ``[[A_k]]`` from each upload and forms
      ``w~_{t+1} = (1 - beta) [[A_t]] + beta sum_k (|D_k| / sum_j |D_j|) [[A_k]]``, then re-fits rank-R
      factors by ``act_sweeps`` ALS sweeps warm-started from the ``|D_k|``-weighted factor average.
      The paper leaves the re-fit open (eq. 22 only states ``w~_{t+1} ~ [[A_{t+1}]]``);
      this choice is ours: ALS (exact least squares per factor, Gauss-Seidel over the modes) never
      increases ``||w~_{t+1} - [[A]]||`` from its warm start, so the re-fit is at least as close as
      the factor average; ``act_sweeps=0`` keeps that average (the effect of the sweeps is measured
      in recipes/tdpfed/README.md). It
      broadcasts the factors and ``w~_{t+1}``, which becomes ``theta_k`` (Sec. V-A), so the downlink
      also carries the dense CP-layer weights; uplink is factors only.

    The inner solver: Sec. V-A names "gradient descent (resp. Nesterov's accelerated gradient
    descent)" for the ``s`` steps and Sec. VII-A says the experiments use Nesterov's, with no momentum
    value. The default ``personal_momentum=0`` is plain gradient descent (pFedMe's step, and the
    first of the two solvers the analysis names); ``personal_momentum > 0`` is ``torch.optim.SGD``
    with that Nesterov momentum, a value of ours (the CPU recipe measures 0.5; recipes/tdpfed).

    Biases and every other non-factored parameter (the paper does not say; spec §1.2) are treated as
    identity "factors": ``theta`` has its own copy, pulled by the same ``lam`` term, fitted to ``theta~``
    by the same ``s'`` optimizer steps and averaged like the factors. Only the sampled clients train
    in a round (the paper trains all ``K`` and aggregates ``S``; its experiments use ``S = K``).

    Args:
        aggregation: ``"afm"`` (average factor matrices) or ``"act"`` (average composed tensors).
        lam: ``lambda`` (MNIST 12, CIFAR-10 14).
        beta: ``beta`` (1.0; Table IV: 1.4, 1.8).
        personal_lr: ``eta_p`` (MNIST 0.08, CIFAR-10 0.03).
        personal_steps: ``s`` (MNIST 5, CIFAR-10 4).
        factor_steps: ``s'`` (MNIST 17, CIFAR-10 15).
        personal_momentum: Nesterov momentum of the ``theta`` steps; 0 (default) is plain gradient
            descent. The paper names Nesterov's method without a momentum value; any value > 0 is ours.
        afm_weights: ``"batch"`` (the paper's ``|B_k|``) or ``"samples"`` (``|D_k|``) for AFM.
        act_sweeps: ALS sweeps of ACT's server-side CP re-fit.
    """

    name = "tdpfed"

    def __init__(
        self,
        aggregation: Literal["afm", "act"] = "afm",
        lam: float = 12.0,
        beta: float = 1.0,
        personal_lr: float = 0.08,
        personal_steps: int = 5,
        factor_steps: int = 17,
        personal_momentum: float = 0.0,
        afm_weights: Literal["batch", "samples"] = "batch",
        act_sweeps: int = 10,
    ) -> None:
        super().__init__(lam, personal_lr, personal_steps, personal_momentum, beta)
        if aggregation not in ("afm", "act"):
            raise ConfigError(f"model.strategy.aggregation={aggregation!r} must be 'afm' or 'act'")
        if factor_steps < 1:
            raise ConfigError(f"model.strategy.factor_steps={factor_steps} must be >= 1 (paper: 15-17)")
        if afm_weights not in ("batch", "samples"):
            raise ConfigError(f"model.strategy.afm_weights={afm_weights!r} must be 'batch' or 'samples'")
        if act_sweeps < 0:
            raise ConfigError(f"model.strategy.act_sweeps={act_sweeps} must be >= 0")
        self.aggregation = aggregation
        self.factor_steps = factor_steps
        self.afm_weights = afm_weights
        self.act_sweeps = act_sweeps
        self._layers: dict[str, int] = {}

    # ------------------------------------------------------------------------------------- setup
    def setup(self, model: nn.Module, num_clients: int) -> None:
        super().setup(model, num_clients)
        layers = cp_layers(model)
        self._layers = {name: len(layer.factors) for name, layer in layers.items()}
        if not layers:
            log.warning(
                "TDPFed: the model has no CP layer (CPLinear/CPConv2d), so it runs dense, as pFedMe with "
                "%d optimizer steps per local round; use e.g. fl_lightning.models.DNN(ratio=2.0)",
                self.factor_steps,
            )
        if self.aggregation == "act":
            for name, layer in layers.items():
                self.register_buffer(_buffer(name), layer.reconstruct().detach().clone())

    def configure_server_optimizer(self, params: list[nn.Parameter]) -> torch.optim.Optimizer:
        """AFM: ``SGD(lr=beta)`` on ``A_t - mean_k A_k``; ACT: ``SGD(lr=1)`` to the re-fitted factors."""
        return torch.optim.SGD(params, lr=self.beta if self.aggregation == "afm" else 1.0)

    # ---------------------------------------------------------------------------- server -> client
    def message(self, model: nn.Module, client_id: int, round: int) -> Payload:
        msg = super().message(model, client_id, round)
        if self.aggregation == "act" and self._layers:
            msg["tensor"] = {f"{name}.{DENSE}": getattr(self, _buffer(name)) for name in self._layers}
        return msg

    # ------------------------------------------------------------------------------- client side
    def initial_theta(self, module: nn.Module, ctx: ClientContext) -> dict[str, Tensor]:
        """``[[A_t]]`` (AFM), or the broadcast averaged tensor ``w~_t`` for the CP layers (ACT)."""
        theta = {n: t.detach() for n, t in dense_weights(module).items()}
        theta.update(ctx.message.get("tensor", {}))
        return theta

    def outer_step(
        self, module: nn.Module, optimizer: torch.optim.Optimizer, ctx: ClientContext, personal: PersonalModel
    ) -> None:
        """``s'`` client-optimizer steps on ``lam/2 ||theta~ - [[A]]||^2`` (eq. 19 with Adam)."""
        for _ in range(self.factor_steps):
            optimizer.zero_grad(set_to_none=True)
            fit_loss(module, personal.theta, self.lam, personal.view).backward()
            optimizer.step()

    # ------------------------------------------------------------------------------- server side
    def aggregator(self) -> Aggregator:
        """AFM: the factors averaged uniformly (``|B_k|``, ``afm_weights="batch"``) or by ``|D_k|``; ACT: by
        ``|D_k|``, with the composed tensors of each upload (:meth:`compose`)."""
        if self.aggregation == "act":
            return Aggregator(receive=self.compose)
        return Aggregator(weighting="uniform" if self.afm_weights == "batch" else "samples")

    def compose(self, upload: Payload) -> Payload:
        """ACT: add the composed tensors ``[[A_k]]`` of the uploaded factors (server-side, not sent)."""
        weights = upload["weights"]
        composed = {
            f"{name}.{DENSE}": cp_reconstruct([weights[f"{name}.factors.{i}"] for i in range(n)])
            for name, n in self._layers.items()
        }
        return {**upload, "composed": composed}

    @torch.no_grad()
    def server_update(self, model: nn.Module, means: Payload, info: RoundInfo) -> None:
        """AFM: the FedOpt step (``beta`` is the server lr). ACT: compose, average, re-fit."""
        if self.aggregation == "afm":
            super().server_update(model, means, info)
            return
        weights, composed = means["weights"], means.get("composed", {})
        beta = self.beta
        params = dict(model.named_parameters())
        targets = {n: (1 - beta) * params[n].detach() + beta * v for n, v in weights.items() if n in params}
        for name, n in self._layers.items():
            layer = model.get_submodule(name)
            omega = (1 - beta) * layer.reconstruct() + beta * composed[f"{name}.{DENSE}"]
            keys = [f"{name}.factors.{i}" for i in range(n)]
            refit = cp_als(omega, [targets[k] for k in keys], self.act_sweeps)
            targets.update(zip(keys, refit))
            getattr(self, _buffer(name)).copy_(omega)
        for name, grad in pseudo_gradient(params, targets).items():
            params[name].grad = grad.to(params[name].dtype)
        load_tensors(model, {n: v for n, v in weights.items() if n not in params})

    def extra_repr(self) -> str:
        return (
            f"aggregation={self.aggregation}, {super().extra_repr()}, factor_steps={self.factor_steps}, "
            f"afm_weights={self.afm_weights}, act_sweeps={self.act_sweeps}"
        )


def _buffer(layer: str) -> str:
    """Buffer name of ACT's averaged tensor of a CP layer (dots are not allowed in buffer names)."""
    return "act_tensor__" + layer.replace(".", "__")
