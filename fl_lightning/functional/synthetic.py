"""Synthetic-data regularisers of FedCOG's Table 1 baselines: FedGen, FedReg and VHL, as plain math.

The three methods fight client drift with data that no client owns; the strategies
(:class:`~fl_lightning.strategies.FedGen`, :class:`~fl_lightning.strategies.FedReg`,
:class:`~fl_lightning.strategies.VHL`) hold the state and call these functions.

**FedGen** (Zhu, Hong & Zhou, ICML 2021, Sec. 3). A conditional generator ``G_w(z | y)`` maps noise
``eps`` and a label ``y`` to a *latent* ``z`` (the input of the network's classifier, the last linear
layer). The server learns ``w`` so that the clients' classifiers, as an ensemble, label ``z`` as ``y``
(eq. 4): ``min_w E_{y ~ p(y)} E_{z ~ G_w(.|y)} CE(ensemble(z), y)``. With linear classifiers
``h_k(z) = W_k z + b_k`` and the per-label weights ``a_k^y = n_k^y / sum_j n_j^y`` of the official code
(eq. 4 writes the plain mean ``1/K``), the ensemble's logits for label ``y`` are those of ONE averaged
classifier, ``W^y = sum_k a_k^y W_k``, ``b^y = sum_k a_k^y b_k`` (:func:`label_weighted_heads`), which
the server builds from sums, so the heads need no separate storage. Clients add
``CE(h(z), y)`` on generated latents to their loss (eq. 6).

**FedReg** (Xu, Hong, Huang & Jiang, ICLR 2022, Sec. 3). Pseudo data ``x_s`` are a few FGSM steps of
the real inputs *up* the global model's loss, ``x <- x + eta_s sign(grad_x CE(f(theta^t; x), y))``
(:func:`signed_gradient_steps`; adversarial examples of the global model, near or across its decision
boundaries), labelled by the global model's soft predictions; "perturbed" data use the same rule with a
step ``eta_p << eta_s`` and keep the hard labels. The local step is taken with the
gradient at the slow point ``gamma theta + (1 - gamma) theta^t``, and the update ``Delta = theta' -
theta^t`` is then corrected so that, to first order, it does not increase the loss on the pseudo
(then perturbed) data: ``theta <- theta' - w g``, ``w = max(0, <Delta, g> / ||g||^2)``
(:func:`projection_coefficient`).

**VHL** (Tang et al., CVPR 2022, Sec. 4). A virtual dataset, the same on every client and in every
round, is drawn from a fixed untrained generator fed with class-conditional noise
(:func:`virtual_dataset`); clients train on natural and virtual samples together and align each
natural sample's feature with the virtual features of its class by a supervised contrastive loss
(:func:`virtual_contrastive_loss`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

Forward = Callable[[Tensor], Tensor]


# --------------------------------------------------------------------------------------- FedGen
def label_weighted_heads(
    counts: Tensor, weight_sums: Tensor, bias_sums: Tensor, eps: float = 1e-12
) -> tuple[Tensor, Tensor]:
    """The FedGen ensemble's classifier per label from count-weighted sums over clients.

    Args:
        counts: ``[C]`` sum over clients of the label counts ``n_k^y`` (or any common multiple).
        weight_sums: ``[C, C, d]`` sum over clients of ``n_k^y W_k`` (label ``y`` first).
        bias_sums: ``[C, C]`` sum over clients of ``n_k^y b_k``.

    Returns:
        ``(W, b)`` of shapes ``[C, C, d]`` and ``[C, C]``: ``W[y] = sum_k a_k^y W_k`` with
        ``a_k^y = n_k^y / sum_j n_j^y`` (a label no client holds gets zeros).
    """
    denom = counts.clamp_min(eps)
    return weight_sums / denom[:, None, None], bias_sums / denom[:, None]


def ensemble_logits(z: Tensor, labels: Tensor, weights: Tensor, biases: Tensor) -> Tensor:
    """Logits of the label-weighted ensemble on latents ``z`` (``[N, d]``) generated for ``labels``.

    Sample ``i`` is scored by the averaged classifier of its own label: ``W[y_i] z_i + b[y_i]``.
    """
    return torch.einsum("ncd,nd->nc", weights[labels], z) + biases[labels]


def generator_input(noise: Tensor, labels: Tensor, num_classes: int) -> Tensor:
    """FedGen's generator input: ``[eps, one_hot(y)]``."""
    return torch.cat([noise, F.one_hot(labels, num_classes).to(noise.dtype)], dim=1)


def train_generator(
    generator: torch.nn.Module,
    weights: Tensor,
    biases: Tensor,
    prior: Tensor,
    noise_dim: int,
    steps: int,
    batch_size: int,
    lr: float,
    rng: torch.Generator,
) -> list[float]:
    """FedGen's server step (eq. 4): ``steps`` Adam steps on the generator's parameters only.

    Each step draws ``y ~ prior`` and ``eps ~ N(0, I)`` from ``rng`` (CPU), generates ``z = G(eps, y)``
    and minimises ``CE(ensemble_logits(z, y), y)``. The ensemble is fixed (no gradient flows to it).

    Returns:
        The loss before each step.
    """
    device = next(generator.parameters()).device
    num_classes = prior.numel()
    optimizer = torch.optim.Adam(generator.parameters(), lr=lr)
    losses = []
    was_training = generator.training
    generator.train()
    prior_cpu = prior.detach().float().cpu()
    for _ in range(steps):
        y = torch.multinomial(prior_cpu, batch_size, replacement=True, generator=rng).to(device)
        eps = torch.randn(batch_size, noise_dim, generator=rng).to(device)
        z = generator(generator_input(eps, y, num_classes))
        loss = F.cross_entropy(ensemble_logits(z, y, weights, biases), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    generator.train(was_training)
    return losses


# --------------------------------------------------------------------------------------- FedReg
def signed_gradient_steps(forward: Forward, x: Tensor, y: Tensor, eta: float, steps: int) -> Tensor:
    """``steps`` FGSM steps on the inputs: ``x <- clamp(x + eta sign(grad_x CE(forward(x), y)))``.

    FedReg's pseudo (``eta_s``) and perturbed (``eta_p``) data: the inputs move to *raise* the (global)
    model's loss on their labels (the official code's ``FSGM``: ``x += eta sign(grad)``), clamped to the
    value range of the real batch (the official code's clamp is not in place, so it clamps nothing). Only
    the inputs get gradients (``torch.autograd.grad``); nothing accumulates in any parameter's ``.grad``.
    """
    lo, hi = x.min().detach(), x.max().detach()
    out = x.detach()
    for _ in range(steps):
        xi = out.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(F.cross_entropy(forward(xi), y), [xi])
        out = torch.clamp(out + eta * grad.sign(), lo, hi).detach()
    return out


def soft_cross_entropy(logits: Tensor, target_probs: Tensor) -> Tensor:
    """``mean_i -sum_c q_ic log softmax(z_i)_c`` (FedReg's loss on pseudo data with soft labels)."""
    return -(target_probs * logits.log_softmax(dim=-1)).sum(dim=-1).mean()


def projection_coefficient(delta: Sequence[Tensor], grads: Sequence[Tensor], eps: float = 1e-30) -> Tensor:
    """``max(0, <delta, g> / ||g||^2)`` over whole parameter lists (one device scalar, no host sync).

    Subtracting ``w g`` from an update ``delta`` with ``<delta, g> > 0`` leaves ``<delta - w g, g> = 0``:
    the update no longer increases, to first order, the loss whose gradient is ``g``.
    """
    flat_g = torch.cat([g.reshape(-1) for g in grads])  # views; two copies and one dot, whatever the count
    dot = torch.dot(torch.cat([d.reshape(-1) for d in delta]).to(flat_g.dtype), flat_g)
    sq = torch.dot(flat_g, flat_g)
    return (dot / (sq + eps)).clamp_min(0.0)


# ------------------------------------------------------------------------------------------ VHL
def virtual_dataset(
    num_classes: int,
    per_class: int,
    input_shape: Sequence[int],
    seed: int,
    noise_dim: int = 64,
    std: float = 0.5,
) -> tuple[Tensor, Tensor]:
    """The VHL virtual dataset: ``per_class`` samples per class from a fixed, untrained generator.

    ``x = tanh(A (mu_c + std * eps))`` with one random linear map ``A`` (``prod(input_shape) x noise_dim``,
    entries ``N(0, 1/noise_dim)``) shared by all classes and a random mean ``mu_c ~ N(0, I)`` per class,
    everything drawn from a CPU generator seeded by ``seed``: the same tensors on every client, process
    and round. Labels are in blocks ``[0]*per_class + [1]*per_class + ...``.

    Returns:
        ``(x, y)``: ``[C * per_class, *input_shape]`` inputs and ``[C * per_class]`` labels.
    """
    rng = torch.Generator().manual_seed(int(seed))
    dim = 1
    for s in input_shape:
        dim *= int(s)
    a = torch.randn(dim, noise_dim, generator=rng) / noise_dim**0.5
    mu = torch.randn(num_classes, noise_dim, generator=rng)
    y = torch.arange(num_classes).repeat_interleave(per_class)
    noise = mu[y] + std * torch.randn(len(y), noise_dim, generator=rng)
    x = torch.tanh(noise @ a.t()).reshape(len(y), *input_shape)
    return x, y


def virtual_contrastive_loss(
    z: Tensor, y: Tensor, z_virtual: Tensor, y_virtual: Tensor, temperature: float = 0.07
) -> Tensor:
    """VHL's feature calibration: natural features pulled to the virtual features of their class.

    A supervised contrastive loss (Khosla et al., 2020) with natural anchors and virtual candidates,
    on L2-normalised features::

        l_i = -1/|P(i)| sum_{p in P(i)} log( exp(z_i . v_p / T) / sum_a exp(z_i . v_a / T) )

    ``P(i)``: the virtual samples of the anchor's label ``y_i``; ``a`` runs over all virtual samples of
    the batch. Anchors whose label has no virtual sample in the batch are left out; the loss is the
    mean over the others (0 when there are none).
    """
    zn = F.normalize(z, dim=-1)
    vn = F.normalize(z_virtual, dim=-1)
    logits = zn @ vn.t() / temperature
    log_prob = logits.log_softmax(dim=1)
    pos = (y[:, None] == y_virtual[None, :]).to(log_prob.dtype)
    count = pos.sum(dim=1)
    per_anchor = -(pos * log_prob).sum(dim=1) / count.clamp_min(1)
    has = (count > 0).to(log_prob.dtype)
    return (per_anchor * has).sum() / has.sum().clamp_min(1)


__all__ = [
    "ensemble_logits",
    "generator_input",
    "label_weighted_heads",
    "projection_coefficient",
    "signed_gradient_steps",
    "soft_cross_entropy",
    "train_generator",
    "virtual_contrastive_loss",
    "virtual_dataset",
]
