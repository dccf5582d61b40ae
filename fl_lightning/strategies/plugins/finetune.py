"""Local fine-tuning of the global model before per-client evaluation: the "+FT" personalised baselines."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from fl_lightning.api import Strategy, StrategyWrapper, register_strategy
from fl_lightning.data.federated import ClientData
from fl_lightning.errors import ConfigError, check_number
from fl_lightning.functional.tensor import derive_seed, module_device, to_device
from fl_lightning.strategies.fedavg import FedAvg

_FINETUNE_STREAM = 0xF7E


def fine_tune(
    module: nn.Module, data: ClientData, batch_size: int, epochs: int, lr: float | None, seed: int
) -> None:
    """``epochs`` passes of mini-batch steps of ``module``'s own optimizer (``configure_optimizers()``, its
    learning rate replaced by ``lr`` unless None) on the client's training split, in train mode; the batch
    order comes from a stream seeded by ``(seed, client)`` and the global RNG is left as it was (the "+FT"
    evaluation of :class:`FineTune`, FedBABU's fine-tuning)."""
    if epochs == 0:
        return
    optimizer = module.configure_optimizers()
    if lr is not None:
        for group in optimizer.param_groups:
            group["lr"] = lr
    generator = torch.Generator().manual_seed(derive_seed(seed, _FINETUNE_STREAM, data.client_id))
    steps = epochs * data.steps_per_epoch(batch_size)
    was_training = module.training
    device = module_device(module)  # the data may live elsewhere (e.g. on the host after fit)
    cuda = [device] if device.type == "cuda" else []
    module.train()
    with torch.enable_grad(), torch.random.fork_rng(devices=cuda, device_type="cuda"):
        for batch in data.batches(batch_size, steps, generator):
            x, y = to_device(batch, device)
            optimizer.zero_grad(set_to_none=True)
            module.task_loss(module(x), y).backward()
            optimizer.step()
    module.train(was_training)


@register_strategy
class FineTune(StrategyWrapper):
    """Deploy the global model fine-tuned on each client's own training data (FedAvg+FT, FedProx+FT).

    Chen & Qiu (ICML 2025), Sec. 6.3: "For the baseline methods FedAvg and FedProx, we fine-tune the
    models on clients' data for 10 epochs." Training and aggregation are the base strategy's; at every
    per-client evaluation each client starts from the current global model (after the base strategy's
    own personalisation), takes ``epochs`` passes of mini-batch steps of its local optimizer
    (``model.client``'s optimizer, learning rate and batch size, or ``lr``) on its training split, and is
    evaluated on its local test split. The fine-tuned model is not kept: the next evaluation fine-tunes
    the then-current global model again. Batch order comes from a stream seeded by ``(seed, client)``;
    the global RNG is left as it was.

    Args:
        base: The strategy whose global model is fine-tuned (default FedAvg).
        epochs: Local fine-tuning epochs (paper: 10); 0 deploys the global model.
        lr: Fine-tuning learning rate (None: the client optimizer's initial ``lr``).
        seed: Seed of the fine-tuning batch order.
    """

    name = "finetune"
    vectorizable = True  # fine-tuning is in adapt (per-client evaluation), not in the local steps

    def __init__(
        self, base: Strategy | None = None, epochs: int = 10, lr: float | None = None, seed: int = 0
    ) -> None:
        super().__init__(FedAvg() if base is None else base)
        if epochs < 0:
            raise ConfigError(f"model.strategy.epochs={epochs} must be >= 0 (the paper fine-tunes for 10)")
        if lr is not None:
            check_number(lr, "model.strategy.lr", low=0, low_open=True, hint="(or null for the client's lr)")
        check_number(seed, "model.strategy.seed", low=0, hint="e.g. 0")
        self.epochs = epochs
        self.lr = lr
        self.seed = seed

    def adapt(self, module: nn.Module, data: ClientData, state: dict[str, Tensor], batch_size: int) -> None:
        super().adapt(module, data, state, batch_size)
        fine_tune(module, data, batch_size, self.epochs, self.lr, self.seed)

    def extra_repr(self) -> str:
        return f"epochs={self.epochs}, lr={self.lr}"
