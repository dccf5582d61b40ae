"""FedBABU (Oh, Kim & Yun, ICLR 2022): the body trained federated under a frozen random head, fine-tuned."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from fl_lightning.api import ClientContext, LocalTraining, Strategy, TensorBuffers, register_strategy
from fl_lightning.data.federated import ClientData
from fl_lightning.errors import ConfigError, check_number
from fl_lightning.functional.representation import head_names
from fl_lightning.functional.tensor import Payload, load_tensors, shared_state
from fl_lightning.strategies.fedrep import train_only


@register_strategy
class FedBABU(Strategy):
    """FedBABU, Oh, Kim & Yun, "FedBABU: Toward Enhanced Representation for Federated Image Classification"
    (ICLR 2022), Sec. 4 and Alg. 1.

    The network is a body ``phi`` and a head ``h``; the head keeps its random initialisation ``h^0``
    during the whole federated training (it gets no gradient, no momentum, no weight decay, and is
    neither sent nor uploaded: every client holds the same ``h^0``). A sampled client updates the body
    only and the server averages it:

    .. math:: \\phi_k \\leftarrow \\phi_k - \\eta \\nabla_{\\phi} F_k(\\phi_k, h^0),
              \\qquad \\phi^{t+1} = \\sum_k \\tfrac{n_k}{n} \\phi_k

    At evaluation (Sec. 4, "personalization") each client fine-tunes the whole network ``(phi^t, h^0)``
    on its training split for ``finetune_epochs`` epochs with its local optimizer, through the engine's local
    steps (``trainer.precision``, ``model.grad_clip_norm``; the batch order and random draws seeded by
    ``(seed, client)``), and deploys the result; the fine-tuned model is not kept.

    Args:
        head: The frozen layers: a count of last ``nn.Linear`` layers (1: the classifier, as in the paper)
            or module names (see :func:`fl_lightning.functional.representation.head_names`).
        finetune_epochs: ``tau_f``, fine-tuning epochs at evaluation (0: deploy the global model).
        finetune_lr: Fine-tuning learning rate (None: the client optimizer's initial ``lr``).
        seed: Seed of the fine-tuning stream (None: the run seed, ``model.seed``).
        server_lr: Server learning rate on the pseudo-gradient of the body.
    """

    name = "fedbabu"
    deploys_personal_model = True
    prepares_clients = True

    def __init__(
        self,
        head: int | Sequence[str] = 1,
        finetune_epochs: int = 5,
        finetune_lr: float | None = None,
        seed: int | None = None,
        server_lr: float = 1.0,
    ) -> None:
        super().__init__(server_lr=server_lr)
        if isinstance(finetune_epochs, bool) or not isinstance(finetune_epochs, int) or finetune_epochs < 0:
            raise ConfigError(f"model.strategy.finetune_epochs={finetune_epochs!r} must be an integer >= 0")
        if finetune_lr is not None:
            check_number(finetune_lr, "model.strategy.finetune_lr", low=0, low_open=True, hint="(or null)")
        if seed is not None:
            check_number(seed, "model.strategy.seed", low=0, hint="(or null for the run seed)")
        self.head = head if isinstance(head, int) else list(head)
        self.finetune_epochs = finetune_epochs
        self.finetune_lr = finetune_lr
        self.seed = seed
        self.frozen_head = TensorBuffers()
        self._trainable: set[str] | None = None

    def setup(self, model: nn.Module, num_clients: int) -> None:
        super().setup(model, num_clients)
        head = head_names(model, self.head)  # a bad ``head`` fails here, before any round
        self.frozen_head = TensorBuffers({n: t for n, t in shared_state(model).items() if n in head})
        self._trainable = {n for n, p in model.named_parameters() if p.requires_grad}

    def _all_trainable(self, module: nn.Module) -> set[str]:
        if self._trainable is None:
            self._trainable = {n for n, p in module.named_parameters() if p.requires_grad}
        return self._trainable

    def message(self, model: nn.Module, client_id: int, round: int) -> Payload:
        return {"weights": shared_state(model, exclude=set(self.frozen_head.as_dict()))}

    def on_client_start(self, module: nn.Module, ctx: ClientContext) -> None:
        super().on_client_start(module, ctx)
        head = self.frozen_head.as_dict()
        load_tensors(module, head)
        train_only(module, self._all_trainable(module) - set(head))

    def upload(self, module: nn.Module, ctx: ClientContext) -> Payload:
        train_only(module, self._all_trainable(module))
        return {"weights": shared_state(module, exclude=set(self.frozen_head.as_dict()))}

    def adapt(
        self, module: nn.Module, data: ClientData, state: dict[str, Tensor], local: LocalTraining
    ) -> None:
        super().adapt(module, data, state, local)
        train_only(module, self._all_trainable(module))
        local.fine_tune(module, data, self.finetune_epochs, self.finetune_lr, self.seed)

    def extra_repr(self) -> str:
        return f"head={self.head}, finetune_epochs={self.finetune_epochs}, server_lr={self.server_lr}"
