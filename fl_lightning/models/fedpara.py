"""FedPara (Hyeon-Woo, Ye-Bin & Oh, ICLR 2022): low-rank Hadamard-product layers.

A weight is the Hadamard (element-wise) product of two low-rank weights, ``W = W1 ⊙ W2``, which has rank
up to ``R^2`` with ``O(R)`` parameters per factor (Sec. 3, Prop. 1). Fully connected layers use the matrix
form (eq. 2), convolutions the tensor form with a core per factor (Prop. 3)::

    linear:  W = (X1 Y1^T) ⊙ (X2 Y2^T),                      X_i in R^{O x R}, Y_i in R^{I x R}
    conv:    W = (T1 x1 X1 x2 Y1) ⊙ (T2 x1 X2 x2 Y2),        T_i in R^{R x R x k1 x k2}

so a layer has ``2R(O + I)`` (linear) or ``2(R^2 k1 k2 + R(O + I))`` (conv) parameters instead of
``O I k1 k2`` (:func:`fedpara_num_params`). The rank follows the paper's ratio ``gamma`` (Sec. 4,
:func:`fedpara_rank`): ``R = ceil((1 - gamma) r_min + gamma r_max)`` between the smallest rank that can
reach full rank, ``r_min = min(ceil(sqrt(O)), ceil(sqrt(I)))`` (``R^2 >= min(O, I)``), and the largest
whose parameters stay at most those of the dense layer, ``r_max``. Every strategy then communicates the
factors (FedAvg averages them separately), which is the paper's communication saving.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fl_lightning.errors import ConfigError
from fl_lightning.models.registry import register_model


def fedpara_num_params(out_features: int, in_features: int, kernel: tuple[int, int] | None, rank: int) -> int:
    """Weight parameters of a FedPara layer (no bias): ``2R(O+I)`` linear, ``2(R^2 k1 k2 + R(O+I))`` conv.

    Args:
        out_features: ``O`` (output features or channels).
        in_features: ``I`` (input features or channels).
        kernel: ``(k1, k2)`` for a convolution, None for a linear layer.
        rank: ``R``.
    """
    core = 0 if kernel is None else rank * rank * kernel[0] * kernel[1]
    return 2 * (core + rank * (out_features + in_features))


def fedpara_rank(out_features: int, in_features: int, kernel: tuple[int, int] | None, gamma: float) -> int:
    """The paper's rank for ratio ``gamma``: ``ceil((1 - gamma) r_min + gamma r_max)`` (Sec. 4).

    ``r_min = min(ceil(sqrt(O)), ceil(sqrt(I)))``; ``r_max`` is the largest ``R`` with
    :func:`fedpara_num_params` at most ``O I k1 k2`` (the positive root of ``2(k1 k2 R^2 + (O+I) R) =
    O I k1 k2``, floored; for a linear layer ``floor(O I / (2 (O + I)))``), and at least ``r_min``.
    """
    k = 1 if kernel is None else kernel[0] * kernel[1]
    r_min = min(math.ceil(math.sqrt(out_features)), math.ceil(math.sqrt(in_features)))
    dense, b = out_features * in_features * k, out_features + in_features
    if kernel is None:
        r_max = dense // (2 * b)
    else:
        r_max = math.floor((-b + math.sqrt(b * b + 2 * k * dense)) / (2 * k))
    r_max = max(r_max, r_min)
    return max(1, math.ceil((1 - gamma) * r_min + gamma * r_max))


def _factor_std(dense_var: float, rank: int, terms: int) -> float:
    """Std of i.i.d. zero-mean factors so that ``W = W1 ⊙ W2`` has variance ``dense_var``.

    Each ``W_i`` entry is a sum of ``rank**(terms - 1)`` products of ``terms`` factors, so
    ``Var(W_i) = rank**(terms-1) s**(2 terms)`` and ``Var(W) = Var(W_i)**2``.
    """
    return (math.sqrt(dense_var) / rank ** (terms - 1)) ** (1 / (2 * terms))


class HadamardLinear(nn.Module):
    """``y = x W^T + b`` with ``W = (X1 Y1^T) ⊙ (X2 Y2^T)`` (FedPara, eq. 2).

    Args:
        in_features: ``I``.
        out_features: ``O``.
        rank: ``R`` of each factor.
        bias: Whether the layer has a (dense) bias.
    """

    def __init__(self, in_features: int, out_features: int, rank: int, bias: bool = True) -> None:
        super().__init__()
        self.in_features, self.out_features, self.rank = in_features, out_features, rank
        std = _factor_std(1 / (3 * in_features), rank, 2)  # nn.Linear's default weight variance
        self.x1, self.x2 = (nn.Parameter(torch.randn(out_features, rank) * std) for _ in range(2))
        self.y1, self.y2 = (nn.Parameter(torch.randn(in_features, rank) * std) for _ in range(2))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    def weight(self) -> Tensor:
        """The reconstructed ``[O, I]`` weight."""
        return (self.x1 @ self.y1.T) * (self.x2 @ self.y2.T)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight(), self.bias)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, rank={self.rank}, bias={self.bias is not None}"


class HadamardConv2d(nn.Module):
    """A convolution with ``W = (T1 x1 X1 x2 Y1) ⊙ (T2 x1 X2 x2 Y2)`` (FedPara, Prop. 3).

    ``W_i[o, c, h, w] = sum_{a, b} T_i[a, b, h, w] X_i[o, a] Y_i[c, b]``; stride, padding and dilation as
    in the dense layer it replaces (``groups = 1``, zero padding).
    """

    def __init__(self, conv: nn.Conv2d, rank: int) -> None:
        super().__init__()
        out_c, in_c, kh, kw = conv.weight.shape
        self.rank = rank
        self.stride, self.padding, self.dilation = conv.stride, conv.padding, conv.dilation
        std = _factor_std(1 / (3 * in_c * kh * kw), rank, 3)  # nn.Conv2d's default weight variance
        self.t1, self.t2 = (nn.Parameter(torch.randn(rank, rank, kh, kw) * std) for _ in range(2))
        self.x1, self.x2 = (nn.Parameter(torch.randn(out_c, rank) * std) for _ in range(2))
        self.y1, self.y2 = (nn.Parameter(torch.randn(in_c, rank) * std) for _ in range(2))
        self.bias = None if conv.bias is None else nn.Parameter(torch.zeros(out_c))

    def weight(self) -> Tensor:
        """The reconstructed ``[O, I, k1, k2]`` weight."""
        w1 = torch.einsum("abhw,oa,cb->ochw", self.t1, self.x1, self.y1)
        w2 = torch.einsum("abhw,oa,cb->ochw", self.t2, self.x2, self.y2)
        return w1 * w2

    def forward(self, x: Tensor) -> Tensor:
        return F.conv2d(x, self.weight(), self.bias, self.stride, self.padding, self.dilation)

    def extra_repr(self) -> str:
        return f"rank={self.rank}, stride={self.stride}, padding={self.padding}"


def fedparametrize(model: nn.Module, gamma: float = 0.1, linear: bool = True) -> nn.Module:
    """Replace every ``nn.Conv2d`` (``groups = 1``, zero padding) and, with ``linear``, every ``nn.Linear``
    by its FedPara layer of rank :func:`fedpara_rank` (in place; returns ``model``)."""
    for name, child in list(model.named_children()):
        if isinstance(child, nn.Conv2d) and child.groups == 1 and child.padding_mode == "zeros":
            out_c, in_c, kh, kw = child.weight.shape
            rank = fedpara_rank(out_c, in_c, (kh, kw), gamma)
            setattr(model, name, HadamardConv2d(child, rank))
        elif isinstance(child, nn.Linear) and linear:
            rank = fedpara_rank(child.out_features, child.in_features, None, gamma)
            setattr(
                model,
                name,
                HadamardLinear(child.in_features, child.out_features, rank, child.bias is not None),
            )
        else:
            fedparametrize(child, gamma, linear)
    return model


@register_model("fedpara")
class FedPara(nn.Module):
    """Any network with its layers re-parameterised by FedPara's low-rank Hadamard products.

    The communication baseline of Chen & Qiu (ICML 2025, Sec. 6.4): wrap ``net`` (as for
    :class:`~fl_lightning.models.Decomposed`) and every strategy exchanges the factors
    ``x1, y1, x2, y2`` (and ``t1, t2`` of convs) instead of dense weights. Factors start at random such
    that each reconstructed weight has the variance of the dense layer's default init; biases at zero.

    Args:
        net: The network to re-parameterise.
        gamma: The paper's rank ratio in [0, 1] between ``r_min`` and ``r_max`` (paper: 0.1 to 0.9).
        linear: Also re-parameterise ``nn.Linear`` layers (False: convolutions only).
    """

    def __init__(self, net: nn.Module, gamma: float = 0.1, linear: bool = True) -> None:
        super().__init__()
        if not 0.0 <= gamma <= 1.0:
            raise ConfigError(
                f"model.client.init_args.net.init_args.gamma={gamma} must be in [0, 1] (paper: 0.1)"
            )
        self.gamma = gamma
        self.net = fedparametrize(net, gamma, linear)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.net(*args, **kwargs)
