"""Vectorised clients: the local steps of several clients of a round as one batched computation.

The :class:`~fl_lightning.engine.executors.Vectorized` executor runs them.

With ``model.runtime.vectorize=C`` the round trains up to ``C`` of its clients together on one device (a
client's local step at the papers' batch sizes is launch-bound on a GPU; ``C`` clients cost about the
kernel launches of one). A :class:`StackedWorker` holds every parameter as a leaf ``[C, *shape]``; its
forward is :func:`torch.func.functional_call` of the client network under :func:`torch.func.vmap` over
the client dim, on the clients' own mini-batches stacked ``[C, B, ...]`` (a shorter batch is padded
and its padding masked out of the client's mean loss). The loss is the SUM of the clients' losses, so
one ordinary backward leaves each client's own gradient in its slice of ``.grad``; the strategy's
hooks (:attr:`~fl_lightning.api.strategy.Strategy.vectorizable`) and the local ``torch.optim``
optimizer (SGD, Adam, AdamW: elementwise, so per client exact) then run once for the group, in the
sequential round's own loop (:func:`~fl_lightning.engine.local.local_optimizer` and
:func:`~fl_lightning.engine.local.local_steps`, on the stacked worker and a stacked context). A network
that is a chain of linear layers runs on the CPU as a batched chain with a hand-written backward instead
of under vmap, with the local SGD step fused into it where nothing reads the gradients
(:mod:`~fl_lightning.engine.batched`); whether a CPU process batches its groups at all is measured
(:mod:`~fl_lightning.engine.calibrate`).

Each client keeps what makes its result its own: its batches (drawn from its own generator, seeded by
``(seed, round, client_id)`` exactly as in :func:`~fl_lightning.engine.local.train_client`), its number
of steps (a client's parameters, state and step-to-step values are taken when its own last step is
done; the group's later steps do not touch them), its optimizer state, the round's lr, per-client
gradient clipping and persistent state. Its upload then runs as in the sequential round
(:func:`finish_client`), on the worker loaded with its trained weights.

With ``model.runtime.compile`` the group's forward is compiled (:meth:`StackedWorker.compile_forward`): the
vmapped :func:`~torch.func.functional_call` over the stacked parameters is one function compiled with
``torch.compile`` (its forward and, through AOTAutograd, its backward; a linear chain then runs it too);
batches are then padded to the full batch size, so a ragged last batch keeps the compiled shapes.

What does not vectorise trains one client at a time with one notice per run naming the reason, and
only for a declared reason: :func:`cannot_vectorize` (strategies that do not declare it, modules whose
training step is custom, BatchNorm running statistics, dropout (its random draws inside ``vmap`` cannot
replay the sequential run's) and 16-bit mixed precision's gradient scaler), or an
:class:`UnvectorizableError` from :func:`train_stacked` (clients that do not share one data tensor, a
local optimizer that is not elementwise, a strategy's state or scratch that is not stacked, an operation
of the network that ``vmap`` cannot batch). Any other error propagates.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pad_sequence

from fl_lightning.api.client import ClientModule
from fl_lightning.api.metrics import TaskMetrics
from fl_lightning.api.strategy import cannot_vectorize as strategy_cannot_vectorize
from fl_lightning.api.strategy import declaring, vector_scratch
from fl_lightning.api.types import ClientContext, ClientResult
from fl_lightning.data.federated import ClientData, take_stacked
from fl_lightning.engine.batched import (
    CHAIN_DEVICES,
    ChainRun,
    chain_runs_on,
    fusion_blocker,
    linear_chain,
)
from fl_lightning.engine.calibrate import host_memory_budget
from fl_lightning.engine.local import (
    LocalConfig,
    _dropping,
    client_result,
    client_rng,
    client_seed,
    eval_batch_size,
    local_optimizer,
    local_steps,
    start_client,
)
from fl_lightning.functional.tensor import Payload, load_tensors, module_device, to_device

if TYPE_CHECKING:
    from fl_lightning.api.strategy import Strategy

log = logging.getLogger(__name__)

#: Local optimizers whose update is elementwise (per client exact on stacked parameters).
BATCHED_OPTIMIZERS = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)
#: torch's dropout layers (by their public classes).
_DROPOUT = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)
#: Bytes per client of model-size tensors besides the activations: parameters, gradients, optimizer
#: state (up to 2), stacked message and state entries, the strategy's terms and SAM's saved weights.
_MODEL_COPIES = 8


class UnvectorizableError(RuntimeError):
    """A group of clients that cannot be stacked (the round trains them one at a time instead)."""


def cannot_vectorize(
    worker: nn.Module, strategy: Strategy, config: LocalConfig, precision: Any
) -> str | None:
    """Why the round's clients cannot be trained vectorised (None: they can); one short clause."""
    reason = strategy_cannot_vectorize(strategy, worker)  # the strategy's Vectorizable declarations
    if reason is not None:
        return reason
    if not isinstance(worker, ClientModule):
        return f"{type(worker).__name__} is not a ClientModule"
    if not type(worker).stackable:  # declared, or the fallback for an override of its STACKED_METHODS
        return f"{type(worker).__name__} is not stackable (it changes what the stacked worker re-implements)"
    named = list(worker.named_parameters(remove_duplicate=False))
    if any(not n.startswith("net.") for n, _ in named):
        return "the client has parameters outside its net"
    if len({id(p) for _, p in named}) != len(named):
        return "the network shares (ties) parameters"
    for module in worker.modules():
        running = getattr(module, "running_mean", None) is not None  # BatchNorm, InstanceNorm(track_...)
        if running and getattr(module, "track_running_stats", False):
            return f"{type(module).__name__} keeps running statistics"
        if isinstance(module, _DROPOUT) and module.p > 0:
            return "dropout's random draws inside vmap cannot replay the sequential run's"
    if getattr(precision, "scaler", None) is not None:
        return "16-bit mixed precision steps through a gradient scaler"
    return None


def runs_under_vmap(not_chain: str, device: torch.device, config: LocalConfig, precision: Any) -> str | None:
    """Why a stacked group would run its forward and backward under ``torch.func.vmap`` rather than as the
    batched linear chain (None: as the chain); one short clause. ``not_chain`` is why its network is not a
    linear chain (:func:`~fl_lightning.engine.batched.linear_chain`'s reason; empty: it is one)."""
    if not_chain:
        return f"its network is not a linear chain: {not_chain}"
    if not chain_runs_on(device):
        return f"the batched linear chain runs on {', '.join(CHAIN_DEVICES)}, not {device.type}"
    if config.compile_mode(device) is not None:
        return "model.runtime.compile is set (a compiled group runs under vmap)"
    if _autocasts(precision, device):
        return "its training steps run under autocast"
    return None


class StackedWorker(nn.Module):
    """``size`` copies of a client's network as one module: every parameter a leaf ``[size, *shape]``.

    Parameter names are the worker's (``net.<...>``), so strategies pair them with message and state
    entries by name as usual. ``forward`` maps inputs ``[size, B, ...]`` to outputs ``[size, B, ...]``
    (each client's slice through its own parameters): under :func:`torch.func.vmap`, or, for a network
    that is a chain of linear layers on a device of :data:`~fl_lightning.engine.batched.CHAIN_DEVICES`
    (the CPU), as a batched chain with a hand-written backward (:attr:`chain`). Buffers are shared (no
    running statistics: see :func:`cannot_vectorize`). ``training_step`` takes ``(x, y, weight, count)``:
    ``weight`` ``[size, B]`` masks padding and ``count`` ``[size]`` is each client's real batch size.
    """

    def __init__(self, worker: ClientModule, size: int, within: StackedWorker | None = None) -> None:
        super().__init__()
        if within is not None and within.size < size:
            raise ValueError(f"a stack of {size} cannot be within one of {within.size}")
        self.size = size
        self._outer = () if within is None else (within,)  # not a submodule: its parameters are not ours
        self.net = copy.deepcopy(worker.net)
        outer = dict(within.net.named_parameters()) if within is not None else {}
        for name, p in list(self.net.named_parameters()):
            owner, _, attr = name.rpartition(".")
            if within is not None:  # a view of the larger stack's first slots: no copy
                stacked = outer[name].detach()[:size]
            else:
                stacked = p.detach().unsqueeze(0).repeat(size, *([1] * p.dim()))
            setattr(self.net.get_submodule(owner), attr, nn.Parameter(stacked, requires_grad=p.requires_grad))
        self.task = worker.task
        self.optimizer_name = worker.optimizer_name
        self.lr = worker.lr
        self.momentum = worker.momentum
        self.weight_decay = worker.weight_decay
        self._train_paused = False  # set by the SAM step around its second pass
        self._local_logs = None
        #: ``(step, losses [size], correct [size, B])`` of each tracked training step.
        self.records: list[tuple[int, Tensor, Tensor]] = []
        #: The ``torch.compile`` mode of the forward (None: eager); see :meth:`compile_forward`.
        self.compile_mode: str | None = None
        self._stacked_fn = self._stacked
        if within is not None:
            layers, why = (within.chain.layers if within.chain is not None else None), within.chain_reason
        else:
            layers, why = linear_chain(worker.net)
        buffers = within.chain.buffers if within is not None and within.chain is not None else None
        #: The network as a batched linear chain (None: it is not one, see :attr:`chain_reason`).
        self.chain = (
            ChainRun(layers, dict(self.net.named_parameters()), buffers) if layers is not None else None
        )
        self.chain_reason = why
        #: Whether the last group ran as the batched linear chain.
        self.chained = False
        #: Why the last group's SGD step was not fused into the chain's backward (None: it was, or no chain).
        self.unfused: str | None = None

    @property
    def within(self) -> StackedWorker | None:
        """The larger stack whose first :attr:`size` slots are this one's parameters (None: its own)."""
        return self._outer[0] if self._outer else None

    def materialize(self) -> None:
        """Write the fused SGD steps the chain holds back into the stacked parameters (see
        :class:`~fl_lightning.engine.batched.Deferred`)."""
        if self.chain is not None:
            self.chain.materialize()

    def uses_chain(self, device: torch.device) -> bool:
        """Whether the forward on ``device`` is the batched linear chain (eager only; compiled: vmap)."""
        return self.chain is not None and chain_runs_on(device) and self.compile_mode is None

    def _one(self, params: dict[str, Tensor], x: Tensor) -> Tensor:
        return torch.func.functional_call(self.net, params, (x,))

    def _stacked(self, x: Tensor) -> Tensor:
        """Outputs ``[size, B, ...]``: every client's slice of ``x`` through its own slice of the leaves."""
        return torch.func.vmap(self._one, randomness="error")(dict(self.net.named_parameters()), x)

    def compile_forward(self, mode: str | None) -> None:
        """Compile the forward with ``torch.compile(mode=mode)`` (None: eager); a no-op if already so.

        Compiled: the vmapped forward :meth:`_stacked` (which reads the stacked leaves from the module,
        so they are the compiled code's static inputs: with ``"reduce-overhead"`` its CUDA graphs are
        recorded for their fixed addresses, which the optimizer and the in-place weight loads keep). The
        compiled callable is kept on the stack and reused by every step, client and round it trains; the
        batches have one shape (:func:`train_stacked` pads them to the full batch size), so it compiles
        once, for static shapes (``dynamic=False``: another group size compiles its own code, as CUDA
        graphs would).
        """
        if mode == self.compile_mode:
            return
        self.compile_mode = mode
        if mode is None:
            self._stacked_fn = self._stacked
        else:
            self._stacked_fn = torch.compile(self._stacked, mode=mode, dynamic=False)

    def forward(self, x: Tensor) -> Tensor:
        if (
            self.chain is not None
            and self.uses_chain(x.device)
            and not torch.is_autocast_enabled(x.device.type)
        ):
            return self.chain(x)  # (under autocast, e.g. bf16-mixed, vmap keeps autocast's casts)
        return self._vmapped(self._stacked_fn, x)

    def eager(self, x: Tensor) -> Tensor:
        """The forward, never compiled (e.g. for evaluation batches, whose shapes the compiled code was
        not recorded for): the chain where it runs, else vmap."""
        if (
            self.chain is not None
            and chain_runs_on(x.device)
            and not torch.is_autocast_enabled(x.device.type)
        ):
            return self.chain(x)
        return self._vmapped(self._stacked, x)

    def _vmapped(self, fn: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
        try:
            return fn(x)
        except RuntimeError as err:  # an operation without a batching rule: a declared reason
            text = str(err)
            if "Batching rule not implemented" not in text and not text.startswith("vmap"):
                raise
            first = text.strip().splitlines()[0]
            raise UnvectorizableError(f"vmap cannot batch {type(self.net).__name__} ({first[:120]})") from err

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return ClientModule.configure_optimizers(self)  # type: ignore[arg-type]

    def training_step(self, batch: Any, batch_idx: int) -> dict[str, Tensor]:
        """Sum over clients of each client's mean task loss over its real samples, and the outputs
        ``[size, B, ...]`` (for the strategy's ``local_loss``)."""
        x, y, weight, count = batch
        outputs = self(x)
        losses = self._losses(outputs, y, weight, count)
        if not self._train_paused:
            self.records.append((batch_idx, losses.detach(), self.task.correct(outputs, y)))
        return {"loss": losses.sum(), "outputs": outputs}

    def _losses(self, outputs: Tensor, y: Tensor, weight: Tensor, count: Tensor) -> Tensor:
        """``[size]`` mean task losses over the real samples of outputs ``[size, B, ...]``."""
        return (self.task.loss(outputs, y, reduction="none") * weight).sum(1) / count

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Nothing (ClientModule's hook is Lightning's no-op; overriding it falls back)."""


@dataclass
class Trained:
    """One client's values at the end of its own local steps in a vectorised group."""

    params: dict[str, Tensor]
    state: dict[str, Tensor]
    scratch: dict[str, Any]
    records: list[tuple[Tensor, Tensor]] = field(default_factory=list)
    lr: float = 0.0
    #: ``params`` are views of the stack's slots (the client's last step was the group's).
    view: bool = False


def train_stacked(
    stack: StackedWorker,
    strategy: Strategy,
    messages: list[Payload],
    states: list[dict[str, Tensor]],
    datas: list[ClientData],
    round: int,
    config: LocalConfig,
    precision: Any = None,
    steps: list[int] | None = None,
) -> list[Trained]:
    """The local steps of ``len(datas)`` clients as one computation on ``stack``; each client's result.

    The steps are the sequential round's own (:func:`~fl_lightning.engine.local.local_optimizer` and
    :func:`~fl_lightning.engine.local.local_steps`) on the stacked worker and a stacked context, over the
    clients' batches stacked per step (:func:`_stacked_batches`); after each step, the clients whose last
    step it was are taken out (:func:`_take`). Each client runs ``config.num_steps`` of its data, or its entry
    of ``steps`` (the engine's decision, e.g. a straggler's partial work).

    Raises :class:`UnvectorizableError` for a declared reason before any client's result is used (the
    executor then trains the group one client at a time, with a notice naming the reason); any other error
    propagates.
    """
    size = len(datas)
    if stack.size != size:
        raise ValueError(f"a stack of {stack.size} cannot train {size} clients")
    device = module_device(stack)
    if any(d.x is not datas[0].x or d.y is not datas[0].y for d in datas):
        raise UnvectorizableError("the clients do not index one shared data tensor")
    steps = [config.num_steps(d) for d in datas] if steps is None else list(steps)
    ctx = ClientContext(
        -1,
        round,
        stack_payloads(messages),
        stack_states(states, device),
        sum(d.num_samples for d in datas),
        max(steps),
        0.0,
        seed=config.seed,
        stacked=size,
    )
    mode = config.compile_mode(device)
    stack.compile_forward(mode)
    width = config.batch_size if mode is not None else 0  # compiled: one batch shape for every step
    stack.train()
    stack.records.clear()
    load_tensors(stack, ctx.message.get("weights", {}))
    trained: list[Trained | None] = [None] * size
    last = max(steps)
    with _dropping(ctx.scratch), _fusing(stack) as fuse:
        optimizer = local_optimizer(stack, strategy, ctx, config)
        if type(optimizer) not in BATCHED_OPTIMIZERS:
            raise UnvectorizableError(f"the local optimizer {type(optimizer).__name__} is not elementwise")
        stack.chained = runs_under_vmap(stack.chain_reason, device, config, precision) is None
        if stack.chained:
            fuse(
                optimizer,
                fusion_blocker(strategy, optimizer, config, precision),
                _bases(stack, strategy, ctx),
            )
        counts: list[list[int]] = []  # each step's real batch size per client
        batches = _stacked_batches(datas, steps, round, config, precision, width, counts)
        named = list(stack.named_parameters())
        for step in local_steps(stack, strategy, optimizer, ctx, batches, config, precision):
            if step + 1 in steps:  # some client's last step: its weights are read
                stack.materialize()
            for k, n in enumerate(steps):
                if n == step + 1:
                    trained[k] = _take(stack, strategy, ctx, k, n, counts, view=n == last, named=named)
    if any(t is None for t in trained):
        raise UnvectorizableError("a client of the group ran no local step")
    return [t for t in trained if t is not None]


@contextlib.contextmanager
def _fusing(stack: StackedWorker) -> Iterator[Callable[..., None]]:
    """While a group trains: ``fuse(optimizer, reason, bases)`` fuses the optimizer's SGD step into the
    chain's backward when ``reason`` is None (else records it in ``stack.unfused``); undone when the group
    ends."""

    def fuse(optimizer: torch.optim.Optimizer, reason: str | None, bases: dict[int, Tensor]) -> None:
        assert stack.chain is not None
        stack.unfused = reason
        stack.chain.fuse(optimizer if reason is None else None, bases)

    stack.unfused = None
    try:
        yield fuse
    finally:
        if stack.chain is not None:
            stack.chain.fuse(None)


def _autocasts(precision: Any, device: torch.device) -> bool:
    """Whether the precision plugin's training steps run under autocast (bf16-mixed)."""
    if precision is None:
        return False
    with precision.train_step_context():
        return torch.is_autocast_enabled(device.type)


def _bases(stack: StackedWorker, strategy: Strategy, ctx: ClientContext) -> dict[int, Tensor]:
    """``{id(stacked parameter): the one tensor every client's slot holds}`` at the start of the steps: the
    message's shared weights, when the strategy does not declare ``prepares_clients`` (the base class's
    ``on_client_start`` loads nothing else into them)."""
    if declaring(strategy, "prepares_clients"):
        return {}
    weights = ctx.message.get("weights", {})
    return {
        id(p): weights[n].detach()
        for n, p in stack.named_parameters()
        if n in weights and weights[n].shape == p.shape[1:] and weights[n].device == p.device
    }


def _stacked_batches(
    datas: list[ClientData],
    steps: list[int],
    round: int,
    config: LocalConfig,
    precision: Any,
    width: int,
    counts: list[list[int]],
) -> Iterator[tuple[Tensor, Tensor, Tensor, Tensor]]:
    """Each step's batch of the group, ``(x, y, weight, count)`` (:func:`_stacked_batch`): every client's
    indices drawn from its own generator, seeded by ``(seed, round, client_id)`` as in the sequential round
    (a client past its last step contributes an empty batch); appends the step's real sizes to ``counts``."""
    generators = [torch.Generator().manual_seed(client_seed(config.seed, round, d.client_id)) for d in datas]
    streams = [d.batch_indices(config.batch_size, n, g) for d, n, g in zip(datas, steps, generators)]
    none = torch.zeros(0, dtype=torch.long, device=datas[0].x.device)
    masks: dict[tuple[Any, ...], tuple[Tensor, Tensor]] = {}  # steps of the same sizes share their masks
    for step in range(max(steps)):
        idx = [next(s) if step < n else none for s, n in zip(streams, steps)]
        sizes = [int(i.numel()) for i in idx]
        counts.append(sizes)
        yield _stacked_batch(idx, sizes, datas, generators, precision, width, masks)


def _stacked_batch(
    idx: list[Tensor],
    counts: list[int],
    datas: list[ClientData],
    generators: list[torch.Generator],
    precision: Any,
    width: int = 0,
    masks: dict[tuple[Any, ...], tuple[Tensor, Tensor]] | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(x, y, weight, count)``: the clients' batches gathered with one indexing of the data they share
    (each client's rows then through its transform, drawing from its generator as its sequential batches
    do: :func:`~fl_lightning.data.federated.take_stacked`), padded to the longest or to ``width`` samples.
    ``masks`` keeps ``(weight, count)`` by the batch sizes, for the next steps of the same sizes."""
    if counts[0] >= max(width, 1) and all(c == counts[0] for c in counts):
        padded = torch.stack(idx)  # no padding
    else:
        padded = pad_sequence(idx, batch_first=True)  # padding indexes row 0, masked out by ``weight``
        if padded.shape[1] < width:
            padded = F.pad(padded, (0, width - padded.shape[1]))
    key = (*counts, padded.shape[1])
    mask = masks.get(key) if masks is not None else None
    if mask is None:
        count = torch.tensor(counts, dtype=torch.float32).to(padded.device, non_blocking=True)
        weight = (torch.arange(padded.shape[1], device=padded.device) < count[:, None]).float()
        mask = (weight, count.clamp(min=1))
        if masks is not None:
            masks[key] = mask
    weight, count = mask
    if all(d.transform is None for d in datas):  # one gather (index_select: several times faster)
        flat = padded.reshape(-1)
        x = datas[0].x.index_select(0, flat).view(*padded.shape, *datas[0].x.shape[1:])
        y = datas[0].y.index_select(0, flat).view(*padded.shape, *datas[0].y.shape[1:])
    else:
        x, y = take_stacked(datas, generators, padded, counts)  # through each client's transform
    if precision is not None:
        x, y = precision.convert_input((x, y))
    return x, y, weight, count


def _take(
    stack: StackedWorker,
    strategy: Strategy,
    ctx: ClientContext,
    k: int,
    steps: int,
    counts: list[list[int]],
    view: bool = False,
    named: list[tuple[str, nn.Parameter]] | None = None,
) -> Trained:
    """Client ``k``'s parameters, state, step-to-step values and train records after its last step.

    ``view``: its last step is the group's, so its parameters are taken as views of the stack (no copy:
    nothing changes the stack before the group's results are used, see :func:`finish_client`).
    """
    size = stack.size
    named = list(stack.named_parameters()) if named is None else named
    params = {n: p.detach()[k] if view else p.detach()[k].clone() for n, p in named}
    state = {}
    for key, t in ctx.state.items():
        if t.dim() == 0 or t.shape[0] != size:
            raise UnvectorizableError(f"ctx.state[{key!r}] is not stacked over the clients")
        state[key] = t[k].clone()
    scratch = {
        key: _slice(ctx.scratch[key], k, size) for key in vector_scratch(strategy) if key in ctx.scratch
    }
    records = [(loss[k], correct[k, : counts[s][k]]) for s, loss, correct in stack.records if s < steps]
    return Trained(params, state, scratch, records, ctx.lr, view)


def _slice(value: Any, k: int, size: int) -> Any:
    if isinstance(value, Tensor):
        if value.dim() == 0 or value.shape[0] != size:
            raise UnvectorizableError("a vector_scratch tensor is not stacked over the clients")
        return value.detach()[k].clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_slice(v, k, size) for v in value)
    if isinstance(value, dict):
        return {key: _slice(v, k, size) for key, v in value.items()}
    return copy.copy(value)


def stack_payloads(payloads: list[Payload]) -> Payload:
    """The clients' messages as one: an entry that is the same tensor for every client stays shared
    (unstacked, it broadcasts), the others are stacked along a new dim 0."""
    first = payloads[0]
    if any(set(p) != set(first) or any(set(p[g]) != set(first[g]) for g in first) for p in payloads):
        raise UnvectorizableError("the clients' messages have different entries")
    out: Payload = {}
    for group, entries in first.items():
        out[group] = {}
        for name, t in entries.items():
            ts = [p[group][name] for p in payloads]
            out[group][name] = t if all(_same(t, u) for u in ts[1:]) else torch.stack(ts)
    return out


def _same(a: Tensor, b: Tensor) -> bool:
    return a is b or (
        a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.dtype == b.dtype
        and a.device == b.device
    )


def stack_states(states: list[dict[str, Tensor]], device: torch.device) -> dict[str, Tensor]:
    """The clients' states stacked along dim 0 on ``device``; an entry a client lacks is zeros."""
    keys = list(dict.fromkeys(k for s in states for k in s))
    out = {}
    for key in keys:
        like = next(s[key] for s in states if key in s)
        ts = [s[key] if key in s else torch.zeros_like(like) for s in states]
        if any(t.shape != like.shape for t in ts):
            raise UnvectorizableError(f"ctx.state[{key!r}] has different shapes across the clients")
        out[key] = torch.stack([t.to(device) for t in ts])
    return out


@torch.no_grad()
def evaluate_stacked(
    stack: StackedWorker,
    trained: list[Trained],
    datas: list[ClientData],
    config: LocalConfig,
    precision: Any = None,
) -> list[list[tuple[Tensor, Tensor]]]:
    """Each trained client's ``(outputs, targets)`` on its local test split, batch by batch as
    :func:`~fl_lightning.engine.local.evaluate` takes them (``[]`` for a client without a test split): one
    stacked forward per batch index, in eval mode, on the clients' trained weights (the slots of clients
    whose last step came before the group's get their trained weights back first). The clients' metrics
    are then updated with them in :func:`finish_client`, as the sequential round updates them.
    """
    device = module_device(stack)
    early = [(k, t) for k, t in enumerate(trained) if not t.view]
    named = list(stack.named_parameters())
    if early:
        dst = [p.detach()[k] for k, _ in early for _, p in named]
        torch._foreach_copy_(dst, [t.params[n] for _, t in early for n, _ in named])
    size = eval_batch_size(config)
    per = [list(d.eval_batches(size)) if d.test_idx.numel() else [] for d in datas]
    out: list[list[tuple[Tensor, Tensor]]] = [[] for _ in datas]
    step_ctx = precision.val_step_context() if precision is not None else contextlib.nullcontext()
    was = stack.training
    stack.eval()
    try:
        with step_ctx:
            for j in range(max((len(b) for b in per), default=0)):
                batch = [to_device(b[j], device) if j < len(b) else None for b in per]
                like = next(xy for xy in batch if xy is not None)[0]
                width = max(xy[0].shape[0] for xy in batch if xy is not None)
                x = like.new_zeros(len(batch), width, *like.shape[1:])
                for k, xy in enumerate(batch):
                    if xy is not None:
                        x[k, : xy[0].shape[0]] = xy[0]
                if precision is not None:
                    x = precision.convert_input(x)
                logits = stack.eager(x).float()
                for k, xy in enumerate(batch):
                    if xy is not None:
                        out[k].append((logits[k, : xy[0].shape[0]], xy[1]))
    finally:
        stack.train(was)
    return out


def finish_client(
    worker: ClientModule,
    strategy: Strategy,
    message: Payload,
    state: dict[str, Tensor],
    data: ClientData,
    trained: Trained,
    round: int,
    config: LocalConfig,
    precision: Any = None,
    eval_metrics: TaskMetrics | None = None,
    evaluated: list[tuple[Tensor, Tensor]] | None = None,
) -> ClientResult:
    """A vectorised client's upload, metrics and evaluation, as :func:`train_client` ends its work.

    ``strategy.on_client_start`` runs on ``worker`` with the client's message and state at the start of
    the round (so its aligned lists point at the worker); then the worker gets the trained weights, the
    context the final state entries and ``vector_scratch`` values, and ``upload``/``process_upload`` run
    in the client's RNG stream. ``trained.params`` may be views of the stack (:func:`_take`): the group's
    clients are finished before the stack trains again. ``evaluated``: the client's outputs on its local
    test split from :func:`evaluate_stacked` (None: evaluated here on the worker).
    """
    device = module_device(worker)
    # the base class's on_client_start reads no weights: the message's need not be loaded before the client's
    load = declaring(strategy, "prepares_clients") is not None
    with client_rng(config.seed, round, data.client_id, device):
        ctx = start_client(worker, strategy, message, state, data, round, config, trained.lr, load)
        num_steps = ctx.num_steps
        with worker.local_training(), _dropping(ctx.scratch):
            strategy.on_client_start(worker, ctx)
            ctx.lr, ctx.step = trained.lr, num_steps - 1
            load_tensors(worker, trained.params)
            ctx.state.update(trained.state)
            ctx.scratch.update(trained.scratch)
            worker._train_batches.extend(trained.records)
            return client_result(
                worker, strategy, ctx, message, data, config, precision, eval_metrics, evaluated
            )


def client_bytes(worker: ClientModule, data: ClientData, batch_size: int) -> int:
    """An estimate of the device memory one more client adds to a vectorised group, in bytes.

    ``8`` model-size copies (parameters, gradients, optimizer state, stacked message and state entries,
    the strategy's terms) plus twice the tensors one forward on a full batch saves for backward
    (measured with ``saved_tensors_hooks`` on one batch of the client's data).
    """
    model = sum(p.numel() * p.element_size() for p in worker.parameters())
    saved = 0

    def pack(t: Tensor) -> Tensor:
        nonlocal saved
        saved += t.numel() * t.element_size()
        return t

    device = module_device(worker)
    idx = data.train_idx[:batch_size].to(data.x.device)
    x, y = data.x[idx].to(device), data.y[idx].to(device)
    if x.is_floating_point():  # as the precision plugin converts the inputs (64-true: float64)
        x = x.to(next(p.dtype for p in worker.parameters() if p.is_floating_point()))
    was = worker.training
    worker.train()
    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        worker.task_loss(worker(x), y)
    worker.train(was)
    return _MODEL_COPIES * model + 2 * saved


def group_size(
    requested: int, worker: ClientModule, data: ClientData, batch_size: int, budget_gb: float | None
) -> tuple[int, str]:
    """Clients per vectorised group: ``requested``, bounded by the memory budget; and a note on why.

    The budget is ``budget_gb`` (GiB) if given, else 80% of the free memory of a CUDA device, or on the
    CPU half the host's available memory (:func:`~fl_lightning.engine.calibrate.host_memory_budget`).
    """
    device = module_device(worker)
    budget = None
    if budget_gb is not None:
        budget = budget_gb * 2**30
    elif device.type == "cuda":
        budget = 0.8 * torch.cuda.mem_get_info(device)[0]
    else:
        budget = host_memory_budget()
    if budget is None:
        return requested, "no memory budget: the host's available memory is unknown"
    each = client_bytes(worker, data, batch_size)
    fits = max(1, int(budget // each))
    note = f"about {each / 2**20:.0f} MiB per client, budget {budget / 2**30:.1f} GiB"
    return min(requested, fits), note
