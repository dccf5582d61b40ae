"""FedRoD (Chen & Chao, ICLR 2022): a generic head under the balanced softmax, a personal head on top."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fl_lightning.api import ClientContext, RunSpec, Strategy, TensorBuffers, register_strategy
from fl_lightning.errors import ConfigError
from fl_lightning.functional.distillation import label_counts
from fl_lightning.functional.personalized import balanced_softmax_loss
from fl_lightning.functional.representation import FeatureTap, features_of, last_linear, linear_layer_names
from fl_lightning.functional.tensor import Payload, load_tensors, shared_state
from fl_lightning.strategies.side import SideSGD

#: Prefix of a client's personal head ``(W_P, b_P)`` in its state (names of the generic head's entries).
HEAD = "fedrod/"
_TAP, _LAST, _SIDE = "fedrod/tap", "fedrod/last", "fedrod/side"


@register_strategy
class FedRoD(Strategy):
    """FedRoD, Chen & Chao, "On Bridging Generic and Personalized Federated Learning for Image
    Classification" (ICLR 2022), Sec. 4 (Federated Robust Decoupling).

    The network's last ``nn.Linear`` is the generic head ``G`` on the body's features ``z``; each client
    also keeps a personal head ``P`` of the same shape (never communicated, starting from the initial
    generic head). At every local step, on the same mini-batch, the body and ``G`` take the client
    optimizer's step on the balanced softmax loss
    (:func:`~fl_lightning.functional.personalized.balanced_softmax_loss`, ``pi_k`` the client's class prior),

    .. math:: \\mathcal{L}_{BSM} = -\\log \\frac{\\pi_{k,y} e^{G(z)_y}}{\\sum_c \\pi_{k,c} e^{G(z)_c}},

    then ``P`` one SGD step on the cross-entropy of the summed logits with the body's features and the
    generic logits of that forward detached, ``CE(G(z).detach() + P(z.detach()), y)`` (with the round's
    learning rate and the client optimizer's momentum and weight decay). Body and ``G`` are averaged by the
    server (FedAvg); the global model is the generic model. The deployed model of a client predicts
    ``G(z) + P(z)``, i.e. the network with its last layer's weight and bias replaced by
    ``W_G + W_P`` and ``b_G + b_P``. The balanced softmax replaces the client module's task loss
    (its training loss is still reported as the plain task loss of ``G``); multiclass data only.

    Args:
        server_lr: Server learning rate on the pseudo-gradient (1: FedAvg's average).
    """

    name = "fedrod"
    changes_gradients = True
    deploys_personal_model = True
    prepares_clients = True

    def __init__(self, server_lr: float = 1.0) -> None:
        super().__init__(server_lr=server_lr)
        self.initial_head = TensorBuffers()

    def setup(self, model: nn.Module, num_clients: int) -> None:
        super().setup(model, num_clients)
        self.initial_head = TensorBuffers(_generic_head(model))

    def check(self, model: nn.Module, spec: RunSpec) -> None:
        super().check(model, spec)
        if spec.task.multilabel or not spec.integer_labels:
            raise ConfigError(
                "model.strategy=FedRoD needs single-label classification data (integer class labels: its "
                "balanced softmax is over classes); choose another strategy for this data"
            )

    def on_client_start(self, module: nn.Module, ctx: ClientContext) -> None:
        super().on_client_start(module, ctx)
        layer = last_linear(module)
        device = layer.weight.device
        initial = self.initial_head.as_dict()
        personal = {
            n: ctx.state.get(HEAD + n, t).detach().clone().to(device).requires_grad_(True)
            for n, t in initial.items()
        }
        counts = label_counts(ctx.data.train_labels(), layer.out_features).to(device)
        ctx.scratch[_SIDE] = (personal, SideSGD(list(personal.values())), counts.double().log())
        FeatureTap(module, ctx.scratch, _TAP)

    def local_loss(self, module: nn.Module, ctx: ClientContext, batch: Any, outputs: Tensor) -> Tensor | None:
        x, y = batch
        tap: FeatureTap = ctx.scratch[_TAP]
        z = tap.features_for(outputs) if outputs is not None else None
        if z is None:
            z, outputs = features_of(module, x)
        ctx.scratch[_LAST] = (z.detach(), outputs.detach(), y)
        _, _, log_prior = ctx.scratch[_SIDE]
        # the loop's loss is the task loss of these outputs: adding this term makes the objective L_BSM
        return balanced_softmax_loss(outputs, y, log_prior) - module.task_loss(outputs, y)

    def on_after_optimizer_step(
        self, module: nn.Module, optimizer: torch.optim.Optimizer, ctx: ClientContext
    ) -> None:
        z, generic, y = ctx.scratch.pop(_LAST)
        personal, sgd, _ = ctx.scratch[_SIDE]
        weight, bias = _weight_bias(module, personal)

        def loss() -> Tensor:
            return F.cross_entropy(generic + F.linear(z, weight, bias), y)

        sgd.step(module, ctx.lr, z.device, loss)

    def upload(self, module: nn.Module, ctx: ClientContext) -> Payload:
        FeatureTap.release(ctx.scratch, _TAP)
        personal, _, _ = ctx.scratch[_SIDE]
        ctx.state.update({HEAD + n: t.detach().clone() for n, t in personal.items()})
        return super().upload(module, ctx)

    def personalize(self, module: nn.Module, client_id: int, state: dict[str, Tensor]) -> None:
        super().personalize(module, client_id, state)
        generic = _generic_head(module)
        personal = {n: state[HEAD + n] for n in generic if HEAD + n in state}
        if personal:
            load_tensors(module, {n: generic[n] + personal[n].to(generic[n].device) for n in personal})


def _generic_head(module: nn.Module) -> dict[str, Tensor]:
    """The last linear layer's weight (and bias) under their state names, copied."""
    last_linear(module)  # a network without a linear layer: one clear error
    prefix = linear_layer_names(module)[-1]
    names = {f"{prefix}.weight", f"{prefix}.bias"}
    return {n: t.detach().clone() for n, t in shared_state(module).items() if n in names}


def _weight_bias(module: nn.Module, personal: dict[str, Tensor]) -> tuple[Tensor, Tensor | None]:
    prefix = linear_layer_names(module)[-1]
    return personal[f"{prefix}.weight"], personal.get(f"{prefix}.bias")
