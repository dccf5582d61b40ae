"""Consensus-oriented generation and distillation (FedCOG; Ye et al., ICLR 2024): the plain math.

FedCOG's client step (paper Sec. 4, Algorithm 1) has two parts, both here as functions with no state;
:class:`fl_lightning.strategies.FedCOG` calls them.

**Complementary data generation** (Sec. 4.1, eqs. 1-2). ``N`` learnable inputs ``x`` start from
``N(0, 1)`` in the model's (normalised) input space and are optimised, with both models frozen, for

.. math:: \\mathcal{L}_{gen} = \\frac{1}{N}\\sum_i \\Big[\\mathcal{L}_c(\\theta^t; x_i, y_i)
          + \\lambda_{dis}\\big(1 - \\mathrm{JS}(p(\\theta^t; x_i),
          p(\\theta_k^{t-1}; x_i))\\big)\\Big]

so that the global model ``theta^t`` predicts the target labels ``y_i`` (consensus) while the client's
previous local model disagrees with it. The targets complement the client's label counts ``d``
(Appendix A.1.1): ``d_hat = max(d) - d``, and class ``c`` gets ``N * d_hat_c / |d_hat|_1`` targets.

**Distillation** (Sec. 4.2, eq. 3): local training adds ``lambda_kd * KL(p(theta^t; x) || p(theta; x))``
on the generated inputs, with the global model's outputs (computed once, at the end of generation) as
soft labels; Appendix A.2.2's hyper-parameter-free variant weights the real-data loss by
``N_real / (N_real + N_gen)`` and the KD loss by ``N_gen / (N_real + N_gen)`` with ``N_real = |d|_1``,
``N_gen = |d_hat|_1``.

**Our choices where the paper is silent** (spec ``fedcog.md`` Sec. 8): largest-remainder rounding so
that exactly ``N`` targets are produced (the official code floors, losing up to ``C - 1``); uniform
targets for a perfectly balanced client (``d_hat = 0``; the official code divides by zero); Adam on the
inputs with lr 0.01 and betas (0.5, 0.9) as the official code; the last iterate is kept; temperature 1;
JS exactly as eq. 2 (natural log, ``KL(p || m)``; the official code clamps probabilities and reverses the
KL direction).

**Multilabel tasks** (FLAIR; the paper gives no formulas, this is our design): the label counts are
per-label positive counts, every generated input gets exactly one positive label (its target) with
counts from the same complementary rule, ``L_c`` is the binary cross-entropy of the global model against
that multi-hot target, and JS and KD act on the per-label Bernoulli distributions
``(sigmoid(z), sigmoid(-z))``, averaged over labels.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

Task = Literal["multiclass", "multilabel"]
Forward = Callable[[Tensor], Tensor]


# ------------------------------------------------------------------------------ distributions
def distribution(logits: Tensor, task: Task, temperature: float = 1.0) -> Tensor:
    """Probabilities of the model's predictive distribution(s).

    Multiclass: ``softmax(z / T)`` over the last dim, shape ``[N, C]``. Multilabel: one Bernoulli per
    label, ``stack(sigmoid(z / T), sigmoid(-z / T))``, shape ``[N, L, 2]``.
    """
    z = logits / temperature
    if task == "multiclass":
        return z.softmax(dim=-1)
    return torch.stack([torch.sigmoid(z), torch.sigmoid(-z)], dim=-1)


def log_distribution(logits: Tensor, task: Task, temperature: float = 1.0) -> Tensor:
    """Log-probabilities of :func:`distribution` (computed stably: log-softmax, log-sigmoid)."""
    z = logits / temperature
    if task == "multiclass":
        return z.log_softmax(dim=-1)
    return torch.stack([F.logsigmoid(z), F.logsigmoid(-z)], dim=-1)


def js_divergence(p: Tensor, q: Tensor) -> Tensor:
    """Jensen-Shannon divergence between distributions over the last dim (natural log), per row.

    ``JS(p, q) = 1/2 KL(p || m) + 1/2 KL(q || m)`` with ``m = (p + q) / 2`` (Lin, 1991), computed as
    ``H(m) - H(p)/2 - H(q)/2`` with ``0 log 0 = 0``. Symmetric, in ``[0, ln 2]``, 0 iff ``p = q``,
    ``ln 2`` for disjoint supports.
    """
    m = (p + q) / 2
    return (0.5 * torch.xlogy(p, p) + 0.5 * torch.xlogy(q, q) - torch.xlogy(m, m)).sum(dim=-1)


def disagreement_loss(global_logits: Tensor, local_logits: Tensor, task: Task) -> Tensor:
    """FedCOG's disagreement loss, eq. 2: ``1 - JS(p_global, p_local)`` per sample, in ``[1 - ln 2, 1]``.

    Multilabel: ``1 - mean_l JS(Bernoulli_l(global), Bernoulli_l(local))`` (our choice, see module doc).
    """
    js = js_divergence(distribution(global_logits, task), distribution(local_logits, task))
    if task == "multilabel":
        js = js.mean(dim=-1)
    return 1.0 - js


def kd_loss(
    student_logits: Tensor, teacher_log_probs: Tensor, task: Task, temperature: float = 1.0
) -> Tensor:
    """``T^2 * KL(teacher || student)``, averaged over the batch (and over labels for multilabel).

    The teacher enters as log-probabilities (:func:`log_distribution` of its logits), so the loss is
    exactly 0 (and its gradient too) when student and teacher logits are equal. Eq. 3 of the paper
    with the temperature of the official code (T = 1 by default).
    """
    log_s = log_distribution(student_logits, task, temperature)
    kl = (teacher_log_probs.exp() * (teacher_log_probs - log_s)).sum(dim=-1)  # [N] or [N, L]
    if task == "multilabel":
        kl = kl.mean(dim=-1)
    return kl.mean() * temperature**2


# ------------------------------------------------------------------------------------ targets
def largest_remainder(weights: Tensor, total: int) -> Tensor:
    """Integer counts proportional to non-negative integer ``weights`` summing exactly to ``total``.

    Each entry gets ``floor(total * w_c / sum(w))``; the ``total - sum(floors)`` leftover units go to the
    largest remainders, ties to the lower index (Hamilton's method). Exact integer arithmetic.
    """
    w = weights.to(torch.int64)
    s = int(w.sum())
    if s <= 0:
        raise ValueError("largest_remainder needs weights with a positive sum")
    scaled = w * total
    counts, rem = scaled // s, scaled % s
    left = total - int(counts.sum())
    if left:
        order = sorted(range(len(w)), key=lambda c: (-int(rem[c]), c))
        counts[order[:left]] += 1
    return counts


def complementary_counts(label_counts: Tensor, n: int) -> Tensor:
    """Targets per class for ``n`` generated samples (FedCOG Appendix A.1.1, complementary strategy).

    ``d_hat = max(d) - d``; class ``c`` gets ``n * d_hat_c / |d_hat|_1`` targets, rounded by
    :func:`largest_remainder` so the total is exactly ``n``. The most frequent classes get none. A
    balanced client (``d_hat = 0``) gets uniform targets (the paper's basic strategy) instead of a NaN.

    Example: ``d = [500, 0, 400, 200, 400]`` gives ``d_hat = [0, 500, 100, 300, 100]``; ``n = 1000`` gives
    ``[0, 500, 100, 300, 100]`` and ``n = 256`` gives ``[0, 128, 26, 77, 25]``.
    """
    d = label_counts.to(torch.int64)
    d_hat = d.max() - d
    if int(d_hat.sum()) == 0:
        return largest_remainder(torch.ones_like(d), n)
    return largest_remainder(d_hat, n)


def target_labels(counts: Tensor) -> Tensor:
    """Class indices in blocks, ``[0]*counts[0] + [1]*counts[1] + ...`` (the paper's target list)."""
    return torch.repeat_interleave(torch.arange(len(counts)), counts.to(torch.int64))


def kd_weights(
    label_counts: Tensor, weighting: Literal["fixed", "balanced"], lambda_kd: float
) -> tuple[float, float]:
    """Coefficients ``(w_c, w_kd)`` of the real-data loss and the KD loss.

    ``fixed``: ``(1, lambda_kd)`` (eq. 3). ``balanced`` (Appendix A.2.2): with ``N_real = |d|_1`` and
    ``N_gen = |max(d) - d|_1``, ``(N_real, N_gen) / (N_real + N_gen)``; e.g. ``d = [500, 0, 400, 200, 400]``
    gives ``(0.6, 0.4)``, a balanced client ``(1, 0)``.
    """
    if weighting == "fixed":
        return 1.0, float(lambda_kd)
    d = label_counts.to(torch.int64)
    n_real, n_gen = int(d.sum()), int((d.max() - d).sum())
    if n_real + n_gen == 0:
        return 1.0, 0.0
    return n_real / (n_real + n_gen), n_gen / (n_real + n_gen)


# --------------------------------------------------------------------------------- generation
@dataclass
class Generated:
    """The result of :func:`generate`.

    Attributes:
        inputs: ``[N, *input_shape]`` generated inputs (no gradient).
        targets: ``[N]`` target class indices.
        teacher_logits: ``[N, C]`` logits of the global model on ``inputs`` (the soft labels).
        losses: ``L_gen`` before each optimisation step (``gen_steps`` values).
    """

    inputs: Tensor
    targets: Tensor
    teacher_logits: Tensor
    losses: list[float] = field(default_factory=list)


def generation_loss(
    global_logits: Tensor,
    targets: Tensor,
    task: Task,
    local_logits: Tensor | None = None,
    lambda_dis: float = 0.0,
) -> Tensor:
    """Eq. 1 on a batch: ``mean_i L_c + lambda_dis * mean_i (1 - JS)``.

    ``L_c`` is the cross-entropy of the global logits w.r.t. the targets (multilabel: binary
    cross-entropy against the one-hot multi-hot target, mean over labels). Without ``local_logits``
    (no previous local model) the disagreement term is its constant value 1 for equal models.
    """
    if task == "multiclass":
        loss = F.cross_entropy(global_logits, targets)
    else:
        multi_hot = F.one_hot(targets, global_logits.shape[-1]).to(global_logits.dtype)
        loss = F.binary_cross_entropy_with_logits(global_logits, multi_hot)
    if lambda_dis:
        dis = disagreement_loss(global_logits, local_logits, task).mean() if local_logits is not None else 1.0
        loss = loss + lambda_dis * dis
    return loss


def generate(
    global_forward: Forward,
    targets: Tensor,
    input_shape: tuple[int, ...],
    task: Task,
    local_forward: Forward | None = None,
    lambda_dis: float = 0.1,
    steps: int = 100,
    lr: float = 0.01,
    betas: tuple[float, float] = (0.5, 0.9),
    batch_size: int | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    generator: torch.Generator | None = None,
) -> Generated:
    """Optimise ``len(targets)`` inputs from ``N(0, 1)`` for eq. 1 with Adam; only the inputs are trained.

    ``global_forward``/``local_forward`` map inputs to logits of the frozen models (the caller puts
    them in eval mode). Gradients are taken with ``torch.autograd.grad`` w.r.t. the inputs only, so no
    parameter ``.grad`` is touched. ``batch_size`` splits the inputs into chunks whose gradients are
    those of the full-batch mean (Adam acts element-wise, so the result equals one full batch up to
    float summation order). With ``local_forward=None`` or ``lambda_dis=0`` the local model is not run.

    Returns:
        The inputs after ``steps`` Adam steps (``steps = 0``: the Gaussian noise itself) and the global
        model's logits on them.
    """
    n = int(targets.numel())
    targets = targets.to(device)
    x0 = torch.randn(
        (n, *input_shape), generator=generator, device="cpu" if generator is not None else device
    )
    x0 = x0.to(device=device, dtype=dtype)
    size = n if batch_size is None else max(1, int(batch_size))
    chunks = [x0[i : i + size].clone().requires_grad_(True) for i in range(0, n, size)]
    spans = [range(i, min(i + size, n)) for i in range(0, n, size)]
    run_local = local_forward is not None and lambda_dis != 0
    optimizer = torch.optim.Adam(chunks, lr=lr, betas=betas, eps=1e-8)
    losses: list[float] = []
    for _ in range(steps):
        total = 0.0
        for xc, span in zip(chunks, spans):
            tc = targets[span.start : span.stop]
            g_logits = global_forward(xc)
            l_logits = local_forward(xc) if run_local else None
            loss = generation_loss(g_logits, tc, task, l_logits, lambda_dis) * (len(span) / n)
            (grad,) = torch.autograd.grad(loss, [xc])
            xc.grad = grad
            total += float(loss.detach())
        losses.append(total)
        optimizer.step()
    with torch.no_grad():
        inputs = torch.cat([c.detach() for c in chunks]) if chunks else x0
        teacher = torch.cat([global_forward(c) for c in inputs.split(size)]) if n else inputs.new_zeros(0)
    return Generated(inputs, targets, teacher.float(), losses)


def label_counts(labels: Tensor, num_classes: int) -> Tensor:
    """Per-class counts of ``[N]`` class labels, or per-label positive counts of ``[N, L]`` 0/1 targets."""
    if labels.ndim == 1:
        return torch.bincount(labels.to(torch.int64).cpu(), minlength=num_classes)[:num_classes]
    return (labels > 0).sum(dim=0).to(torch.int64).cpu()[:num_classes]


def kd_cycle_order(n: int, steps: int, batch_size: int, generator: torch.Generator) -> Tensor:
    """Indices of ``steps`` generated mini-batches: reshuffled passes over ``n`` samples, concatenated."""
    passes = max(1, math.ceil(steps * batch_size / max(n, 1)))
    return torch.cat([torch.randperm(n, generator=generator) for _ in range(passes)])


__all__ = [
    "Generated",
    "complementary_counts",
    "disagreement_loss",
    "distribution",
    "generate",
    "generation_loss",
    "js_divergence",
    "kd_cycle_order",
    "kd_loss",
    "kd_weights",
    "label_counts",
    "largest_remainder",
    "log_distribution",
    "target_labels",
]
