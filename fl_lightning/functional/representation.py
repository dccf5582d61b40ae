"""Representation-level helpers for local terms: a model's features, frozen forwards, previous models.

Representation-based methods need the *representation* ``z = h(x)`` of a batch under up to three
models (the local model being trained, the global model, the client's previous local model):

* MOON (Li, He & Song, CVPR 2021) contrasts ``z`` with the global and the previous representation;
* FedDecorr (Shi et al., ICLR 2023) penalises the correlation matrix of ``z`` over a batch;
* FedCOG (Ye et al., ICLR 2024) runs the global and the previous local model on generated inputs.

**Which representation.** Networks here return logits only. The representation of a network is the
input of its **last** ``nn.Linear`` layer, i.e. the penultimate features (84-d for the MOON/FedCOG CNNs,
``hidden``-d for :class:`~fl_lightning.models.SmallCNN`, 512-d for ResNet-18). It is read with a forward
hook, so any network works without a ``features()`` method and the local model needs no second
forward pass: :class:`FeatureTap` records the features of every forward, and a strategy reads the
features of the very forward whose logits it was given. MOON's original networks end with a projection
head whose output is contrasted; the FedCOG paper's CNNs (whose parameter counts it states) have none,
so the penultimate layer is the representation here.

**Frozen models** (global, previous) are run with :func:`torch.func.functional_call` on the *same*
module with another set of tensors, in eval mode (BatchNorm uses running statistics and updates
nothing) and restored to its previous mode afterwards: no model copy is built per client.

**Previous local model.** The client's final local model of the round in which it last trained is kept
in its state as ``previous/<name>`` entries (:func:`save_previous_model`), which the state store keeps
off the accelerator and checkpoints. MOON and FedCOG use the same entries, so FedCOG on top of MOON
stores one copy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from fl_lightning.errors import ConfigError

PREVIOUS = "previous/"


# ------------------------------------------------------------------------------------------ features
def last_linear(module: nn.Module) -> nn.Linear:
    """The last ``nn.Linear`` of ``module`` in registration order (its classifier layer).

    Raises:
        ValueError: If the module has no linear layer.
    """
    layer = None
    for m in module.modules():
        if isinstance(m, nn.Linear):
            layer = m
    if layer is None:
        raise ValueError(
            f"{type(module).__name__} has no nn.Linear layer; representation-based strategies read the "
            "input of the last linear layer as the representation"
        )
    return layer


def linear_layer_names(module: nn.Module) -> list[str]:
    """Module names of every ``nn.Linear`` of ``module`` in registration order (last: the classifier)."""
    return [name for name, m in module.named_modules() if isinstance(m, nn.Linear)]


def head_names(module: nn.Module, head: int | Sequence[str] = 1, field: str = "head") -> set[str]:
    """State entries of a network's **head**; the rest is its body (representation ``h``).

    Head/body splits of personalised FL (FedPer, FedRep, LG-FedAvg): the head is the classifier on top
    of the representation defined above. ``head`` is either a count ``n >= 1``, the last ``n``
    ``nn.Linear`` layers (1: the classifier; FedRep's code, CIFAR CNN: ``fc3``), or module names (or
    prefixes of state entry names) such as ``["net.classifier"]``.

    Args:
        module: The model (the names are those of its ``state_dict()``).
        head: Count of last linear layers, or module names.
        field: The config field named in errors (``model.strategy.<field>``).

    Returns:
        Names of the floating-point state entries (parameters and float buffers) in the head.

    Raises:
        ConfigError: If the count exceeds the model's linear layers or a name matches no entry.
    """
    linear = linear_layer_names(module)
    if isinstance(head, int):
        if not 1 <= head <= len(linear):
            raise ConfigError(
                f"model.strategy.{field}={head} must count 1..{len(linear)} last nn.Linear "
                f"layers of {type(module).__name__} ({', '.join(linear) or 'none'}), or list module names"
            )
        prefixes = linear[len(linear) - head :]
    else:
        prefixes = list(head)
    names = {n for n, t in module.state_dict().items() if t.is_floating_point()}
    chosen: set[str] = set()
    for prefix in prefixes:
        match = {n for n in names if n == prefix or n.startswith(prefix + ".")}
        if not match:
            raise ConfigError(
                f"model.strategy.{field}: {prefix!r} names no entry of the model; use module "
                f"names such as {', '.join(linear) or sorted(names)[:3]} or a count of last linear layers"
            )
        chosen |= match
    return chosen


class FeatureTap:
    """Records the input (features) and output of a module's last linear layer at every forward.

    :meth:`features_for` returns the features of the forward that produced ``outputs`` when that
    forward was the most recent one through the layer (``outputs`` is the layer's own output tensor),
    so a strategy's ``local_loss`` gets the representation of the training forward for free. The tap
    lives in ``scratch[key]`` (a client's per-round scratch space); it is removed by :meth:`remove`, and a
    tap that is no longer there (the loop empties the scratch space when a client's work ends, also
    when it raised) removes itself at its next call.

    Args:
        module: The client module.
        scratch: Where the tap is kept while it is live (``ctx.scratch``).
        key: Its key in ``scratch``.
        layer: The layer whose input is recorded (default: the module's last ``nn.Linear``; FedPAC taps
            the first layer of a multi-layer head).
    """

    def __init__(
        self, module: nn.Module, scratch: dict[str, Any], key: str, layer: nn.Module | None = None
    ) -> None:
        self.features: Tensor | None = None
        self.output: Tensor | None = None
        self._scratch, self._key = scratch, key
        self._handle = (last_linear(module) if layer is None else layer).register_forward_hook(self._hook)
        scratch[key] = self

    def _hook(self, layer: nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> None:
        if self._scratch.get(self._key) is not self:
            self.remove()
            return
        self.features, self.output = inputs[0], output

    def features_for(self, outputs: Tensor) -> Tensor | None:
        """The features of the forward that returned ``outputs``, or None if not recorded."""
        return self.features if self.output is outputs else None

    def remove(self) -> None:
        """Remove the hook and drop the recorded tensors."""
        self._handle.remove()
        self.features = self.output = None

    @staticmethod
    def release(scratch: dict[str, Any], key: str) -> None:
        """Remove the tap kept in ``scratch[key]``, if any (a strategy's ``upload`` ends its tap)."""
        tap = scratch.pop(key, None)
        if tap is not None:
            tap.remove()


def features_of(
    module: nn.Module, x: Tensor, state: Mapping[str, Tensor] | None = None, layer: nn.Module | None = None
) -> tuple[Tensor, Tensor]:
    """Representation and logits of ``module`` on ``x``, optionally with the tensors ``state`` swapped in.

    Runs in the module's current train/eval mode and with autograd as the caller sets it.

    Returns:
        ``(features, logits)``: the input of ``layer`` (default: the last linear layer) and the
        module's output.
    """
    captured: list[Tensor] = []
    tapped = last_linear(module) if layer is None else layer
    handle = tapped.register_forward_hook(lambda _m, inp, _out: captured.append(inp[0]))
    try:
        logits = module(x) if state is None else functional_call(module, dict(state), (x,))
    finally:
        handle.remove()
    return captured[-1], logits


@contextlib.contextmanager
def frozen(module: nn.Module) -> Iterator[nn.Module]:
    """Put ``module`` in eval mode for the block and restore every submodule's previous mode after.

    Eval mode makes BatchNorm use (and never update) its running statistics and disables dropout, so
    forward passes inside the block change no buffer of the module.
    """
    modes = [m.training for m in module.modules()]
    module.eval()
    try:
        yield module
    finally:
        for m, mode in zip(module.modules(), modes):
            m.training = mode


def frozen_forward(module: nn.Module, state: Mapping[str, Tensor], x: Tensor) -> Tensor:
    """Logits of the model given by ``state`` (names of ``module.state_dict()``) on ``x``, in eval mode."""
    with frozen(module):
        return functional_call(module, dict(state), (x,))


# ---------------------------------------------------------------------------- previous local model
def save_previous_model(module: nn.Module, state: dict[str, Tensor]) -> None:
    """Store ``module``'s floating-point state as the client's previous local model (``previous/<name>``)."""
    for name, t in module.state_dict().items():
        if t.is_floating_point():
            state[PREVIOUS + name] = t.detach().clone()


def previous_model(state: Mapping[str, Tensor]) -> dict[str, Tensor] | None:
    """The client's previous local model stored by :func:`save_previous_model`, or None if it has none."""
    prev = {k[len(PREVIOUS) :]: v for k, v in state.items() if k.startswith(PREVIOUS)}
    return prev or None


# ------------------------------------------------------------------------------------------- losses
def model_contrastive_loss(z: Tensor, z_global: Tensor, z_previous: Tensor, temperature: float) -> Tensor:
    """MOON's model-contrastive loss (Li, He & Song, CVPR 2021, eq. 3), averaged over the batch.

    .. math:: \\ell_{con} = -\\log \\frac{e^{\\mathrm{sim}(z, z_{glob})/\\tau}}
              {e^{\\mathrm{sim}(z, z_{glob})/\\tau} + e^{\\mathrm{sim}(z, z_{prev})/\\tau}}

    with cosine similarity ``sim``: the global representation is the positive pair, the previous local
    one the negative pair. Equal ``z_global`` and ``z_previous`` give ``log 2`` whatever ``z``.

    Args:
        z: ``[N, d]`` representations under the model being trained.
        z_global: ``[N, d]`` representations under the global model (no gradient needed).
        z_previous: ``[N, d]`` representations under the client's previous local model.
        temperature: ``tau > 0``.
    """
    pos = F.cosine_similarity(z, z_global, dim=-1) / temperature
    neg = F.cosine_similarity(z, z_previous, dim=-1) / temperature
    logits = torch.stack([pos, neg], dim=1)
    return F.cross_entropy(logits, torch.zeros(z.shape[0], dtype=torch.long, device=z.device))


def decorrelation_loss(z: Tensor, eps: float = 1e-8) -> Tensor:
    """FedDecorr's regulariser (Shi et al., ICLR 2023, Sec. 4): ``||K||_F^2 / d^2``.

    ``K = Z^T Z / N`` is the correlation matrix of the batch representations ``z`` (``[N, d]``) after
    standardising every dimension, ``Z = (z - mean) / sqrt(var + eps)`` (population variance, so the
    diagonal of ``K`` is 1 up to ``eps``). Its diagonal is constant; the off-diagonal entries are the
    correlations the regulariser drives to zero against dimensional collapse. A batch of one sample has
    no correlation and gives 0.

    The official code uses ``mean_{i != j} (Z^T Z)_{ij}^2 / N`` with the unbiased variance, about
    ``N`` times this value for a batch of ``N``; its coefficients (0.1 there) correspond to ``N`` times
    larger ``beta`` here.
    """
    n, d = z.shape
    if n < 2:
        return z.sum() * 0.0
    zc = z - z.mean(dim=0, keepdim=True)
    zs = zc / torch.sqrt(zc.pow(2).mean(dim=0, keepdim=True) + eps)
    corr = zs.t() @ zs / n
    return corr.pow(2).sum() / (d * d)


__all__ = [
    "PREVIOUS",
    "FeatureTap",
    "decorrelation_loss",
    "features_of",
    "frozen",
    "frozen_forward",
    "head_names",
    "last_linear",
    "linear_layer_names",
    "model_contrastive_loss",
    "previous_model",
    "save_previous_model",
]
