"""Client-level differential privacy: clipping by global norm, Gaussian noise, adaptive clipping, accounting.

DP-FedAvg (McMahan et al., ICLR 2018, "Learning Differentially Private Recurrent Language Models",
Alg. 1): each client's update ``Delta_k = w_k - w^t`` is clipped to global L2 norm ``C``,
``Delta_k <- Delta_k * min(1, C / ||Delta_k||)``, and the server releases the noised mean over a fixed
denominator ``n`` (the clients sampled per round), ``(sum_k Delta_k + N(0, (z C)^2 I)) / n``: one step of
a sampled Gaussian mechanism with noise multiplier ``z`` and sampling rate ``q = n / m``.

Adaptive clipping (Andrew et al., NeurIPS 2021, "Differentially Private Learning with Adaptive
Clipping", Alg. 1 and Thm. 1): clients also send ``b_k = 1[||Delta_k|| <= C]``; the server releases
``b~ = 1/2 + (sum_k (b_k - 1/2) + N(0, sigma_b^2)) / n`` (centred: sensitivity 1/2; ``(sum_k b_k +
N(0, sigma_b^2)) / n`` when every sampled client reports) and moves ``C <- C exp(-eta_C (b~ - gamma))``
towards the ``gamma``-quantile of the update norms. The update noise uses
``z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2)`` so that both releases together cost what one Gaussian
mechanism with multiplier ``z`` costs.

The privacy spent (``epsilon`` at ``delta``) is computed by Opacus's accountants (RDP, PRV), imported
lazily: install them with ``pip install fl_lightning[dp]``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from fl_lightning.errors import ConfigError
from fl_lightning.functional.sharpness import global_norm

#: The accountants :func:`epsilon_spent` knows: Opacus's class for each name.
ACCOUNTANTS = {"rdp": "RDPAccountant", "prv": "PRVAccountant"}

#: A privacy history: ``(noise multiplier z, sampling rate q, steps)`` triples, as Opacus keeps it.
History = list[tuple[float, float, int]]


def clip_factor(norm: Tensor | float, max_norm: float) -> Tensor:
    """``min(1, C / ||Delta||)`` (1 for a zero update): the factor that clips ``Delta`` to norm ``C``."""
    norm = torch.as_tensor(norm, dtype=torch.float32)
    return torch.clamp(max_norm / norm.clamp_min(1e-30), max=1.0)


def clip_update(
    upload: Sequence[Tensor], reference: Sequence[Tensor], max_norm: float
) -> tuple[list[Tensor], Tensor]:
    """Clip the update ``Delta = y - x`` to global norm ``C``: returns ``x + min(1, C/||Delta||) Delta``.

    McMahan et al. (2018), Alg. 1 (``ClipFn``, flat clipping): the norm is taken over every uploaded
    tensor together. Returns the clipped tensors (new tensors, dtypes of ``upload``) and ``||Delta||``
    before clipping.
    """
    if not upload:
        return [], torch.zeros(())
    ys = [t.float() for t in upload]
    xs = [r.to(t.device, torch.float32) for r, t in zip(reference, upload)]
    deltas = torch._foreach_sub(ys, xs)
    norm = global_norm(deltas)
    torch._foreach_mul_(deltas, clip_factor(norm, max_norm).to(deltas[0].device))
    torch._foreach_add_(deltas, xs)
    return [d.to(t.dtype) for d, t in zip(deltas, upload)], norm


def gaussian_noise(like: Sequence[Tensor], std: float, generator: torch.Generator) -> list[Tensor]:
    """``N(0, std^2)`` noise shaped like ``like`` (float32, on each tensor's device).

    Drawn as one flat vector on the CPU from ``generator``, so the same seed gives the same noise on
    every process and every device type.
    """
    total = sum(t.numel() for t in like)
    flat = torch.randn(total, generator=generator, dtype=torch.float32) * std
    out, offset = [], 0
    for t in like:
        out.append(flat[offset : offset + t.numel()].view(t.shape).to(t.device))
        offset += t.numel()
    return out


def noised_mean_update(
    mean: Sequence[Tensor],
    reference: Sequence[Tensor],
    count: float,
    denominator: float,
    std: float,
    generator: torch.Generator,
) -> list[Tensor]:
    """The DP-FedAvg release: ``x + (sum_k Delta_k + N(0, std^2 I)) / n`` from the uniform mean of uploads.

    Args:
        mean: ``(1/K) sum_k y_k``, the uniform mean of the ``K = count`` clipped uploads.
        reference: ``x = w^t``, the weights the clients started from.
        count: ``K``, the uploads in the mean.
        denominator: ``n``, the fixed denominator (clients sampled this round; McMahan et al.'s
            fixed-denominator estimator, whose sensitivity is ``C / n`` whatever ``K``).
        std: Standard deviation of the noise on the sum, ``z C``.
        generator: Source of the noise (seeded by the run seed and the round).
    """
    xs = [r.to(m.device, torch.float32) for r, m in zip(reference, mean)]
    sums = torch._foreach_sub([m.float() for m in mean], xs)
    torch._foreach_mul_(sums, float(count))
    if std > 0:
        torch._foreach_add_(sums, gaussian_noise(sums, std, generator))
    torch._foreach_div_(sums, float(denominator))
    torch._foreach_add_(sums, xs)
    return [s.to(m.dtype) for s, m in zip(sums, mean)]


def noised_fraction(
    count_below: float, count: float, denominator: float, std: float, generator: torch.Generator
) -> float:
    """Andrew et al. (2021), Alg. 1 and Thm. 1: ``b~ = 1/2 + (sum_k (b_k - 1/2) + N(0, sigma_b^2)) / n``.

    The noised fraction of the ``K = count`` aggregated updates that were not clipped
    (``count_below = sum_k b_k``), over the fixed denominator ``n``. The indicators are centred,
    ``b_k - 1/2 in {-1/2, 1/2}``, so that adding or removing one client moves the noised sum by at
    most ``1/2``: the sensitivity behind the ``2 sigma_b`` of Thm. 1 (with ``b_k in {0, 1}`` it would be
    1, and the count would cost more privacy than :func:`update_noise_multiplier` budgets for). With
    ``K = n`` this equals ``(sum_k b_k + N(0, sigma_b^2)) / n``; a sampled client that failed counts as
    neither clipped nor unclipped.
    """
    noise = float(torch.randn((), generator=generator, dtype=torch.float64)) * std if std > 0 else 0.0
    return 0.5 + (count_below - 0.5 * count + noise) / denominator


def update_clip_norm(clip_norm: float, unclipped_fraction: float, target_quantile: float, lr: float) -> float:
    """Andrew et al. (2021), Sec. 3 (geometric update): ``C <- C exp(-eta_C (b~ - gamma))``.

    ``b~`` is the (noised) fraction of updates with norm at most ``C``; ``C`` shrinks while more than
    the target quantile ``gamma`` of them are unclipped and grows while fewer are.
    """
    return clip_norm * math.exp(-lr * (unclipped_fraction - target_quantile))


def update_noise_multiplier(noise_multiplier: float, count_stddev: float) -> float:
    """Andrew et al. (2021), Thm. 1: ``z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2)``.

    The noise multiplier of the update release such that it and the clipped-count release (noise
    ``sigma_b`` on a sensitivity-1/2 query) compose to one Gaussian mechanism with multiplier ``z``.
    ``z = 0`` gives 0 (no noise).

    Raises:
        ValueError: If ``2 sigma_b <= z`` (the count alone would spend the whole budget).
    """
    if noise_multiplier == 0:
        return 0.0
    rest = noise_multiplier**-2 - (2 * count_stddev) ** -2 if count_stddev > 0 else -1.0
    if rest <= 0:
        raise ValueError(
            f"the clipped-count noise sigma_b={count_stddev:g} must exceed z/2={noise_multiplier / 2:g}"
        )
    return rest**-0.5


def default_delta(num_clients: int) -> float:
    """The default ``delta = 1 / m^1.1`` for ``m`` clients: below ``1/m``, as client-level DP requires."""
    return float(num_clients) ** -1.1


def make_accountant(name: str, history: History):
    """An Opacus accountant (``"rdp"`` or ``"prv"``) holding ``history``.

    Raises:
        ConfigError: If Opacus is missing or ``name`` is unknown.
    """
    if name not in ACCOUNTANTS:
        raise ConfigError(f"model.strategy.accountant={name!r} must be one of {', '.join(ACCOUNTANTS)}")
    try:
        from opacus import accountants
    except ImportError as err:  # one line, with the fix
        raise ConfigError(
            "differential privacy needs Opacus's accountants: pip install fl_lightning[dp]"
        ) from err
    accountant = getattr(accountants, ACCOUNTANTS[name])()
    accountant.history = [(float(z), float(q), int(s)) for z, q, s in history]
    return accountant


def epsilon_spent(history: History, delta: float, accountant: str = "rdp") -> float:
    """``epsilon`` at ``delta`` after the steps in ``history`` (0 before any step, inf with no noise).

    Opacus's accountants treat each step as a Poisson-subsampled Gaussian mechanism with sampling
    rate ``q`` and noise multiplier ``z``.
    """
    steps = [(z, q, s) for z, q, s in history if s > 0]
    if not steps:
        return 0.0
    if any(z <= 0 for z, _, _ in steps):
        return math.inf
    return float(make_accountant(accountant, steps).get_epsilon(delta=delta))


def add_step(history: History, noise_multiplier: float, sample_rate: float, steps: int = 1) -> History:
    """``history`` with ``steps`` more steps of ``(z, q)`` (merged into the last entry when equal)."""
    out = [tuple(h) for h in history]
    if out and out[-1][0] == noise_multiplier and out[-1][1] == sample_rate:
        z, q, s = out[-1]
        out[-1] = (z, q, s + steps)
    else:
        out.append((float(noise_multiplier), float(sample_rate), int(steps)))
    return out
