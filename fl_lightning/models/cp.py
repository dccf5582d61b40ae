"""CP-factored layers (TDPFed, Wang et al., Sec. IV-B) and a transform that factors any model.

A :class:`CPLinear` holds ``W = [[A^(1), A^(2)]] = A^(1) A^(2)T`` (eq. 6) and a :class:`CPConv2d` the 4-way
CP kernel ``W = [[A^(1), A^(2), A^(3), A^(4)]]`` (eq. 8); only the factor matrices are parameters, so
every strategy communicates and averages factors (AFM) unless it composes them on the server (ACT).

``factors[n]`` is the factor of dimension ``n`` of the PyTorch weight, so ``cp_reconstruct(factors)``
is the weight in PyTorch layout:

* ``CPLinear``: ``factors = [A^(1) (out, R), A^(2) (in, R)]``, ``weight = A^(1) A^(2)T``.
* ``CPConv2d``: ``factors = [A^(4) (C_out, R), A^(3) (C_in, R), A^(1) (kH, R), A^(2) (kW, R)]``,
  ``weight[t, s, p, q] = sum_r A4[t, r] A3[s, r] A1[p, r] A2[q, r]`` (the paper's ``W[p, q, s, t]``).

Every CP layer also has an empty slot ``dense_weight`` (a non-persistent buffer, never in the state
dict, never communicated): when a dense tensor is put there the layer computes with it instead of the
factors. TDPFed's personalised model ``theta`` is such a dense network sharing the layer structure,
run with :func:`torch.func.functional_call` during training and loaded by :func:`set_dense_weights`
for personalised evaluation.

In a YAML config, factor any network with the :class:`Tensorized` wrapper::

    net:
      class_path: fl_lightning.models.Tensorized
      init_args:
        net: {class_path: fl_lightning.models.MLP, init_args: {in_features: 64}}
        ratio: 2.0
"""

from __future__ import annotations

import logging
import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules.utils import _pair

from fl_lightning.errors import ConfigError
from fl_lightning.functional.cp import (
    compression_ratio,
    cp_als,
    cp_num_params,
    cp_random_factors,
    cp_reconstruct,
    rank_for,
)
from fl_lightning.models.registry import register_model

log = logging.getLogger(__name__)

#: Name of the dense-weight slot of every CP layer (``<layer>.dense_weight`` in functional_call).
DENSE = "dense_weight"

Init = Literal["random", "als"]


class CPLayer(nn.Module):
    """What the CP layers share: ``factors``, ``bias``, the ``dense_weight`` slot, reconstruction, sizes."""

    factors: nn.ParameterList
    bias: nn.Parameter | None
    dense_weight: Tensor | None

    def _init_cp(self, shape: tuple[int, ...], rank: int, bias: bool) -> None:
        if rank < 1:
            raise ValueError(f"CP rank must be >= 1, got {rank}")
        self.rank = rank
        self.weight_shape = shape
        self.factors = nn.ParameterList([nn.Parameter(torch.empty(n, rank)) for n in shape])
        self.bias = nn.Parameter(torch.empty(shape[0])) if bias else None
        self.register_buffer(DENSE, None, persistent=False)

    @property
    def fan_in(self) -> int:
        return math.prod(self.weight_shape[1:])

    def reset_parameters(self) -> None:
        """PyTorch's default scale: entry variance ``1/(3 fan_in)``, bias ``U(+-1/sqrt(fan_in))``.

        That is the variance of ``nn.Linear``/``nn.Conv2d``'s default ``kaiming_uniform_(a=sqrt(5))``
        weights, reached with i.i.d. Gaussian factors (:func:`cp_random_factors`).
        """
        self.set_factors(cp_random_factors(self.weight_shape, self.rank, 1.0 / (3 * self.fan_in)))
        if self.bias is not None:
            bound = 1.0 / math.sqrt(self.fan_in)
            nn.init.uniform_(self.bias, -bound, bound)

    @torch.no_grad()
    def set_factors(self, factors: list[Tensor]) -> None:
        """Copy ``factors`` (in the layer's order) into the parameters."""
        for p, f in zip(self.factors, factors, strict=True):
            p.copy_(f)

    def reconstruct(self) -> Tensor:
        """The dense weight ``[[A]]`` in PyTorch layout (differentiable w.r.t. the factors)."""
        return cp_reconstruct(list(self.factors))

    @property
    def weight(self) -> Tensor:
        """The dense weight the layer computes with: ``dense_weight`` if set, else ``[[A]]``."""
        return self.reconstruct() if self.dense_weight is None else self.dense_weight

    @property
    def num_factor_params(self) -> int:
        """``R * sum_n I_n`` (bias not included, as in the paper's counts)."""
        return cp_num_params(self.weight_shape, self.rank)

    @property
    def compression(self) -> float:
        """Dense over factor parameters of the weight, eqs. (23)-(24)."""
        return compression_ratio(self.weight_shape, self.rank)


class CPLinear(CPLayer):
    """Fully connected layer with a rank-``R`` weight ``W = A^(1) A^(2)T`` (Sec. IV-B1, eqs. 5-6).

    Forward in factored order, ``y = A^(1) (A^(2)T x) + b`` (cost ``R (I_in + I_out)`` per sample).

    Args:
        in_features: ``I_in``.
        out_features: ``I_out``.
        rank: CP rank ``R`` (Table I; see :func:`~fl_lightning.functional.cp.rank_for`).
        bias: Keep a dense bias ``b`` (the paper's counts leave biases out).
    """

    def __init__(self, in_features: int, out_features: int, rank: int, bias: bool = True) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self._init_cp((out_features, in_features), rank, bias)
        self.reset_parameters()

    def forward(self, x: Tensor) -> Tensor:
        if self.dense_weight is not None:
            return F.linear(x, self.dense_weight, self.bias)
        a1, a2 = self.factors
        return F.linear(F.linear(x, a2.T), a1, self.bias)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, rank={self.rank}, bias={self.bias is not None}"


class CPConv2d(CPLayer):
    """2-D convolution with a rank-``R`` CP kernel (Sec. IV-B2, eqs. 7-12).

    The factored forward is four convolutions in series, equal to ``conv2d`` with the reconstructed
    kernel (eqs. 9-12), padding, stride and dilation of each spatial axis going to its depthwise stage:

    1. 1x1 conv ``C_in -> R`` with ``A^(3)T`` (eq. 9);
    2. depthwise ``1 x kW`` conv along the width with the columns of ``A^(2)`` (eq. 10);
    3. depthwise ``kH x 1`` conv along the height with the columns of ``A^(1)`` (eq. 11);
    4. 1x1 conv ``R -> C_out`` with ``A^(4)``, plus the bias (eq. 12).

    Args:
        in_channels: ``I_S``.
        out_channels: ``I_T``.
        kernel_size: ``I_d`` (or ``(kH, kW)``).
        rank: CP rank ``R``.
        stride, padding, dilation: As for ``nn.Conv2d`` (integers or pairs; zero padding).
        bias: Keep a dense bias.
        forward_mode: ``"factored"`` (the four stages, the paper's form) or ``"reconstruct"`` (one
            conv with ``[[A]]``; faster when ``R`` exceeds the channel counts). Same output.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        rank: int,
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] = 0,
        dilation: int | tuple[int, int] = 1,
        bias: bool = True,
        forward_mode: Literal["factored", "reconstruct"] = "factored",
    ) -> None:
        super().__init__()
        if forward_mode not in ("factored", "reconstruct"):
            raise ConfigError(f"forward_mode={forward_mode!r} must be 'factored' or 'reconstruct'")
        kh, kw = _pair(kernel_size)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = (kh, kw)
        self.stride = _pair(stride)
        self.padding = _pair(padding)
        self.dilation = _pair(dilation)
        self.forward_mode = forward_mode
        self._init_cp((out_channels, in_channels, kh, kw), rank, bias)
        self.reset_parameters()

    def forward(self, x: Tensor) -> Tensor:
        if self.dense_weight is not None or self.forward_mode == "reconstruct":
            return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation)
        a4, a3, a1, a2 = self.factors
        (sh, sw), (ph, pw), (dh, dw) = self.stride, self.padding, self.dilation
        h = F.conv2d(x, a3.T[:, :, None, None])
        h = F.conv2d(
            h, a2.T[:, None, None, :], stride=(1, sw), padding=(0, pw), dilation=(1, dw), groups=self.rank
        )
        h = F.conv2d(
            h, a1.T[:, None, :, None], stride=(sh, 1), padding=(ph, 0), dilation=(dh, 1), groups=self.rank
        )
        return F.conv2d(h, a4[:, :, None, None], self.bias)

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, rank={self.rank}, "
            f"stride={self.stride}, padding={self.padding}, forward_mode={self.forward_mode}"
        )


# ------------------------------------------------------------------------------ the transform
def cp_from_dense(
    layer: nn.Linear | nn.Conv2d, rank: int, init: Init = "random", sweeps: int = 25
) -> CPLinear | CPConv2d:
    """A CP layer replacing ``layer``: same shape, bias copied, factors from ``init``.

    ``"random"``: i.i.d. Gaussian factors whose reconstruction has the mean square of ``layer.weight``
    (so a model's own initialisation scale carries over); ``"als"``: the rank-``R`` CP fit of
    ``layer.weight`` by ``sweeps`` ALS sweeps from that random start.
    """
    bias = layer.bias is not None
    if isinstance(layer, nn.Linear):
        cp: CPLinear | CPConv2d = CPLinear(layer.in_features, layer.out_features, rank, bias=bias)
    else:
        cp = CPConv2d(
            layer.in_channels,
            layer.out_channels,
            layer.kernel_size,
            rank,
            stride=layer.stride,
            padding=layer.padding,
            dilation=layer.dilation,
            bias=bias,
        )
    weight = layer.weight.detach()
    factors = cp_random_factors(cp.weight_shape, rank, float(weight.pow(2).mean()))
    if init == "als":
        factors = cp_als(weight, factors, sweeps)
    cp.set_factors(factors)
    if bias:
        with torch.no_grad():
            cp.bias.copy_(layer.bias)
    return cp.to(weight.device, weight.dtype)


def _factorable(layer: nn.Module) -> bool:
    if isinstance(layer, nn.Linear):
        return True
    return (
        isinstance(layer, nn.Conv2d)
        and layer.groups == 1
        and layer.padding_mode == "zeros"
        and not isinstance(layer.padding, str)
    )


def tensorize(
    module: nn.Module,
    ratio: float | None = None,
    ranks: dict[str, int] | None = None,
    init: Init = "random",
    field: str = "net.init_args",
) -> nn.Module:
    """Replace ``nn.Linear``/``nn.Conv2d`` layers of ``module`` by CP layers, in place; returns ``module``.

    A layer named in ``ranks`` (its name in ``module.named_modules()``, e.g. ``"fc1"`` or
    ``"features.0"``) gets that rank; with ``ratio`` every other linear and (ungrouped, zero-padded)
    conv layer gets ``rank_for(dims, ratio)`` (the Table I rule); without ``ratio`` only the named
    layers are factored.

    Args:
        module: The network to factor.
        ratio: Target compression ratio per layer (the paper: 1.5 or 2), or None.
        ranks: Per-layer ranks (override ``ratio`` for the layers they name).
        init: How factors start (:func:`cp_from_dense`).
        field: The config path of these arguments, for error messages.
    """
    ranks = dict(ranks or {})
    if ratio is not None and ratio <= 0:
        raise ConfigError(f"{field}.ratio={ratio} must be > 0 (the paper uses 1.5 or 2.0), or null")
    if init not in ("random", "als"):
        raise ConfigError(f"{field}.init={init!r} must be 'random' or 'als'")
    layers = {name: m for name, m in module.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d)) and name}
    unknown = sorted(set(ranks) - set(layers))
    if unknown:
        raise ConfigError(
            f"{field}.ranks names {unknown[0]!r}, which is not a Linear/Conv2d layer of the model; "
            f"layers: {', '.join(layers)}"
        )
    for name, layer in layers.items():
        rank = ranks.get(name)
        if rank is None and ratio is None:
            continue
        if not _factorable(layer):
            if rank is not None:
                raise ConfigError(
                    f"{field}.ranks[{name!r}]: grouped, string-padded or non-zero-padded convs cannot be "
                    "CP-factored; leave the layer out"
                )
            log.info("tensorize: %s left dense (grouped or non-zero padding)", name)
            continue
        dims = tuple(layer.weight.shape)
        if rank is None:
            rank = rank_for(dims, ratio)
        if rank < 1:
            raise ConfigError(f"{field}.ranks[{name!r}]={rank} must be >= 1")
        parent_name, _, child = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        setattr(parent, child, cp_from_dense(layer, rank, init))
    return module


@register_model("tensorized")
class Tensorized(nn.Module):
    """Any network with its linear and conv layers CP-factored (:func:`tensorize`).

    Args:
        net: The dense network.
        ratio: Target compression ratio per layer (the Table I rule), or None to use ``ranks`` only.
        ranks: Per-layer CP ranks by layer name in ``net`` (override ``ratio``).
        init: ``"random"`` (variance-matched Gaussian factors) or ``"als"`` (CP fit of the dense init).
    """

    def __init__(
        self,
        net: nn.Module,
        ratio: float | None = 2.0,
        ranks: dict[str, int] | None = None,
        init: Init = "random",
    ) -> None:
        super().__init__()
        self.net = tensorize(net, ratio, ranks, init, field="net.init_args")

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


# ------------------------------------------------------------------------------ dense views
def cp_layers(module: nn.Module) -> dict[str, CPLayer]:
    """The CP layers of ``module`` by name."""
    return {name: m for name, m in module.named_modules() if isinstance(m, CPLayer)}


def factor_names(module: nn.Module) -> set[str]:
    """Names of the factor parameters of every CP layer (``<layer>.factors.<n>``)."""
    return {
        f"{name}.factors.{i}" if name else f"factors.{i}"
        for name, layer in cp_layers(module).items()
        for i in range(len(layer.factors))
    }


class DenseView:
    """The model as a dense network: ``<cp layer>.dense_weight -> [[A]]`` and every other parameter as is.

    Calling the view returns a dict whose keys are names :func:`torch.func.functional_call` accepts on
    ``module``, so a dict of tensors with these keys is a dense model of the same architecture
    (TDPFed's ``theta``). The values keep their graph to the factors and parameters (differentiable).
    Frozen parameters are left out. The layer walk is done once, at construction.
    """

    def __init__(self, module: nn.Module) -> None:
        self.layers = {f"{name}.{DENSE}" if name else DENSE: m for name, m in cp_layers(module).items()}
        skip = factor_names(module)
        self.params = {n: p for n, p in module.named_parameters() if p.requires_grad and n not in skip}

    def __call__(self) -> dict[str, Tensor]:
        out = {key: layer.reconstruct() for key, layer in self.layers.items()}
        out.update(self.params)
        return out


def dense_weights(module: nn.Module) -> dict[str, Tensor]:
    """``DenseView(module)()``: the model's dense weights by functional_call name (see :class:`DenseView`)."""
    return DenseView(module)()


@torch.no_grad()
def set_dense_weights(module: nn.Module, weights: dict[str, Tensor]) -> None:
    """Load a dense model (keys of :func:`dense_weights`) into ``module``: CP layers get ``dense_weight``."""
    params = dict(module.named_parameters())
    for name, value in weights.items():
        prefix, _, leaf = name.rpartition(".")
        if leaf == DENSE:
            layer = module.get_submodule(prefix)
            layer.dense_weight = value.detach().clone()
        else:
            params[name].copy_(value)


def clear_dense_weights(module: nn.Module) -> None:
    """Back to the factored model: empty every CP layer's ``dense_weight`` slot."""
    for layer in cp_layers(module).values():
        layer.dense_weight = None
