"""The federated round, written once: sample → dispatch → local training → collect → aggregate.

Evaluation, logging and checkpointing of a round are done by the outer Lightning Trainer around
:meth:`FederatedLoop.run_round` (see :class:`fl_lightning.server.FederatedModule`).

A client's work (:func:`train_client`) is a function of what the server sends, the client's state,
its data and its RNG stream (derived from ``(seed, round, client_id)``), so it gives the same result
whichever process runs it and however many rounds ran before a resume.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from fl_lightning.aggregation import Aggregator as Aggregator  # re-exported: the default streaming mean
from fl_lightning.client import ClientModule, TrainState, merge_train_states
from fl_lightning.data.federated import ClientData
from fl_lightning.distributed import all_gather_objects, is_distributed
from fl_lightning.errors import ConfigError
from fl_lightning.functional import (
    Payload,
    all_finite,
    derive_seed,
    load_tensors,
    module_device,
    payload_bytes,
    seed_rng,
    to_device,
)
from fl_lightning.metrics import TaskMetrics
from fl_lightning.sam import clip_grads_
from fl_lightning.strategies.base import ClientContext, RoundInfo, Strategy

log = logging.getLogger(__name__)

_SAMPLING_STREAM = 0x5A3
_CLIENT_STREAM = 0xC11


@dataclass
class ClientResult:
    """The outcome of one client's local work in one round."""

    client_id: int
    upload: Payload
    state: dict[str, Tensor]
    num_samples: int
    metrics: dict[str, float]
    bytes_down: int
    bytes_up: int
    train_state: TrainState = field(default_factory=dict)


@dataclass
class RoundResult:
    """The aggregate of one round, ready for the server update."""

    means: Payload
    info: RoundInfo
    client_metrics: dict[int, dict[str, float]] = field(default_factory=dict)
    bytes_down: int = 0
    bytes_up: int = 0
    failed: list[int] = field(default_factory=list)
    train_metrics: dict[str, float] = field(default_factory=dict)
    #: One line on the first failure of the round (``client <id>: <Type>: <message>``), "" if none.
    error: str = ""
    train_states: dict[int, TrainState] = field(default_factory=dict)


def sample_clients(num_clients: int, count: int, seed: int, round: int) -> list[int]:
    """``count`` distinct clients for ``round``, sorted; a function of ``(seed, round)`` only."""
    g = torch.Generator().manual_seed(derive_seed(seed, _SAMPLING_STREAM, round))
    return sorted(torch.randperm(num_clients, generator=g)[:count].tolist())


def checked_selection(ids: list[int], num_clients: int) -> list[int]:
    """``ids`` sorted, after checking they are distinct client ids in ``0..num_clients-1`` (at least one)."""
    out = sorted(int(c) for c in ids)
    if not out or len(set(out)) != len(out) or out[0] < 0 or out[-1] >= num_clients:
        raise ValueError(f"select_clients must return distinct client ids in [0, {num_clients}), got {ids}")
    return out


def num_sampled(num_clients: int, participation: float, clients_per_round: int | None) -> int:
    """Clients per round: ``clients_per_round`` if given, else ``max(1, floor(participation * m))``."""
    if clients_per_round is not None:
        if not 1 <= clients_per_round <= num_clients:
            raise ConfigError(
                f"model.clients_per_round={clients_per_round} must be between 1 and "
                f"data.num_clients={num_clients}"
            )
        return clients_per_round
    return max(1, math.floor(participation * num_clients + 1e-9))


@torch.no_grad()
def evaluate(module: nn.Module, batches: Any, metrics: TaskMetrics, precision: Any = None) -> None:
    """Update ``metrics`` with ``module``'s outputs on ``batches`` (eval mode, restored after).

    Each batch is moved to ``module``'s device first, wherever the data lives (e.g. the data module's
    tensors on the GPU and the module back on the CPU after ``fit``), and so are the metric states.
    """
    was_training = module.training
    module.eval()
    device = module_device(module)
    metrics.to(device)
    ctx = precision.val_step_context() if precision is not None else contextlib.nullcontext()
    with ctx:
        for batch in batches:
            x, y = to_device(batch, device)
            if precision is not None:
                x = precision.convert_input(x)
            metrics.update(module(x).float(), y)
    module.train(was_training)


@dataclass
class LocalConfig:
    """How much local work a client does and how (shared by all clients of a run)."""

    batch_size: int
    local_epochs: int = 1
    local_steps: int | None = None
    lr_decay: float = 1.0
    grad_clip_norm: float | None = None
    seed: int = 0
    compile: bool | str = False

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

    Steps: load ``message["weights"]`` into the worker; ``strategy.on_client_start``; build the
    local optimizer (``strategy.configure_client_optimizer``) and set its lr to
    ``lr_0 * lr_decay ** round``; run ``K`` steps of ``optimizer.step(closure)`` where the closure
    computes ``training_step`` (task loss + local term), backward, the strategy's and module's
    ``on_before_optimizer_step`` hooks and optional clipping (closure-based, so SAM-type optimizers
    can call it twice); collect ``strategy.upload``; evaluate on the local test split if any.
    Randomness (batch order, dropout) comes from a stream seeded by ``(seed, round, client_id)``.
    """
    device = next(worker.parameters()).device
    cid = data.client_id
    seed = derive_seed(config.seed, _CLIENT_STREAM, round, cid)
    fork_devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=fork_devices, device_type=device.type if fork_devices else "cuda"):
        seed_rng(seed, device)
        generator = torch.Generator().manual_seed(seed)
        compile_worker(worker, config.compile_mode(device))
        load_tensors(worker, message.get("weights", {}))
        state = {k: v.to(device) for k, v in state.items()}
        num_steps = config.num_steps(data)
        ctx = ClientContext(cid, round, message, state, data.num_samples, num_steps, 0.0, strategy, data=data)
        worker.fl = ctx
        worker.train()
        worker.reset_train_stats()
        try:
            strategy.on_client_start(worker, ctx)
            optimizer = strategy.configure_client_optimizer(worker, ctx)
            decay = config.lr_decay**round
            for group in optimizer.param_groups:
                group["lr"] = group["lr"] * decay
            ctx.lr = optimizer.param_groups[0]["lr"]
            _local_steps(worker, strategy, optimizer, ctx, data, config, precision, generator)
            upload = strategy.upload(worker, ctx)
            upload = strategy.process_upload(upload, ctx)  # clipping/noise/compression: bytes_up counts this
            metrics = worker.train_stats()
            train_state = worker.train_state()
            if eval_metrics is not None and data.test_idx.numel() > 0:
                eval_metrics.reset()
                evaluate(worker, data.eval_batches(config.batch_size * 4), eval_metrics, precision)
                metrics.update({f"local_{k}": v for k, v in eval_metrics.compute().items()})
        finally:
            worker.fl = None
    return ClientResult(
        cid,
        upload,
        ctx.state,
        data.num_samples,
        metrics,
        payload_bytes(message),
        payload_bytes(upload),
        train_state,
    )


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


def _local_steps(
    worker: ClientModule,
    strategy: Strategy,
    optimizer: torch.optim.Optimizer,
    ctx: ClientContext,
    data: ClientData,
    config: LocalConfig,
    precision: Any,
    generator: torch.Generator,
) -> None:
    scaler = getattr(precision, "scaler", None)
    step_ctx = precision.train_step_context if precision is not None else contextlib.nullcontext
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for step, batch in enumerate(data.batches(config.batch_size, ctx.num_steps, generator)):
        ctx.step = step
        if precision is not None:
            batch = precision.convert_input(batch)

        def closure(batch: Any = batch, step: int = step) -> Tensor:
            optimizer.zero_grad(set_to_none=True)
            with step_ctx():
                loss = worker.training_step(batch, step)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
            else:
                loss.backward()
            strategy.on_before_optimizer_step(worker, optimizer, ctx)
            worker.on_before_optimizer_step(optimizer)
            if config.grad_clip_norm is not None:
                clip_grads_(params, config.grad_clip_norm)
            return loss

        if scaler is not None:
            closure()
            scaler.step(optimizer)
            scaler.update()
        else:
            strategy.local_step(worker, optimizer, ctx, batch, closure)
        strategy.on_after_optimizer_step(worker, optimizer, ctx)


ClientHook = Callable[[int, int, ClientResult | None], None]


@dataclass
class FederatedLoop:
    """Runs rounds: which clients, what they receive, their local work, the aggregate.

    Attributes:
        config: Local training settings shared by all clients.
        participation: Fraction of clients per round in (0, 1].
        clients_per_round: A fixed count per round (overrides ``participation``).
        tolerate_client_failures: Exclude a client whose training raises or returns non-finite
            tensors from the round (warning logged, counted) instead of stopping the run.
    """

    config: LocalConfig
    participation: float = 1.0
    clients_per_round: int | None = None
    tolerate_client_failures: bool = True

    def sample(self, num_clients: int, round: int, strategy: Strategy | None = None) -> list[int]:
        """The clients of ``round``, sorted: ``strategy.select_clients`` (default: :func:`sample_clients`)."""
        count = num_sampled(num_clients, self.participation, self.clients_per_round)
        if strategy is None:
            return sample_clients(num_clients, count, self.config.seed, round)
        chosen = strategy.select_clients(num_clients, count, round, self.config.seed)
        return checked_selection(chosen, num_clients)

    def run_round(
        self,
        round: int,
        model: nn.Module,
        worker: ClientModule,
        strategy: Strategy,
        clients: list[ClientData],
        store: Any,
        precision: Any = None,
        eval_metrics: TaskMetrics | None = None,
        on_client_end: ClientHook | None = None,
        sampled: list[int] | None = None,
        assigned: list[int] | None = None,
    ) -> RoundResult:
        """One round over ``sampled`` (default: :meth:`sample`) clients; returns the averaged uploads.

        If every sampled client failed (and failures are tolerated), the result has no aggregated
        clients and empty ``means``; ``error`` describes the first failure.

        ``assigned`` is the share of ``sampled`` this process trains (default: all of them). In a
        process group the weighted sums are all-reduced, and the clients' metrics, byte counts and
        new states are exchanged, so every process returns the same result and holds every state.
        """
        sampled = self.sample(len(clients), round, strategy) if sampled is None else sampled
        mine = sampled if assigned is None else assigned
        agg = strategy.aggregator()
        result = RoundResult(means={}, info=RoundInfo(round, sampled, [], len(clients)))
        personal = strategy.personal_names(model)
        initial = {n: t for n, t in model.state_dict().items() if n in personal}
        for i, cid in enumerate(mine):
            message = strategy.message(model, cid, round)
            load_tensors(worker, initial)  # a client's first round starts its personal layers from init
            try:
                res = train_client(
                    worker,
                    strategy,
                    message,
                    store.get(cid),
                    clients[cid],
                    round,
                    self.config,
                    precision,
                    eval_metrics,
                )
                if not all_finite(res.upload):
                    raise FloatingPointError(f"client {cid} uploaded non-finite values in round {round}")
            except Exception as err:
                if not self.tolerate_client_failures:
                    raise
                result.error = result.error or f"client {cid}: {one_line(err)}"
                result.failed.append(cid)
                result.bytes_down += payload_bytes(message)
                log.warning("round %d: client %d excluded from the aggregate: %s", round, cid, err)
                if on_client_end is not None:
                    on_client_end(i, len(mine), None)
                continue
            agg.add(res.upload, res.num_samples, cid)
            store.put(cid, res.state)
            result.info.aggregated.append(cid)
            result.client_metrics[cid] = dict(res.metrics, num_samples=res.num_samples)
            result.train_states[cid] = res.train_state
            result.bytes_down += res.bytes_down
            result.bytes_up += res.bytes_up
            if on_client_end is not None:
                on_client_end(i, len(mine), res)
        if is_distributed():
            agg.combine(next(worker.parameters()).device)
            _exchange(result, store)
        if not result.info.aggregated:  # every client failed: nothing to aggregate (the caller skips it)
            return result
        result.info.weight_totals = agg.weight_totals
        result.means = strategy.process_aggregate(agg.means(), result.info)
        result.train_metrics = merge_train_states(result.train_states[c] for c in sorted(result.train_states))
        return result


def _exchange(result: RoundResult, store: Any) -> None:
    """Share what each process learnt in the round; afterwards every process has the same view."""
    mine = {
        "aggregated": result.info.aggregated,
        "failed": result.failed,
        "metrics": result.client_metrics,
        "train_states": result.train_states,
        "bytes": (result.bytes_down, result.bytes_up),
        "error": result.error,
        "states": {cid: store.get(cid) for cid in result.info.aggregated},
    }
    result.info.aggregated, result.failed, result.client_metrics, result.train_states = [], [], {}, {}
    result.bytes_down = result.bytes_up = 0
    result.error = ""
    for part in all_gather_objects(mine):
        result.info.aggregated += part["aggregated"]
        result.failed += part["failed"]
        result.client_metrics.update(part["metrics"])
        result.train_states.update(part["train_states"])
        result.bytes_down += part["bytes"][0]
        result.bytes_up += part["bytes"][1]
        result.error = result.error or part["error"]
        for cid, state in part["states"].items():
            if cid not in mine["states"]:
                store.put(cid, state)
    result.info.aggregated.sort()
    result.failed.sort()
    result.client_metrics = dict(sorted(result.client_metrics.items()))


def one_line(err: BaseException) -> str:
    """``"<Type>: <first line of the message>"`` (just the type for an empty message)."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__


def timed() -> Callable[[], float]:
    """A stopwatch: call the returned function for the seconds since creation."""
    start = time.perf_counter()
    return lambda: time.perf_counter() - start
