"""Local fine-tuning of the global model before per-client evaluation: the "+FT" personalised baselines."""

from __future__ import annotations

from torch import Tensor, nn

from fl_lightning.api import LocalTraining, Strategy, StrategyWrapper, register_strategy
from fl_lightning.data.federated import ClientData
from fl_lightning.errors import ConfigError, check_number
from fl_lightning.strategies.fedavg import FedAvg


@register_strategy
class FineTune(StrategyWrapper):
    """Deploy the global model fine-tuned on each client's own training data (FedAvg+FT, FedProx+FT).

    Chen & Qiu (ICML 2025), Sec. 6.3: "For the baseline methods FedAvg and FedProx, we fine-tune the
    models on clients' data for 10 epochs." Training and aggregation are the base strategy's; at every
    per-client evaluation each client starts from the current global model (after the base strategy's
    own personalisation), takes ``epochs`` passes of mini-batch steps of its local optimizer
    (``model.client``'s optimizer, learning rate and batch size, or ``lr``) on its training split, and is
    evaluated on its local test split. The steps are the engine's local steps, as a client's local training
    takes them (``trainer.precision``, ``model.grad_clip_norm``), without the base strategy's local terms
    (e.g. FedProx's proximal term: the fine-tuning is plain). The fine-tuned model is not kept: the next
    evaluation fine-tunes the then-current global model again. Batch order and random draws (dropout) come
    from a stream seeded by ``(seed, client)``; the global RNG is left as it was.

    Args:
        base: The strategy whose global model is fine-tuned (default FedAvg).
        epochs: Local fine-tuning epochs (paper: 10); 0 deploys the global model.
        lr: Fine-tuning learning rate (None: the client optimizer's initial ``lr``).
        seed: Seed of the fine-tuning stream (None: the run seed, ``model.seed``, as a client's local
            training).
    """

    name = "finetune"
    deploys_personal_model = True
    vectorizable = True  # fine-tuning is in adapt (per-client evaluation), not in the local steps

    def __init__(
        self, base: Strategy | None = None, epochs: int = 10, lr: float | None = None, seed: int | None = None
    ) -> None:
        super().__init__(FedAvg() if base is None else base)
        if epochs < 0:
            raise ConfigError(f"model.strategy.epochs={epochs} must be >= 0 (the paper fine-tunes for 10)")
        if lr is not None:
            check_number(lr, "model.strategy.lr", low=0, low_open=True, hint="(or null for the client's lr)")
        if seed is not None:
            check_number(seed, "model.strategy.seed", low=0, hint="(or null for the run seed)")
        self.epochs = epochs
        self.lr = lr
        self.seed = seed

    def adapt(
        self, module: nn.Module, data: ClientData, state: dict[str, Tensor], local: LocalTraining
    ) -> None:
        super().adapt(module, data, state, local)
        local.fine_tune(module, data, self.epochs, self.lr, self.seed)

    def extra_repr(self) -> str:
        return f"epochs={self.epochs}, lr={self.lr}"
