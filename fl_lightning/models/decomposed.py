"""Decomposed convolutions: filters as atom coefficients times filter atoms, for any model.

Chen & Qiu, "Extra Clients at No Extra Cost: Overcome Data Heterogeneity in Federated Learning with
Filter Decomposition" (ICML 2025), Sec. 4. Every conv with a kernel larger than 1×1 becomes a
:class:`DecomposedConv2d` with two parameters, ``<layer>.coefficients`` (``alpha``) and
``<layer>.atoms`` (``D``); 1×1 convs and linear layers stay dense, as in the paper. Because the two
factors are separate parameters, every strategy averages them separately and the global filter is the
product of the averaged factors (with its cross terms), never an average of reconstructed filters.

In a YAML config decomposition is one wrapper around any network::

    net:
      class_path: fl_lightning.models.Decomposed
      init_args:
        net: {class_path: fl_lightning.models.LeNet}
        num_atoms: 9
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules.utils import _pair

from fl_lightning.errors import ConfigError
from fl_lightning.functional.decomposition import (
    atom_conv2d,
    conv_from_decomposed,
    orthonormal_atoms,
    reconstruct_filters,
    svd_atoms,
)
from fl_lightning.models.registry import register_model

Mode = Literal["reconstruct", "two_stage"]
Init = Literal["svd", "random"]


class DecomposedConv2d(nn.Module):
    """A 2-D convolution whose filters are ``W[o, i] = sum_q alpha[o, i, q] * D[q]`` (Sec. 4).

    Parameters: ``coefficients`` ``[c_out, c_in/groups, m_a]``, ``atoms`` ``[m_a, kh, kw]`` (one set of
    atoms per layer) and ``bias`` ``[c_out]``. Arguments after ``num_atoms`` mean what they mean for
    :class:`torch.nn.Conv2d`.

    Args:
        in_channels: Input channels ``c_in``.
        out_channels: Output channels ``c_out``.
        kernel_size: Filter size ``k`` (or ``(kh, kw)``).
        num_atoms: Filter atoms ``m_a`` per layer (the paper uses 9).
        stride, padding, dilation, groups, bias, padding_mode: As in ``nn.Conv2d``.
        mode: ``"reconstruct"``: build ``W = alpha x D`` and run one conv (cheap, default);
            ``"two_stage"``: conv with every atom, then a 1×1 coefficient conv (App. B). Same output.
        init: ``"random"``: random orthonormal atoms and coefficients such that the reconstructed
            filters have the scale of ``nn.Conv2d``'s default init; ``"svd"``: the best rank-``m_a``
            factorisation of a default-initialised dense filter bank.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        num_atoms: int = 9,
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] | str = 0,
        dilation: int | tuple[int, int] = 1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: Literal["zeros", "reflect", "replicate", "circular"] = "zeros",
        mode: Mode = "reconstruct",
        init: Init = "random",
    ) -> None:
        super().__init__()
        if num_atoms < 1:
            raise ConfigError(f"num_atoms={num_atoms} must be >= 1 (the paper uses 9)")
        if mode not in ("reconstruct", "two_stage"):
            raise ConfigError(f"mode={mode!r} must be 'reconstruct' or 'two_stage'")
        if in_channels % groups or out_channels % groups:
            raise ValueError(
                f"in_channels={in_channels} and out_channels={out_channels} must be divisible by groups"
            )
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = _pair(kernel_size)
        self.num_atoms = num_atoms
        self.stride = _pair(stride)
        self.padding = padding if isinstance(padding, str) else _pair(padding)
        self.dilation = _pair(dilation)
        self.groups = groups
        self.padding_mode = padding_mode
        self.mode = mode
        self.coefficients = nn.Parameter(torch.empty(out_channels, in_channels // groups, num_atoms))
        self.atoms = nn.Parameter(torch.empty(num_atoms, *self.kernel_size))
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        self.reset_parameters(init)

    # ------------------------------------------------------------------------------- init
    @torch.no_grad()
    def reset_parameters(self, init: Init = "random") -> None:
        """Initialise from a dense filter bank drawn like ``nn.Conv2d``'s default (kaiming-uniform).

        ``"random"``: orthonormal random atoms ``D`` and ``alpha = W_flat D^T``, rescaled by
        ``sqrt(k*k/m_a)`` when ``m_a < k*k`` so the reconstructed filters keep the dense init's
        variance; ``"svd"``: :func:`~fl_lightning.functional.decomposition.svd_atoms` of that bank.
        """
        dense = torch.empty(self.out_channels, self.in_channels // self.groups, *self.kernel_size)
        nn.init.kaiming_uniform_(dense, a=math.sqrt(5))
        if init == "svd":
            coefficients, atoms = svd_atoms(dense, self.num_atoms)
        elif init == "random":
            atoms = orthonormal_atoms(self.num_atoms, self.kernel_size)
            coefficients = dense.flatten(2) @ atoms.flatten(1).T
            size = self.kernel_size[0] * self.kernel_size[1]
            coefficients *= math.sqrt(max(1.0, size / self.num_atoms))
        else:
            raise ConfigError(f"init={init!r} must be 'random' or 'svd'")
        self.coefficients.copy_(coefficients)
        self.atoms.copy_(atoms)
        if self.bias is not None:
            fan_in = dense[0].numel()
            bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
            nn.init.uniform_(self.bias, -bound, bound)

    @classmethod
    def from_conv(cls, conv: nn.Conv2d, num_atoms: int = 9, mode: Mode = "reconstruct") -> DecomposedConv2d:
        """A decomposed copy of ``conv``: its filters factored by SVD (exact when ``m_a >= k*k``).

        For ``m_a < k*k`` the filters are the best rank-``m_a`` approximation of ``conv.weight``
        (:func:`~fl_lightning.functional.decomposition.svd_atoms`); the bias and every conv setting are
        copied.
        """
        layer = cls(
            conv.in_channels,
            conv.out_channels,
            conv.kernel_size,  # type: ignore[arg-type]
            num_atoms,
            stride=conv.stride,  # type: ignore[arg-type]
            padding=conv.padding,  # type: ignore[arg-type]
            dilation=conv.dilation,  # type: ignore[arg-type]
            groups=conv.groups,
            bias=conv.bias is not None,
            padding_mode=conv.padding_mode,  # type: ignore[arg-type]
            mode=mode,
        ).to(device=conv.weight.device, dtype=conv.weight.dtype)
        coefficients, atoms = svd_atoms(conv.weight, num_atoms)
        with torch.no_grad():
            layer.coefficients.copy_(coefficients)
            layer.atoms.copy_(atoms)
            if conv.bias is not None:
                layer.bias.copy_(conv.bias)
        return layer

    # ------------------------------------------------------------------------------- forward
    @property
    def weight(self) -> Tensor:
        """The reconstructed filters ``alpha x D`` (differentiable; not a parameter)."""
        return reconstruct_filters(self.coefficients, self.atoms)

    def forward(self, x: Tensor) -> Tensor:
        padding: Any = self.padding
        if self.padding_mode != "zeros":
            x = F.pad(
                x, _reversed_padding(self.padding, self.kernel_size, self.dilation), mode=self.padding_mode
            )
            padding = 0
        fn = conv_from_decomposed if self.mode == "reconstruct" else atom_conv2d
        return fn(
            x, self.coefficients, self.atoms, self.bias, self.stride, padding, self.dilation, self.groups
        )

    def extra_repr(self) -> str:
        s = (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"num_atoms={self.num_atoms}, stride={self.stride}"
        )
        if self.padding != (0, 0):
            s += f", padding={self.padding}"
        if self.dilation != (1, 1):
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += f", padding_mode={self.padding_mode}"
        return s + f", mode={self.mode}"


def _reversed_padding(
    padding: tuple[int, int] | str, kernel_size: tuple[int, int], dilation: tuple[int, int]
) -> list[int]:
    """``F.pad`` amounts for a non-zero padding mode, as ``nn.Conv2d`` computes them."""
    if isinstance(padding, str):
        if padding == "valid":
            return [0, 0, 0, 0]
        out: list[int] = []
        for d, k in zip(reversed(dilation), reversed(kernel_size)):
            total = d * (k - 1)
            out += [total // 2, total - total // 2]
        return out
    return [p for p in reversed(padding) for _ in range(2)]


def decompose(
    model: nn.Module, num_atoms: int = 9, mode: Mode = "reconstruct", init: Init = "svd"
) -> nn.Module:
    """Replace every ``nn.Conv2d`` with a kernel larger than 1×1 by a :class:`DecomposedConv2d`, in place.

    1×1 convs, linear layers and everything else stay as they are (the paper decomposes the conv
    filters of the feature extractor only).

    Args:
        model: Any network.
        num_atoms: ``m_a`` atoms per decomposed layer.
        mode: Forward mode of the decomposed layers.
        init: ``"svd"``: factor each conv's current filters (exact for ``m_a >= k*k``,
            the best rank-``m_a`` approximation otherwise: pre-trained weights are kept);
            ``"random"``: fresh random init at the dense init's scale.

    Returns:
        ``model`` (for chaining). A bare ``nn.Conv2d`` passed in is returned decomposed.
    """
    if init not in ("svd", "random"):
        raise ConfigError(f"model.client.init_args.net.init_args.init={init!r} must be 'svd' or 'random'")

    def convert(conv: nn.Conv2d) -> DecomposedConv2d:
        layer = DecomposedConv2d.from_conv(conv, num_atoms, mode)
        if init == "random":
            layer.reset_parameters("random")
        return layer

    if _decomposable(model):
        return convert(model)  # type: ignore[arg-type]
    for name, child in list(model.named_children()):
        if _decomposable(child):
            setattr(model, name, convert(child))  # type: ignore[arg-type]
        else:
            decompose(child, num_atoms, mode, init)
    return model


def _decomposable(module: nn.Module) -> bool:
    return type(module) is nn.Conv2d and module.kernel_size != (1, 1)


def decomposed_layers(model: nn.Module) -> dict[str, DecomposedConv2d]:
    """The model's decomposed convs by module name."""
    return {n: m for n, m in model.named_modules() if isinstance(m, DecomposedConv2d)}


def atom_names(model: nn.Module) -> list[str]:
    """State names of every decomposed layer's ``atoms`` (``D``)."""
    return [f"{n}.atoms" if n else "atoms" for n in decomposed_layers(model)]


def coefficient_names(model: nn.Module) -> list[str]:
    """State names of every decomposed layer's ``coefficients`` (``alpha``)."""
    return [f"{n}.coefficients" if n else "coefficients" for n in decomposed_layers(model)]


@register_model("decomposed")
class Decomposed(nn.Module):
    """Any network with its k>1 convs decomposed into filter atoms and atom coefficients.

    The one-line YAML switch of filter decomposition: wrap ``net`` and every strategy then exchanges
    ``...coefficients`` and ``...atoms`` instead of dense filters (Algorithm 1 of the paper under
    FedAvg; the same parameterisation under FedProx, SCAFFOLD, FedDyn, FedDC, ...).

    Args:
        net: The network to decompose (built first with its own init, then converted).
        num_atoms: Filter atoms ``m_a`` per layer (the paper: 9; ablation 3, 6, 9, 12).
        init: ``"svd"``: factor ``net``'s own filters (keeps a pre-trained or initialised net's
            function when ``m_a >= k*k``); ``"random"``: fresh random factors at the dense init's scale.
        mode: ``"reconstruct"`` (default) or ``"two_stage"`` forward (same output).
    """

    def __init__(
        self, net: nn.Module, num_atoms: int = 9, init: Init = "svd", mode: Mode = "reconstruct"
    ) -> None:
        super().__init__()
        if num_atoms < 1:
            raise ConfigError(
                f"model.client.init_args.net.init_args.num_atoms={num_atoms} must be >= 1 (paper: 9)"
            )
        self.num_atoms = num_atoms
        self.net = decompose(net, num_atoms, mode, init)
        if not decomposed_layers(self.net):
            raise ConfigError(
                f"model.client.init_args.net: {type(net).__name__} has no nn.Conv2d with a kernel larger "
                "than 1x1 to decompose; wrap a convolutional network"
            )

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.net(*args, **kwargs)
