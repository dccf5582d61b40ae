"""Personalised filter atoms (Chen & Qiu, ICML 2025, Sec. 4.1 and 6.3), on top of any strategy."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call

from fl_lightning.api import ClientContext, Strategy, StrategyWrapper, Vectorizable, register_strategy
from fl_lightning.functional.tensor import Payload, load_tensors
from fl_lightning.models.decomposed import atom_names
from fl_lightning.strategies.fedavg import FedAvg
from fl_lightning.strategies.side import SideSGD

log = logging.getLogger(__name__)

#: Prefix of the local atoms ``D_l`` in a client's state (not ``personal/``: they never replace ``D_g``
#: during training, only at evaluation).
LOCAL_ATOMS = "local_atoms/"


@register_strategy
class PersonalAtoms(StrategyWrapper):
    """Local filter atoms ``D_l`` per client, shared atom coefficients, on top of any strategy (Sec. 4.1).

    Each client keeps global atoms ``D_g`` (the model's ``...atoms``, trained and aggregated by the
    base strategy like every other parameter) and local atoms ``D_l`` (in its state, never uploaded).
    In a round where client ``k`` is selected it receives ``(alpha^t, D_g^t, theta_h^t)``, runs the base
    method's local training on the model, and also trains its local atoms on the same mini-batches
    with the received global coefficients and head held fixed::

        D_l,k <- D_l,k - eta_t * grad_{D_l,k} F_k(alpha^t, D_l,k, theta_h^t)

    (SGD with the round's learning rate and the client optimizer's momentum and weight decay). The two
    trainings touch disjoint tensors and the second sees only received values, so the global model's
    trajectory is exactly the base method's. Local atoms start from the global atoms the client first
    receives (``D_g^0`` for clients of round 0). The client's deployed model (per-client evaluation on
    its local test split, ``z_client/<id>/*`` and ``personal/*``) is ``(alpha^t, D_l,k, theta_h^t)``: the
    current global model with its atoms replaced by the client's local atoms; a client that never
    trained deploys the global model.

    The paper leaves open which head the personalised model uses and when ``D_l`` trains; here the
    global head and only the selected rounds (spec §3.1 [REC]). The personalised forward runs in train
    mode on copies of the received buffers (BatchNorm statistics of the model are not touched); the
    evaluated model uses the global BatchNorm statistics.

    Args:
        base: The strategy that trains and aggregates ``(alpha, D_g, theta_h)`` (default FedAvg).
    """

    name = "personal_atoms"
    steps_itself = True
    changes_gradients = True
    deploys_personal_model = True
    prepares_clients = True
    #: As its base, unless the model has atoms: the local atoms train by a forward of their own in
    #: ``local_step``.
    vectorizable = Vectorizable(
        unless=lambda strategy, module: (
            "PersonalAtoms trains each client's local atoms with a separate forward in local_step"
            if strategy._atoms
            else None
        )
    )

    def __init__(self, base: Strategy | None = None) -> None:
        super().__init__(FedAvg() if base is None else base)
        self._atoms: list[str] = []

    def setup(self, model: nn.Module, num_clients: int) -> None:
        super().setup(model, num_clients)
        self._atoms = atom_names(model)
        if not self._atoms:
            log.warning(
                "PersonalAtoms: the model has no DecomposedConv2d layer, so no client keeps local atoms; "
                "wrap model.client.init_args.net in fl_lightning.models.Decomposed"
            )

    def on_client_start(self, module: nn.Module, ctx: ClientContext) -> None:
        super().on_client_start(module, ctx)
        if not self._atoms:
            return
        received = {n: t.detach().clone() for n, t in module.named_parameters()}
        received.update({n: t.detach().clone() for n, t in module.named_buffers()})
        local = {
            n: ctx.state.get(LOCAL_ATOMS + n, received[n]).detach().clone().requires_grad_()
            for n in self._atoms
        }
        ctx.scratch["personal_atoms"] = _LocalAtoms(received, local)

    def local_step(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        ctx: ClientContext,
        batch: Any,
        closure: Callable[[], Tensor],
    ) -> None:
        super().local_step(module, optimizer, ctx, batch, closure)
        local: _LocalAtoms | None = ctx.scratch.get("personal_atoms")
        if local is not None:
            local.step(module, batch, ctx.lr)

    def upload(self, module: nn.Module, ctx: ClientContext) -> Payload:
        up = super().upload(module, ctx)
        local: _LocalAtoms | None = ctx.scratch.get("personal_atoms")
        if local is not None:
            ctx.state.update({LOCAL_ATOMS + n: t.detach().clone() for n, t in local.atoms.items()})
        return up

    def personalize(self, module: nn.Module, client_id: int, state: dict[str, Tensor]) -> None:
        super().personalize(module, client_id, state)
        load_tensors(module, {n: state[LOCAL_ATOMS + n] for n in self._atoms if LOCAL_ATOMS + n in state})


class _LocalAtoms:
    """A client's local atoms during one round, trained by :class:`SideSGD` with the received model
    held fixed."""

    def __init__(self, received: dict[str, Tensor], atoms: dict[str, Tensor]) -> None:
        self.received = received
        self.atoms = atoms
        self.sgd = SideSGD(list(atoms.values()))

    def step(self, module: nn.Module, batch: Any, lr: float) -> None:
        """One SGD step on ``F_k(alpha^t, D_l, theta_h^t)`` for the batch; leaves the global RNG as it was."""
        x, y = batch
        params = {**self.received, **self.atoms}
        self.sgd.step(
            module, lr, x.device, lambda: module.task_loss(functional_call(module, params, (x,)), y)
        )
