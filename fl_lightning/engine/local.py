"""A client's side of a round: its local work, the check of what it sends, the model it deploys.

A client's work (:func:`train_client`) is a function of what the server sends, the client's state,
its data and its RNG stream (derived from ``(seed, round, client_id)``), so it gives the same result
whichever process runs it (one process, several, a Flower SuperNode) and however many rounds ran before
a resume. :func:`check_upload` is the client fault the engine tolerates (non-finite values);
:func:`evaluate_deployed` evaluates the model a client deploys (the global model after the strategy's
``personalize`` and ``adapt``, which fine-tunes through :func:`fine_tune`: the same local steps) on its
local test split. Every executor and the Flower ClientApp call these same functions.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from fl_lightning.api.client import ClientModule
from fl_lightning.api.metrics import TaskMetrics
from fl_lightning.api.strategy import Strategy
from fl_lightning.api.types import ClientContext, ClientResult, LocalTraining
from fl_lightning.data.federated import ClientData
from fl_lightning.engine.runtime import Runtime
from fl_lightning.errors import ConfigError, check_number
from fl_lightning.functional.sharpness import clip_grads_
from fl_lightning.functional.tensor import (
    Payload,
    all_finite,
    derive_seed,
    load_tensors,
    module_device,
    payload_bytes,
    seed_rng,
    to_device,
)

_CLIENT_STREAM = 0xC11
#: The stream of a client's deployment-time fine-tuning (:func:`fine_tune`).
_FINETUNE_STREAM = 0xF7E
#: Parameters below which a CPU process trains on one intra-op thread by default (see :func:`cpu_threads`).
SMALL_MODEL = 1_000_000


def cpu_threads(model: nn.Module, requested: int | None, processes: int) -> int | None:
    """Intra-op threads for a CPU process that trains ``model`` (None: leave torch's default).

    ``requested`` (``model.runtime.threads_per_process``) if given; else 1 when several CPU processes share
    the machine (``processes > 1``: two processes of two threads on two cores oversubscribe them, a tiny
    model's step went from 0.3 ms to 30 ms) or when the model is small (below :data:`SMALL_MODEL`
    parameters: one thread was 13% faster on an idle machine and 9x faster on a busy one).
    """
    if requested is not None:
        return requested
    small = sum(p.numel() for p in model.parameters()) < SMALL_MODEL
    return 1 if processes > 1 or small else None


def check_upload(client_id: int, round: int, upload: Payload) -> None:
    """The client's own fault that a round tolerates: an upload with non-finite values raises
    ``FloatingPointError`` (checked with one host sync for the whole payload)."""
    if not all_finite(upload):
        raise FloatingPointError(f"client {client_id} uploaded non-finite values in round {round}")


@torch.inference_mode(False)  # adapt may train (FineTune); validate/test run in inference mode
@torch.no_grad()
def evaluate_deployed(
    worker: nn.Module,
    weights: Payload,
    strategy: Strategy,
    data: ClientData,
    state: dict[str, Tensor],
    config: LocalConfig,
    metrics: TaskMetrics,
    precision: Any = None,
) -> None:
    """Update ``metrics`` with the model ``data``'s client deploys, on its local test split.

    The deployed model is the global model (``weights``, loaded into ``worker``) after
    ``strategy.personalize`` (the client's personal entries from ``state``) and ``strategy.adapt`` (e.g.
    local fine-tuning on its training data, through :func:`local_training`: the run's batch size, precision
    and clipping); a client without a test split is evaluated on its training data (batch size
    ``config.eval_batch_size``).
    """
    device = module_device(worker)
    load_tensors(worker, weights)
    state = {k: v.to(device) for k, v in state.items()}
    strategy.personalize(worker, data.client_id, state)
    strategy.adapt(worker, data, state, local_training(config, precision))
    evaluate(worker, data.eval_batches(config.eval_batch_size), metrics, precision)


def local_training(config: LocalConfig, precision: Any = None) -> LocalTraining:
    """The run's local training as :meth:`Strategy.adapt <fl_lightning.api.strategy.Strategy.adapt>` gets it:
    the batch size, the run seed and :func:`fine_tune` with ``config`` and ``precision``."""
    return LocalTraining(
        config.batch_size, config.seed, functools.partial(fine_tune, config=config, precision=precision)
    )


def fine_tune(
    module: ClientModule,
    data: ClientData,
    epochs: int,
    lr: float | None,
    seed: int,
    *,
    config: LocalConfig,
    precision: Any = None,
) -> None:
    """``epochs`` passes of plain local steps of ``module`` on ``data``'s training split: a client's
    deployment-time fine-tuning (FineTune's "+FT", FedBABU's), through :func:`local_steps` as a client's
    local training runs (``training_step``'s task loss, ``config.batch_size``, the precision plugin and its
    gradient scaler, ``model.grad_clip_norm``), with no strategy term (the base :class:`Strategy`'s hooks).

    The optimizer is ``module.configure_optimizers()`` with every group's lr set to ``lr`` (None: the
    client optimizer's initial lr, undecayed). Batch order and random draws (dropout) come from the stream
    seeded by ``(seed, client)``, in a fork of the default RNGs (the global RNG is left as it was); the
    module is trained in train mode (its mode restored after) and its train statistics are its own. The
    gradient scaler, shared with the rounds' local training, is restored after, so evaluating never changes
    how the next round trains. ``epochs`` 0: no-op.
    """
    steps = epochs * data.steps_per_epoch(config.batch_size)
    if steps == 0:
        return
    device = module_device(module)
    derived = derive_seed(seed, _FINETUNE_STREAM, data.client_id)
    scaler = getattr(precision, "scaler", None)
    scaler_state = scaler.state_dict() if scaler is not None else None
    was_training = module.training
    with forked_rng(derived, device), torch.enable_grad(), module.local_training():
        module.train()
        plain = Strategy()
        ctx = ClientContext(data.client_id, -1, {}, {}, data.num_samples, steps, 0.0, data=data, seed=seed)
        optimizer = plain.configure_client_optimizer(module, ctx)
        for group in optimizer.param_groups:
            group["lr"] = group["lr"] if lr is None else lr
        ctx.lr = optimizer.param_groups[0]["lr"]
        batches = data.batches(config.batch_size, steps, torch.Generator().manual_seed(derived))

        def convert(batch: Any) -> Any:
            batch = to_device(batch, device)  # the data may live elsewhere (e.g. on the host after fit)
            return precision.convert_input(batch) if precision is not None else batch

        try:
            for _ in local_steps(module, plain, optimizer, ctx, batches, config, precision, convert):
                pass
        finally:
            module.train(was_training)
            if scaler is not None:
                scaler.load_state_dict(scaler_state)


@torch.no_grad()
def evaluate(module: nn.Module, batches: Any, metrics: TaskMetrics, precision: Any = None) -> None:
    """Update ``metrics`` with ``module``'s outputs on ``batches`` (eval mode, restored after).

    Each batch is moved to ``module``'s device first, wherever the data lives (e.g. the data module's
    tensors on the GPU and the module back on the CPU after ``fit``), and so are the metric states.
    """
    was_training = module.training
    module.eval()
    device = module_device(module)
    if metrics.device != device:
        metrics.to(device)
    ctx = precision.val_step_context() if precision is not None else contextlib.nullcontext()
    with ctx:
        for batch in batches:
            x, y = to_device(batch, device)
            if precision is not None:
                x = precision.convert_input(x)
            metrics.update(module(x).float(), y)
    module.train(was_training)


@torch.no_grad()
def outputs_together(module: nn.Module, batches: Sequence[Any], precision: Any = None) -> list[Tensor]:
    """``module``'s outputs (float) on each of ``batches`` (``(x, y)`` pairs, e.g. several clients' test
    batches), computed as :func:`evaluate` computes them but in one forward for all of them (eval mode,
    restored after; moved to ``module``'s device; the precision plugin's evaluation context and input
    conversion). For a model whose evaluation treats each sample on its own (no batch statistics)."""
    if not batches:
        return []
    was_training = module.training
    module.eval()
    device = module_device(module)
    ctx = precision.val_step_context() if precision is not None else contextlib.nullcontext()
    try:
        with ctx:
            xs = [to_device(b[0], device) for b in batches]
            x = torch.cat(xs)
            if precision is not None:
                x = precision.convert_input(x)
            out = module(x).float()
    finally:
        module.train(was_training)
    return list(out.split([len(t) for t in xs]))


@dataclass
class LocalConfig:
    """How much local work a client does and how (shared by all clients of a run).

    ``compile`` and the ``vectorize*`` fields are the run's :class:`~fl_lightning.engine.runtime.Runtime`'s
    (``model.runtime``), which ``FederatedModule`` gives here; the others are the module's arguments of the
    same names.
    """

    batch_size: int
    eval_batch_size: int = 512
    local_epochs: int = 1
    local_steps: int | None = None
    lr_decay: float = 1.0
    grad_clip_norm: float | None = None
    seed: int = 0
    compile: bool | str = False
    vectorize: int | str = 1
    vectorize_memory_gb: float | None = None
    vectorize_cpu: str = "measure"

    def __post_init__(self) -> None:
        """Refuse a bad value with one line naming its ``model.<field>`` (as the config spells it)."""
        if self.local_steps is None and self.local_epochs < 1:
            raise ConfigError(
                f"model.local_epochs={self.local_epochs} must be >= 1 (or set model.local_steps)"
            )
        if self.local_steps is not None and self.local_steps < 1:
            raise ConfigError(f"model.local_steps={self.local_steps} must be >= 1")
        check_number(
            self.lr_decay,
            "model.lr_decay",
            low=0,
            high=1,
            low_open=True,
            hint="the papers use 0.998 per round",
        )
        if self.grad_clip_norm is not None:
            hint = "or null: no clipping"
            check_number(self.grad_clip_norm, "model.grad_clip_norm", low=0, low_open=True, hint=hint)
        check_number(self.seed, "model.seed", low=0, hint="e.g. 0")
        Runtime(  # the runtime's own checks of the fields it gives (one line naming model.runtime.<field>)
            compile=self.compile,
            vectorize=self.vectorize,
            vectorize_memory_gb=self.vectorize_memory_gb,
            vectorize_cpu=self.vectorize_cpu,
        )

    @property
    def vectorized(self) -> bool:
        """Whether clients may train in vectorised groups (``model.runtime.vectorize`` auto or above 1)."""
        return self.vectorize == "auto" or int(self.vectorize) > 1

    def compile_mode(self, device: torch.device) -> str | None:
        """The ``torch.compile`` mode of the clients' forward pass (None: eager).

        ``True`` is ``"reduce-overhead"`` (CUDA graphs: one launch per step instead of one per kernel)
        on a CUDA device and ``"default"`` elsewhere; a string is the mode itself.
        """
        if self.compile is False:
            return None
        if self.compile is True:
            return "reduce-overhead" if device.type == "cuda" else "default"
        return str(self.compile)

    def lr_at(self, lr: float, round: int) -> float:
        """The local learning rate ``lr`` in ``round`` (0-based): ``lr * lr_decay ** round``."""
        return lr * self.lr_decay**round

    def num_steps(self, data: ClientData) -> int:
        if self.local_steps is not None:
            return self.local_steps
        return self.local_epochs * data.steps_per_epoch(self.batch_size)


def train_client(
    worker: ClientModule,
    strategy: Strategy,
    message: Payload,
    state: dict[str, Tensor],
    data: ClientData,
    round: int,
    config: LocalConfig,
    precision: Any = None,
    eval_metrics: TaskMetrics | None = None,
) -> ClientResult:
    """Run one client's local work for one round on ``worker`` and return its upload and state.

    Steps: load ``message["weights"]`` into the worker; :func:`local_optimizer` (``strategy.on_client_start``,
    the local optimizer with its lr decayed for the round); :func:`local_steps` (``K`` steps of
    ``optimizer.step(closure)``); collect ``strategy.upload`` and ``process_upload``; evaluate on the local
    test split if any. Values the module logs with ``self.log`` join the client's metrics.
    Randomness (batch order, dropout) comes from a stream seeded by ``(seed, round, client_id)``.
    """
    device = next(worker.parameters()).device
    cid = data.client_id
    with client_rng(config.seed, round, cid, device) as seed:
        generator = torch.Generator().manual_seed(seed)
        compile_worker(worker, config.compile_mode(device))
        ctx = start_client(worker, strategy, message, state, data, round, config, lr=0.0)
        with worker.local_training(), _dropping(ctx.scratch):
            optimizer = local_optimizer(worker, strategy, ctx, config)
            batches = data.batches(config.batch_size, ctx.num_steps, generator)
            convert = precision.convert_input if precision is not None else None
            for _ in local_steps(worker, strategy, optimizer, ctx, batches, config, precision, convert):
                pass
            return client_result(worker, strategy, ctx, message, data, config, precision, eval_metrics)


def local_optimizer(
    module: nn.Module, strategy: Strategy, ctx: ClientContext, config: LocalConfig
) -> torch.optim.Optimizer:
    """The start of a client's local steps (one client's, or a stacked group's): ``strategy.on_client_start``,
    then the local optimizer (``strategy.configure_client_optimizer``) with every group's lr multiplied by
    ``lr_decay ** round``; ``ctx.lr`` is the round's lr."""
    strategy.on_client_start(module, ctx)
    optimizer = strategy.configure_client_optimizer(module, ctx)
    for group in optimizer.param_groups:
        group["lr"] = config.lr_at(group["lr"], ctx.round)
    ctx.lr = optimizer.param_groups[0]["lr"]
    return optimizer


def local_steps(
    module: nn.Module,
    strategy: Strategy,
    optimizer: torch.optim.Optimizer,
    ctx: ClientContext,
    batches: Iterable[Any],
    config: LocalConfig,
    precision: Any = None,
    convert: Callable[[Any], Any] | None = None,
) -> Iterator[int]:
    r"""The local steps, written once: one client's (:func:`train_client`) or a stacked group's
    (:func:`~fl_lightning.engine.vectorized.train_stacked`, ``ctx.stacked > 0``); yields each step's index
    once it is done (a stacked group takes a client's values after its last step).

    Per batch (``convert``\ed first, e.g. the precision plugin's ``convert_input``): ``ctx.step``, then
    ``strategy.local_step(module, optimizer, ctx, batch, closure)`` (``optimizer.step(closure)`` by default),
    where the closure zeroes the gradients, computes :func:`step_loss` under the precision plugin's
    ``train_step_context``, backpropagates, runs ``strategy.on_before_optimizer_step`` and the module's
    ``on_before_optimizer_step`` and clips the gradients (``model.grad_clip_norm``; per client when
    stacked); closure-based, so SAM-type optimizers can call it twice. With a gradient scaler
    (``16-mixed``) the loop scales the loss, unscales before the hooks and steps through the scaler instead
    of ``local_step``. Then ``strategy.on_after_optimizer_step``.
    """
    scaler = getattr(precision, "scaler", None)
    step_ctx = precision.train_step_context if precision is not None else contextlib.nullcontext
    params = [p for g in optimizer.param_groups for p in g["params"]]
    stacked = ctx.stacked > 0
    for step, batch in enumerate(batches):
        ctx.step = step
        if convert is not None:
            batch = convert(batch)

        def closure(batch: Any = batch, step: int = step) -> Tensor:
            optimizer.zero_grad(set_to_none=True)
            with step_ctx():
                loss = step_loss(module, strategy, ctx, batch, step)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
            else:
                loss.backward()
            strategy.on_before_optimizer_step(module, optimizer, ctx)
            module.on_before_optimizer_step(optimizer)
            if config.grad_clip_norm is not None:
                clip_grads_(params, config.grad_clip_norm, stacked=stacked)
            return loss

        if scaler is not None:
            closure()
            scaler.step(optimizer)
            scaler.update()
        else:
            strategy.local_step(module, optimizer, ctx, batch, closure)
        strategy.on_after_optimizer_step(module, optimizer, ctx)
        yield step


def start_client(
    worker: ClientModule,
    strategy: Strategy,
    message: Payload,
    state: dict[str, Tensor],
    data: ClientData,
    round: int,
    config: LocalConfig,
    lr: float,
    load: bool = True,
) -> ClientContext:
    """Load ``message["weights"]`` into ``worker`` (train mode; not if ``load`` is false: weights loaded
    next anyway) and return the client's context for the round, its state moved to the worker's device."""
    device = module_device(worker)
    if load:
        load_tensors(worker, message.get("weights", {}))
    state = {k: v.to(device) for k, v in state.items()}
    worker.train()
    return ClientContext(
        data.client_id,
        round,
        message,
        state,
        data.num_samples,
        config.num_steps(data),
        lr,
        data=data,
        seed=config.seed,
    )


def client_seed(seed: int, round: int, client_id: int) -> int:
    """The seed of a client's RNG stream in ``round`` (its batch order, its default-RNG draws)."""
    return derive_seed(seed, _CLIENT_STREAM, round, client_id)


@contextlib.contextmanager
def client_rng(seed: int, round: int, client_id: int, device: torch.device) -> Iterator[int]:
    """The client's RNG stream: the default RNGs (CPU, and ``device`` if CUDA) seeded from
    ``(seed, round, client_id)`` and restored afterwards; yields the derived seed (for its generator)."""
    derived = client_seed(seed, round, client_id)
    with forked_rng(derived, device):
        yield derived


@contextlib.contextmanager
def forked_rng(seed: int, device: torch.device) -> Iterator[None]:
    """The default RNGs (CPU, and ``device`` if CUDA) seeded with ``seed`` inside, restored afterwards."""
    fork_devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=fork_devices, device_type=device.type if fork_devices else "cuda"):
        seed_rng(seed, device)
        yield


def client_result(
    worker: ClientModule,
    strategy: Strategy,
    ctx: ClientContext,
    message: Payload,
    data: ClientData,
    config: LocalConfig,
    precision: Any = None,
    eval_metrics: TaskMetrics | None = None,
    evaluated: Sequence[tuple[Tensor, Tensor]] | None = None,
) -> ClientResult:
    """The end of a client's work after its local steps: upload, metrics, local evaluation
    (``bytes_down`` counts ``message``, what the server sent, whatever the hooks made of ``ctx.message``).

    ``evaluated``: the trained model's ``(outputs, targets)`` on the local test split, batch by batch as
    :func:`evaluate` takes them, computed already (a vectorised group evaluates its clients together); None:
    evaluate ``worker`` here.
    """
    upload = strategy.upload(worker, ctx)
    upload = strategy.process_upload(upload, ctx)  # clipping/noise/compression: bytes_up counts this
    metrics = worker.train_stats()
    train_state = worker.train_state()
    if eval_metrics is not None and data.test_idx.numel() > 0:
        eval_metrics.reset()
        if evaluated is None:
            evaluate(worker, data.eval_batches(eval_batch_size(config)), eval_metrics, precision)
        else:
            for outputs, target in evaluated:
                eval_metrics.update(outputs, target)
        metrics.update({f"local_{k}": v for k, v in eval_metrics.compute().items()})
    return ClientResult(
        ctx.client_id,
        upload,
        ctx.state,
        data.num_samples,
        metrics,
        payload_bytes(message),
        payload_bytes(upload),
        train_state,
    )


def eval_batch_size(config: LocalConfig) -> int:
    """The batch size of a freshly trained client's evaluation on its local test split."""
    return config.batch_size * 4


def compile_worker(worker: nn.Module, mode: str | None) -> None:
    """Compile ``worker``'s network once (``nn.Module.compile``: state-dict names unchanged); no-op if done.

    The forward pass (and with it the backward, through AOTAutograd) of the network the client
    trains is compiled, not the step: the strategy hooks, closures and optimizer stay eager, so
    every strategy works unchanged. The worker is reused for every client of the run and weights
    are loaded into it in place, so the compiled code (and with ``"reduce-overhead"`` its CUDA
    graphs, recorded for the parameters' fixed addresses) stays valid across clients and rounds.
    """
    if mode is None or getattr(worker, "_fl_compile_mode", None) == mode:
        return
    net = getattr(worker, "net", worker)
    net.compile(mode=mode)
    worker._fl_compile_mode = mode


def step_loss(worker: nn.Module, strategy: Strategy, ctx: ClientContext, batch: Any, step: int) -> Tensor:
    """The local objective of one step: ``training_step``'s loss plus ``strategy.local_loss``.

    ``training_step`` returns the loss or a dict with ``"loss"`` and optionally ``"outputs"`` (passed to
    the strategy, which may reuse the forward; None when the step does not return them).
    """
    out = worker.training_step(batch, step)
    if isinstance(out, Mapping):
        loss, outputs = out["loss"], out.get("outputs")
    else:
        loss, outputs = out, None
    extra = strategy.local_loss(worker, ctx, batch, outputs)
    return loss if extra is None else loss + extra


@contextlib.contextmanager
def _dropping(scratch: dict[str, Any]) -> Iterator[None]:
    """Empty the round's scratch space when the client's work ends, normally or not (hooks that a
    strategy registered there, such as a :class:`~fl_lightning.functional.representation.FeatureTap`,
    then know they are stale)."""
    try:
        yield
    finally:
        scratch.clear()
