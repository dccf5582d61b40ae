"""A vectorised group's network as a batched chain of linear layers, and the local SGD step fused into it.

Cross-device work trains hundreds of small clients per round, most often on fully connected networks
(the FedAvg paper's 2NN, logistic regression, the heads of small models). For a network that is a chain
of ``Linear`` layers, elementwise activations (ReLU, tanh, sigmoid) and flattening (:func:`linear_chain`,
read from its ``torch.fx`` graph, so a network whose forward does anything else is not one), the
:class:`~fl_lightning.engine.vectorized.StackedWorker` computes the group's forward with one batched
matrix product per layer on its stacked weights ``[C, out, in]`` (``torch.baddbmm``) and the backward by
hand (:class:`_Chain`): ``dX = dY W`` and ``dW = dY^T X`` per client, one ``bmm`` each, no ``vmap`` and
none of autograd's per-op bookkeeping. The task loss (and a strategy's ``local_loss`` on the outputs) stays
autograd's: the chain only takes the gradient of its outputs.

**The fused SGD step.** Where nothing reads the gradients between the backward and the step, the
backward applies the local SGD step itself, layer by layer, once it has used the layer's weights
(:meth:`_Chain.backward`): ``W <- (1 - lr wd) W - lr dY^T X`` as one ``baddbmm_`` into the stacked
weights (the bias likewise). No gradient is written and read back: a hundred clients' first-layer weights
(63 MB for the 2NN) do not stay in cache, the round is bound by memory traffic, and this halves it. It is
PyTorch's "optimizer step in the backward" pattern, taken one step further (the gradient is never
materialised). It runs inside the one local-steps loop (:func:`~fl_lightning.engine.local.local_steps`):
the loop still zeroes the gradients, calls the closure and the hooks and steps the optimizer, which finds no
gradient and does nothing. Fused exactly when :func:`fusion_blocker` finds nothing that could tell:
the local optimizer is ``torch.optim.SGD`` without momentum (weight decay is folded into ``baddbmm_``'s
``beta``), not ``maximize``, with a float lr; no gradient clipping (``model.grad_clip_norm``) and no
gradient scaler (``16-mixed``); and the strategy (with its plug-ins) keeps the base class's ``local_step``,
``local_loss``, ``on_before_optimizer_step`` and ``on_after_optimizer_step``, the hooks that could add to,
read or change the gradients (FedAvg, FedAvgM, FedAdam, FedExP, and the plug-ins Median, TrimmedMean,
Krum, NormBounded, Attack, DP, FineTune around them, do). Otherwise the backward returns the gradients and
the optimizer steps as usual (the chain is still batched).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn

from fl_lightning.api.strategy import declaring

if TYPE_CHECKING:
    from fl_lightning.api.strategy import Strategy
    from fl_lightning.engine.local import LocalConfig

#: Devices on which a stacked group whose network is a linear chain runs it (:class:`_Chain`) rather than
#: ``vmap``. The CPU only: on a GPU the vmapped forward is the path measured and tested there (its tests in
#: the ``cuda`` lane run the chain on CUDA too).
CHAIN_DEVICES: tuple[str, ...] = ("cpu",)


def chain_runs_on(device: torch.device) -> bool:
    """Whether a stacked linear chain runs as one (not under vmap) on ``device`` (:data:`CHAIN_DEVICES`)."""
    return device.type in CHAIN_DEVICES


#: A linear layer whose stacked weights take at least this many bytes holds its fused SGD steps back
#: (:class:`Deferred`): far larger than the per-core caches (2 MiB of L2 on the benchmarks' machine), where
#: a step's traffic over the weights, not its arithmetic, sets its time.
DEFER_BYTES = 4 * 2**20
_ACTIVATIONS = {nn.ReLU: "relu", nn.Tanh: "tanh", nn.Sigmoid: "sigmoid"}
_FUNCTIONS = {
    torch.relu: "relu",
    F.relu: "relu",
    torch.tanh: "tanh",
    torch.sigmoid: "sigmoid",
    F.sigmoid: "sigmoid",
    F.tanh: "tanh",
}


@dataclass(frozen=True)
class Layer:
    """One step of a linear chain: ``kind`` is ``linear`` (``weight``/``bias``: parameter names in the
    network, ``bias`` None without one), ``relu``, ``tanh``, ``sigmoid``, ``flatten`` (all dims after the
    batch's) or ``cast`` (to the parameters' dtype)."""

    kind: str
    weight: str | None = None
    bias: str | None = None


def linear_chain(net: nn.Module) -> tuple[tuple[Layer, ...] | None, str]:
    """``net`` as a chain of :class:`Layer`\\ s, or ``(None, why not)`` (one short clause).

    Read from ``torch.fx.symbolic_trace(net)``: one input, each node taking the previous node's value as its
    only tensor argument and feeding only the next, ending at the output: ``nn.Linear``, ``nn.ReLU``/
    ``nn.Tanh``/``nn.Sigmoid`` and their functions and methods, ``nn.Flatten``/``flatten`` from dim 1,
    ``nn.Identity``, ``nn.Dropout(p=0)``, and ``.to(<a parameter>.dtype)``. Every parameter of ``net``
    belongs to one of its linear layers.
    """
    try:
        graph = fx.symbolic_trace(net).graph
    except Exception as err:  # control flow on the inputs, a module fx cannot trace
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        return None, f"torch.fx cannot trace it ({first[:80]})"
    layers: list[Layer] = []
    value: fx.Node | None = None
    for node in graph.nodes:
        if node.op == "placeholder":
            if value is not None:
                return None, "its forward takes more than one input"
            value = node
            continue
        if node.op == "get_attr" or _is_dtype_of_attr(node):
            continue  # only read by a ``.to(<parameter>.dtype)``, checked there
        if node.op == "output":
            if node.args[0] is not value:
                return None, "its output is not the end of the chain"
            break
        if value is None or not node.args or node.args[0] is not value or len(value.users) != 1:
            return None, f"{node.name} does not continue a chain"
        layer = _layer(net, node)
        if isinstance(layer, str):
            return None, layer
        if layer is not None:
            layers.append(layer)
        value = node
    linear = [layer for layer in layers if layer.kind == "linear"]
    if not linear:
        return None, "it has no linear layer"
    if len({layer.weight for layer in linear}) < len(linear):
        return None, "it uses a linear layer twice"
    used = {n for layer in linear for n in (layer.weight, layer.bias) if n is not None}
    if {n for n, _ in net.named_parameters()} != used:
        return None, "it has parameters outside its linear layers"
    return tuple(layers), ""


def _is_dtype_of_attr(node: fx.Node) -> bool:
    return (
        node.op == "call_function"
        and node.target is getattr
        and len(node.args) == 2
        and node.args[1] == "dtype"
        and isinstance(node.args[0], fx.Node)
        and node.args[0].op == "get_attr"
    )


def _layer(net: nn.Module, node: fx.Node) -> Layer | str | None:
    """The layer of ``node`` (None: the identity), or why it is not one."""
    rest, kwargs = node.args[1:], dict(node.kwargs)
    if node.op == "call_module":
        module = net.get_submodule(str(node.target))
        if rest or kwargs:
            return f"{node.target} takes more than the chain's value"
        if type(module) is nn.Linear:
            return Layer(
                "linear", f"{node.target}.weight", f"{node.target}.bias" if module.bias is not None else None
            )
        if type(module) in _ACTIVATIONS:
            return Layer(_ACTIVATIONS[type(module)])
        if type(module) is nn.Flatten and module.start_dim == 1 and module.end_dim == -1:
            return Layer("flatten")
        if type(module) is nn.Identity or (type(module) is nn.Dropout and module.p == 0):
            return None
        return f"{type(module).__name__} is not a linear-chain layer"
    kwargs.pop("inplace", None)
    if node.op == "call_method":
        if node.target == "flatten" and _flattens_from_1(rest, kwargs):
            return Layer("flatten")
        if node.target in ("relu", "tanh", "sigmoid") and not rest and not kwargs:
            return Layer(str(node.target))
        if node.target == "to" and len(rest) == 1 and not kwargs and _is_dtype_of_attr(rest[0]):
            return Layer("cast")
        return f"the method {node.target} is not a linear-chain step"
    if node.op == "call_function":
        if node.target is torch.flatten and _flattens_from_1(rest, kwargs):
            return Layer("flatten")
        kind = _FUNCTIONS.get(node.target)  # type: ignore[call-overload]
        if kind is not None and not rest and not kwargs:
            return Layer(kind)
        return f"{getattr(node.target, '__name__', node.target)} is not a linear-chain step"
    return f"{node.op} {node.target} is not a linear-chain step"


def _flattens_from_1(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    start = args[0] if args else kwargs.pop("start_dim", 0)
    end = args[1] if len(args) > 1 else kwargs.pop("end_dim", -1)
    return start == 1 and end == -1 and len(args) <= 2 and not kwargs


def fusion_blocker(
    strategy: Strategy, optimizer: torch.optim.Optimizer, config: LocalConfig, precision: Any
) -> str | None:
    """Why the local SGD step cannot be fused into the batched chain's backward (None: it can); one clause.

    See the module docstring: plain ``torch.optim.SGD`` (no momentum, not ``maximize``, float lr; weight
    decay allowed), no clipping, no gradient scaler, and a strategy that does not declare
    ``changes_gradients`` (:data:`~fl_lightning.api.strategy.CAPABILITIES`).
    """
    if type(optimizer) is not torch.optim.SGD:
        return f"the local optimizer is {type(optimizer).__name__}, not plain SGD"
    for group in optimizer.param_groups:
        if group.get("momentum", 0) != 0:
            return "the local SGD has momentum"
        if group.get("maximize") or group.get("differentiable"):
            return "the local SGD maximises or is differentiable"
        if not isinstance(group["lr"], (int, float)) or not isinstance(
            group.get("weight_decay", 0), (int, float)
        ):
            return "the local SGD's lr is a tensor"
    if config.grad_clip_norm is not None:
        return "model.grad_clip_norm clips the gradients"
    if getattr(precision, "scaler", None) is not None:
        return "a gradient scaler steps the optimizer"
    owner = declaring(strategy, "changes_gradients")
    if owner is not None:
        return f"{owner} may read or change the gradients"
    return None


class ChainRun:
    """A stacked group's chain: its layers, its stacked parameters (in the layers' order) and, while the
    SGD step is fused, the optimizer whose param groups give each parameter's lr and weight decay, and the
    steps each large linear layer holds back (:class:`Deferred`)."""

    def __init__(
        self,
        layers: Sequence[Layer],
        params: dict[str, nn.Parameter],
        buffers: dict[int, tuple[Tensor, Tensor]] | None = None,
    ) -> None:
        self.layers = tuple(layers)
        self.params: list[nn.Parameter] = []
        self.index: list[tuple[int, int | None]] = []  # per linear layer: its weight's and bias's position
        for layer in self.layers:
            if layer.kind != "linear":
                continue
            assert layer.weight is not None
            self.params.append(params[layer.weight])
            w = len(self.params) - 1
            b = None
            if layer.bias is not None:
                self.params.append(params[layer.bias])
                b = len(self.params) - 1
            self.index.append((w, b))
        self.fused: torch.optim.Optimizer | None = None
        self.sizes: list[tuple[float, float] | None] = [None] * len(self.params)
        #: Per linear layer (its position in :attr:`index`): the steps not yet in its stacked weights.
        self.deferred: dict[int, Deferred] = {}
        #: Per linear layer: the held-back steps' buffers, kept for the next groups (and shared with the
        #: chains of stacks within the same stack, which use their first slots).
        self.buffers: dict[int, tuple[Tensor, Tensor]] = {} if buffers is None else buffers

    def fuse(self, optimizer: torch.optim.Optimizer | None, bases: dict[int, Tensor] | None = None) -> None:
        """Fuse the SGD step of ``optimizer`` into the backward (None: return gradients; the steps held back
        are dropped, so :meth:`materialize` first).

        A linear layer whose stacked weights take at least :data:`DEFER_BYTES` and have no weight decay
        holds its steps back (:class:`Deferred`); ``bases`` maps ``id(weight)`` to one ``[out, in]`` tensor
        that every client's slot of that weight holds at the start (the message's shared weights), so
        that its forward is one matrix product for the whole group.
        """
        self.fused = optimizer
        self.deferred = {}
        self.sizes = self._step_sizes()
        if optimizer is None:
            return
        for j, (w, _) in enumerate(self.index):
            weight, step = self.params[w], self.sizes[w]
            if step is None or step[1] != 1.0 or weight.numel() * weight.element_size() < DEFER_BYTES:
                continue
            base = (bases or {}).get(id(weight))
            if base is None or base.shape != weight.shape[1:] or base.dtype != weight.dtype:
                base = weight.detach()
            deferred = Deferred(weight, base.detach(), step[0], self.buffers.get(j))
            self.buffers[j] = deferred.storage
            self.deferred[j] = deferred

    @torch.no_grad()
    def materialize(self) -> None:
        """Write every step held back into the stacked weights (they then hold each client's weights)."""
        for deferred in self.deferred.values():
            deferred.flush()

    def _step_sizes(self) -> list[tuple[float, float] | None]:
        """Per parameter ``(lr, 1 - lr * weight_decay)`` of the fused step (None: not stepped here)."""
        sizes: list[tuple[float, float] | None] = [None] * len(self.params)
        if self.fused is None:
            return sizes
        where = {id(p): i for i, p in enumerate(self.params)}
        for group in self.fused.param_groups:
            lr, wd = float(group["lr"]), float(group.get("weight_decay", 0.0))
            for p in group["params"]:
                i = where.get(id(p))
                if i is not None:
                    sizes[i] = (lr, 1.0 - lr * wd)
        return sizes

    def __call__(self, x: Tensor) -> Tensor:
        """The outputs ``[C, B, ...]`` of inputs ``[C, B, ...]``, each client's through its own weights."""
        return _Chain.apply(self, x, *self.params)


class Deferred:
    r"""A linear layer's fused SGD steps held back: its clients' weights are ``W = base + D^T X``.

    A group's stacked weights do not stay in cache (a hundred clients of the 2NN: 63 MB in the first layer),
    and a step that reads them in its forward and reads and writes them in its backward is bound by that
    traffic. Here the backward writes nothing into them: it appends the step's ``X`` (the layer's inputs,
    ``[C, N, in]``) and ``D = -lr dY`` (``[C, N, out]``) to the held-back steps, and the layer computes
    ``h W^T = h base^T + (h X^T) D`` and ``dY W = dY base + (dY D^T) X`` (low-rank corrections of ``N``
    columns per step held back). ``base`` is the clients' common starting weights where they have them
    (one ``[out, in]`` matrix: the forward is one matrix product for the whole group) or the stacked
    weights. :meth:`flush` writes ``base + D^T X`` into the stacked weights in one pass, when the held-back
    columns reach ``in * out / (in + out)`` (the corrections would then cost more than the product) and
    whenever the stacked weights are read (a client's last step, the end of the group:
    :meth:`ChainRun.materialize`). The same SGD steps, in another order of float operations.
    """

    def __init__(
        self, weight: nn.Parameter, base: Tensor, lr: float, buffers: tuple[Tensor, Tensor] | None = None
    ) -> None:
        self.weight = weight
        self.base = base
        self.lr = lr
        size, out, inp = weight.shape
        self.limit = max(1, out * inp // (out + inp))
        like = weight.detach()
        fits = (
            buffers is not None and buffers[0].shape[0] >= size and buffers[0].shape[1:] == (self.limit, inp)
        )
        if buffers is None or not fits or (buffers[0].dtype, buffers[0].device) != (like.dtype, like.device):
            buffers = (like.new_empty(size, self.limit, inp), like.new_empty(size, self.limit, out))
        #: Room for ``X`` and ``D`` of up to :attr:`limit` held-back columns, for at least ``size`` clients
        #: (kept for the next groups); :attr:`buffers` are its first ``size`` slots.
        self.storage = buffers
        self.buffers = (buffers[0][:size], buffers[1][:size])
        self.held = 0

    @property
    def x(self) -> Tensor:
        return self.buffers[0][:, : self.held]

    @property
    def d(self) -> Tensor:
        return self.buffers[1][:, : self.held]

    def times_transposed(self, h: Tensor) -> Tensor:
        """``h W^T`` for ``h`` ``[C, N, in]``."""
        if self.base.dim() == 2:
            out = (h.reshape(-1, h.shape[-1]) @ self.base.t()).view(h.shape[0], h.shape[1], -1)
        else:
            out = torch.bmm(h, self.base.transpose(1, 2))
        if self.held:
            out.baddbmm_(torch.bmm(h, self.x.transpose(1, 2)), self.d)
        return out

    def times(self, dy: Tensor) -> Tensor:
        """``dY W`` for ``dY`` ``[C, N, out]``."""
        if self.base.dim() == 2:
            out = (dy.reshape(-1, dy.shape[-1]) @ self.base).view(dy.shape[0], dy.shape[1], -1)
        else:
            out = torch.bmm(dy, self.base)
        if self.held:
            out.baddbmm_(torch.bmm(dy, self.d.transpose(1, 2)), self.x)
        return out

    def add(self, x: Tensor, dy: Tensor) -> None:
        """Hold back one step ``W <- W - lr dY^T X`` (``x`` ``[C, N, in]``, ``dy`` ``[C, N, out]``)."""
        n = x.shape[1]
        if self.held + n > self.limit:
            self.flush()
        if n > self.limit:  # a batch wider than the buffers: this step straight into the weights
            self.weight.detach().baddbmm_(dy.transpose(1, 2), x, alpha=-self.lr)
            return
        self.buffers[0][:, self.held : self.held + n] = x
        torch.mul(dy, -self.lr, out=self.buffers[1][:, self.held : self.held + n])
        self.held += n

    @torch.no_grad()
    def flush(self) -> None:
        """Write ``base + D^T X`` into the stacked weights; they become the base."""
        weight = self.weight.detach()
        if self.held and self.base.dim() == 2:  # one pass: written, not read
            torch.baddbmm(self.base.expand_as(weight), self.d.transpose(1, 2), self.x, out=weight)
        elif self.held:
            weight.baddbmm_(self.d.transpose(1, 2), self.x)
        self.base, self.held = weight, 0


class _Chain(torch.autograd.Function):
    """The stacked chain's forward (``baddbmm`` per linear layer) and its hand-written backward."""

    @staticmethod
    def forward(ctx: Any, run: ChainRun, x: Tensor, *params: Tensor) -> Tensor:
        size = x.shape[0]
        h = x
        saved: list[Tensor] = []  # per layer: a linear layer's input [C, N, in], an activation's output
        inputs: list[tuple[torch.Size, torch.dtype]] = []  # per layer: the shape and dtype of its input
        linear = 0
        for layer in run.layers:
            inputs.append((h.shape, h.dtype))
            if layer.kind == "flatten":
                h = h.flatten(2)
                saved.append(h)
            elif layer.kind == "cast":
                h = h.to(params[0].dtype)
                saved.append(h)
            elif layer.kind == "linear":
                w, b = run.index[linear]
                deferred = run.deferred.get(linear)
                linear += 1
                weight = params[w]
                flat = h.reshape(size, -1, h.shape[-1])
                saved.append(flat)
                if deferred is not None:
                    out = deferred.times_transposed(flat)
                    if b is not None:
                        out += params[b].unsqueeze(1)
                elif b is not None:
                    out = torch.baddbmm(params[b].unsqueeze(1), flat, weight.transpose(1, 2))
                else:
                    out = torch.bmm(flat, weight.transpose(1, 2))
                h = out.view(*h.shape[:-1], weight.shape[1])
            else:  # an activation (in place on the linear layer's output or a copy of the input)
                owned = bool(saved) and run.layers[len(saved) - 1].kind == "linear"
                h = getattr(h, layer.kind + "_")() if owned else getattr(torch, layer.kind)(h)
                saved.append(h)
        ctx.run, ctx.inputs = run, inputs
        ctx.save_for_backward(*saved)
        return h

    @staticmethod
    @torch.no_grad()
    def backward(ctx: Any, out: Tensor) -> tuple[Tensor | None, ...]:
        run: ChainRun = ctx.run
        saved = ctx.saved_tensors
        params = run.params
        grads: list[Tensor | None] = [None] * len(params)
        sizes = run.sizes
        first = next(i for i, layer in enumerate(run.layers) if layer.kind == "linear")
        stop = 0 if ctx.needs_input_grad[1] else first  # no gradient below the first linear layer
        d = out
        owned = False  # whether ``d`` is this backward's own tensor (may be changed in place)
        linear = len(run.index)
        for i in range(len(run.layers) - 1, stop - 1, -1):
            layer = run.layers[i]
            if layer.kind == "linear":
                linear -= 1
                w, b = run.index[linear]
                weight, x = params[w], saved[i]
                dy = d.reshape(x.shape[0], -1, weight.shape[1])
                deferred = run.deferred.get(linear)
                below = i > first or ctx.needs_input_grad[1]  # a gradient is needed below this layer
                if deferred is not None:  # the weights as the forward used them, then this step held back
                    dx = deferred.times(dy) if below else None
                    deferred.add(x, dy)
                else:
                    dx = torch.bmm(dy, weight) if below else None  # before the weights change
                    _weight_grad(weight, dy, x, sizes[w], grads, w)
                if b is not None:
                    db = dy.sum(1)
                    step = sizes[b]
                    if step is not None:
                        lr, beta = step
                        if beta != 1.0:
                            params[b].mul_(beta)
                        params[b].sub_(db, alpha=lr)
                    elif params[b].requires_grad:
                        grads[b] = db
                if dx is None:
                    break
                d, owned = dx.view(ctx.inputs[i][0]), True
            elif layer.kind == "flatten":
                d = d.reshape(ctx.inputs[i][0])
            elif layer.kind == "cast":
                d = d.to(ctx.inputs[i][1])
            else:
                y = saved[i]
                if layer.kind == "relu":
                    d = d.masked_fill_(y <= 0, 0) if owned else d.masked_fill(y <= 0, 0)
                elif layer.kind == "tanh":
                    d = d.mul_(1 - y * y) if owned else d * (1 - y * y)
                else:  # sigmoid
                    d = d.mul_(y * (1 - y)) if owned else d * (y * (1 - y))
                owned = True
        dx_in = d if ctx.needs_input_grad[1] and stop == 0 else None
        return (None, dx_in, *grads)


def _weight_grad(
    weight: Tensor,
    dy: Tensor,
    x: Tensor,
    step: tuple[float, float] | None,
    grads: list[Tensor | None],
    index: int,
) -> None:
    """``dW = dY^T X`` per client: into ``grads[index]``, or with the fused step straight into the weights
    (``W <- beta W - lr dY^T X``, one ``baddbmm_``)."""
    if step is not None:
        lr, beta = step
        weight.baddbmm_(dy.transpose(1, 2), x, beta=beta, alpha=-lr)
    elif weight.requires_grad:
        grads[index] = torch.bmm(dy.transpose(1, 2), x)


__all__ = [
    "CHAIN_DEVICES",
    "DEFER_BYTES",
    "ChainRun",
    "Deferred",
    "Layer",
    "chain_runs_on",
    "fusion_blocker",
    "linear_chain",
]
