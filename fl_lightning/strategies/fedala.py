"""FedALA (Zhang et al., AAAI 2023): adaptive local aggregation of the global model into the local one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call

from fl_lightning.api import ClientContext, LocalTraining, Strategy, TensorBuffers, register_strategy
from fl_lightning.data.federated import ClientData
from fl_lightning.errors import ConfigError, check_number
from fl_lightning.functional.personalized import ala_mix, ala_weight_step, std_below
from fl_lightning.functional.tensor import (
    Payload,
    derive_seed,
    load_tensors,
    module_device,
    shared_state,
    to_device,
)

#: Prefixes of a client's local model and of its aggregation weights ``W`` in its state.
LOCAL, WEIGHT = "fedala/local/", "fedala/weight/"
_STREAM = 0xA1A


@register_strategy
class FedALA(Strategy):
    """FedALA, Zhang et al., "FedALA: Adaptive Local Aggregation for Personalized Federated Learning"
    (AAAI 2023), Sec. 3 and Alg. 1.

    Training and aggregation are FedAvg's, but a client does not start its round from the received
    global model ``theta^t``: it keeps its local model ``theta_k`` (the model it trained in its last round;
    the initial model before) and, before its local steps, initialises (ALA, Sec. 3)

    .. math:: \\hat\\theta_k = \\theta_k + (\\theta^t - \\theta_k) \\odot W_k

    on the top ``layer_idx`` parameter tensors (the lower ones take ``theta^t``), with element-wise weights
    ``W_k`` in ``[0, 1]`` learned on a random ``rand_percent`` % of its training data (a contiguous
    slice of it at a random start, in batches of the local batch size, as in the authors' ALA module):

    .. math:: W_k \\leftarrow \\Pi_{[0,1]}\\big(W_k - \\eta\\, \\nabla_{\\hat\\theta} f_k(\\hat\\theta_k)
              \\odot (\\theta^t - \\theta_k)\\big)

    (:func:`~fl_lightning.functional.personalized.ala_weight_step`). ``W_k`` starts at ones; in a
    client's first ALA it is trained until the standard deviation of its last ``num_pre_loss`` epoch
    losses is below ``threshold`` (at most ``max_start_epochs`` epochs, a cap the authors' code does not
    have), afterwards for one epoch per round, and is kept per client. ALA is skipped while the local
    model equals the global one (the first round). BatchNorm statistics stay the client's own (ALA mixes
    parameters only). The deployed model of a client is ``hat theta_k`` computed with the current global
    model at evaluation (one epoch on ``W_k``, from ones if it has none yet, not kept; the slice drawn by a
    stream seeded by the client); a client that never trained deploys the global model.

    Args:
        rand_percent: The share of local data ``W`` is learned on, in ``(0, 100]`` (authors: 80).
        layer_idx: ALA covers the last ``layer_idx`` parameter tensors (authors: 2, the classifier's
            weight and bias); 0: all of them.
        eta: Learning rate of ``W`` (authors: 1.0).
        threshold: Standard-deviation threshold of the first weight learning (authors: 0.1).
        num_pre_loss: Number of recorded losses that threshold looks at (authors: 10).
        max_start_epochs: Cap on the epochs of the first weight learning.
        server_lr: Server learning rate on the pseudo-gradient (1: FedAvg's average).
    """

    name = "fedala"
    steps_itself = True
    changes_gradients = True
    deploys_personal_model = True

    def __init__(
        self,
        rand_percent: float = 80,
        layer_idx: int = 2,
        eta: float = 1.0,
        threshold: float = 0.1,
        num_pre_loss: int = 10,
        max_start_epochs: int = 100,
        server_lr: float = 1.0,
    ) -> None:
        super().__init__(server_lr=server_lr)
        check_number(
            rand_percent, "model.strategy.rand_percent", low=0, high=100, low_open=True, hint="e.g. 80"
        )
        for field, value, low in (
            ("layer_idx", layer_idx, 0),
            ("num_pre_loss", num_pre_loss, 1),
            ("max_start_epochs", max_start_epochs, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"model.strategy.{field}={value!r} must be an integer >= {low}")
        check_number(eta, "model.strategy.eta", low=0, low_open=True, hint="(the authors use 1.0)")
        check_number(threshold, "model.strategy.threshold", low=0, hint="(the authors use 0.1)")
        self.rand_percent = rand_percent
        self.layer_idx = layer_idx
        self.eta = eta
        self.threshold = threshold
        self.num_pre_loss = num_pre_loss
        self.max_start_epochs = max_start_epochs
        self.initial = TensorBuffers()

    def setup(self, model: nn.Module, num_clients: int) -> None:
        super().setup(model, num_clients)
        count = len(list(model.parameters()))
        if self.layer_idx > count:
            raise ConfigError(
                f"model.strategy.layer_idx={self.layer_idx} must count 0..{count} last parameter tensors of "
                f"{type(model).__name__} (0: all; 2: a classifier's weight and bias)"
            )
        self.initial = TensorBuffers(shared_state(model))  # every client's local model before it trains

    def local_step(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        ctx: ClientContext,
        batch: Any,
        closure: Callable[[], Tensor],
    ) -> None:
        if ctx.step == 0:  # the batch size is known here: the first batch (all of it if fewer samples)
            seed = derive_seed(ctx.seed, _STREAM, ctx.round, ctx.client_id)
            self.aggregate(module, ctx.state, ctx.data, len(batch[1]), torch.Generator().manual_seed(seed))
        super().local_step(module, optimizer, ctx, batch, closure)

    def upload(self, module: nn.Module, ctx: ClientContext) -> Payload:
        ctx.state.update({LOCAL + n: t.detach().clone() for n, t in shared_state(module).items()})
        return super().upload(module, ctx)

    def adapt(
        self, module: nn.Module, data: ClientData, state: dict[str, Tensor], local: LocalTraining
    ) -> None:
        super().adapt(module, data, state, local)
        if not any(k.startswith(LOCAL) for k in state):
            return  # never trained: the global model
        device = module_device(module)
        cuda = [device] if device.type == "cuda" else []
        was_training = module.training
        module.train()
        generator = torch.Generator().manual_seed(derive_seed(_STREAM, data.client_id))
        with torch.enable_grad(), torch.random.fork_rng(devices=cuda, device_type="cuda"):
            self.aggregate(module, dict(state), data, local.batch_size, generator, until_stable=False)
        module.train(was_training)

    def aggregate(
        self,
        module: nn.Module,
        state: dict[str, Tensor],
        data: ClientData,
        batch_size: int,
        generator: torch.Generator,
        until_stable: bool = True,
    ) -> None:
        """ALA: the global model in ``module`` becomes ``hat theta_k``; ``W_k`` is updated in ``state``.

        ``until_stable``: a client without ``W_k`` trains it until the losses settle (else one epoch).
        """
        local = {
            k[len(LOCAL) :]: v for k, v in state.items() if k.startswith(LOCAL)
        } or self.initial.as_dict()
        params = list(module.named_parameters())
        if all(torch.equal(local[n].to(p.device), p.detach()) for n, p in params):
            return  # nothing to aggregate: the local model is the global one
        names = {n for n, _ in params}
        load_tensors(module, {n: t for n, t in local.items() if n not in names})  # the local statistics
        top = params[len(params) - self.layer_idx :] if self.layer_idx else params
        glob = [p.detach().clone() for _, p in top]
        mine = [local[n].to(p.device, p.dtype) for n, p in top]
        fresh = WEIGHT + top[0][0] not in state
        weights = [torch.ones_like(p) if fresh else state[WEIGHT + n].to(p.device) for n, p in top]
        start = fresh and until_stable  # the first weight learning, trained until the losses settle
        batches = [
            to_device(data.take(idx), glob[0].device) for idx in self._slice(data, batch_size, generator)
        ]
        mixed, losses = ala_mix(mine, glob, weights), []
        while True:
            for x, y in batches:
                leaves = [m.detach().requires_grad_(True) for m in mixed]
                out = functional_call(module, {n: t for (n, _), t in zip(top, leaves)}, (x,))
                loss = module.task_loss(out, y)
                weights = ala_weight_step(weights, torch.autograd.grad(loss, leaves), mine, glob, self.eta)
                mixed = ala_mix(mine, glob, weights)
            losses.append(float(loss))
            if not start or std_below(losses, self.num_pre_loss, self.threshold):
                break
            if len(losses) >= self.max_start_epochs:
                break
        state.update({WEIGHT + n: w.detach().clone() for (n, _), w in zip(top, weights)})
        load_tensors(module, {n: m.detach() for (n, _), m in zip(top, mixed)})

    def _slice(self, data: ClientData, batch_size: int, generator: torch.Generator) -> list[Tensor]:
        """The batches of a contiguous ``rand_percent`` % of the training split at a random start (the
        last incomplete batch dropped, unless it is the only one)."""
        n = data.num_samples
        size = max(1, int(self.rand_percent / 100 * n))
        begin = int(torch.randint(0, n - size + 1, (1,), generator=generator))
        idx = data.train_idx[begin : begin + size].to(data.x.device)
        return [idx[i : i + batch_size] for i in range(0, size - batch_size + 1, batch_size)] or [idx]

    def extra_repr(self) -> str:
        return (
            f"rand_percent={self.rand_percent}, layer_idx={self.layer_idx}, eta={self.eta}, "
            f"threshold={self.threshold}, server_lr={self.server_lr}"
        )
