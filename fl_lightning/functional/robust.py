"""Byzantine-robust aggregation of client updates (median, trimmed mean, Krum, norm clipping), and attacks.

Every aggregation function takes the round's updates stacked as one ``(K, D)`` matrix (one flattened
update per row, :func:`stack_flat`) and returns a ``(D,)`` aggregate; :func:`unflatten` turns it back
into named tensors. The order statistics (median, trimmed mean) and Krum are unweighted, as in their papers:
every client counts once whatever its sample count. :func:`malicious_clients` and :func:`attack_update`
simulate Byzantine clients (used by ``model.attack`` and the ``Attack`` plug-in).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from fl_lightning.functional.tensor import derive_seed

_ATTACK_STREAM = 0xA77AC  # seed stream of the choice of malicious clients


def stack_flat(tensors: Sequence[Mapping[str, Tensor]], names: Sequence[str]) -> Tensor:
    """Stack ``K`` named-tensor dicts as a ``(K, D)`` float matrix (entries ``names`` in order, flattened)."""
    return torch.stack([torch.cat([t[n].reshape(-1).float() for n in names]) for t in tensors])


def unflatten(vector: Tensor, like: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Split a flat ``(D,)`` vector into tensors shaped (and typed) like ``like``, in its key order."""
    out: dict[str, Tensor] = {}
    offset = 0
    for name, ref in like.items():
        out[name] = vector[offset : offset + ref.numel()].view(ref.shape).to(ref.dtype)
        offset += ref.numel()
    return out


def coordinate_median(updates: Tensor) -> Tensor:
    """Coordinate-wise median (Yin et al., ICML 2018), unweighted; for even K the mean of the middle two.

    Args:
        updates: ``(K, D)`` stacked updates.
    """
    k = updates.shape[0]
    ordered = updates.sort(dim=0).values
    if k % 2:
        return ordered[k // 2]
    return (ordered[k // 2 - 1] + ordered[k // 2]) / 2


def trimmed_mean(updates: Tensor, beta: float) -> Tensor:
    """Coordinate-wise ``beta``-trimmed mean (Yin et al., ICML 2018), unweighted.

    Per coordinate, drop the ``floor(beta K)`` smallest and largest values and average the rest.

    Raises:
        ValueError: If ``beta`` is outside ``[0, 0.5)`` or trimming would leave no value.
    """
    if not 0 <= beta < 0.5:
        raise ValueError(f"beta={beta} must be in [0, 0.5)")
    k = updates.shape[0]
    cut = int(beta * k)
    if k - 2 * cut < 1:
        raise ValueError(f"trimming {cut} of {k} values from each side leaves none")
    return updates.sort(dim=0).values[cut : k - cut].mean(dim=0)


def krum_scores(updates: Tensor, f: int) -> Tensor:
    """Krum scores (Blanchard et al., NeurIPS 2017, Sec. 4): ``s(i) = sum_{i -> j} ||V_i - V_j||^2``.

    ``i -> j`` ranges over the ``K - f - 2`` updates closest to ``V_i`` (excluding ``V_i`` itself).

    Raises:
        ValueError: If ``K - f - 2 < 1``.
    """
    k = updates.shape[0]
    near = k - f - 2
    if near < 1:
        raise ValueError(f"Krum needs more than f + 2 = {f + 2} updates, got {k}")
    dist = torch.cdist(updates, updates, compute_mode="donot_use_mm_for_euclid_dist").square()
    dist.fill_diagonal_(float("inf"))
    return dist.sort(dim=1).values[:, :near].sum(dim=1)


def krum(updates: Tensor, f: int, m: int = 1) -> tuple[Tensor, Tensor]:
    """Krum (``m=1``) and Multi-Krum (Blanchard et al., 2017, Sec. 5): the mean of the ``m`` best scores.

    Returns:
        ``(aggregate (D,), selected row indices (m,))``; ties go to the lower index.

    Raises:
        ValueError: If ``m`` is not in ``1..K`` or ``K - f - 2 < 1``.
    """
    k = updates.shape[0]
    if not 1 <= m <= k:
        raise ValueError(f"m={m} must be in 1..{k}")
    scores = krum_scores(updates, f)
    selected = torch.sort(scores, stable=True).indices[:m]
    return updates[selected].mean(dim=0), selected


def clip_norms(updates: Tensor, max_norm: float) -> Tensor:
    """Scale each row ``Delta_k`` to norm at most ``C``: ``Delta_k * min(1, C / ||Delta_k||)``.

    Norm-bounded averaging (Sun et al., 2019, "Can you really backdoor federated learning?", Sec. 4).
    """
    norms = updates.norm(dim=1, keepdim=True)
    return updates * (max_norm / norms.clamp_min(1e-12)).clamp(max=1.0)


def malicious_clients(num_clients: int, fraction: float, seed: int) -> frozenset[int]:
    """The ``round(fraction * num_clients)`` malicious client ids, fixed for a run.

    A uniform draw without replacement by a generator seeded from the run seed (its own stream), so the
    same clients attack on every process, on a rerun and after a resume; another seed, other clients.
    """
    count = round(fraction * num_clients)
    generator = torch.Generator().manual_seed(derive_seed(seed, _ATTACK_STREAM))
    return frozenset(torch.randperm(num_clients, generator=generator)[:count].tolist())


def attack_update(
    upload: Mapping[str, Tensor], sent: Mapping[str, Tensor], factor: float
) -> dict[str, Tensor]:
    """A manipulated upload: ``w^t + factor * (w_k - w^t)`` for every entry of ``upload`` also in ``sent``.

    ``sent`` is ``w^t`` (the weights the client received), ``upload`` its ``w_k``; ``factor = -s`` is the
    sign-flipping attack, ``factor = s`` the scaling attack (e.g. Fang et al., USENIX Security 2020;
    Bhagoji et al., ICML 2019). Entries not in ``sent`` and non-float entries are returned unchanged.
    """
    names = [n for n, t in upload.items() if n in sent and t.is_floating_point()]
    if not names:
        return dict(upload)
    ups = [upload[n] for n in names]
    base = [sent[n].to(u.device, u.dtype) for n, u in zip(names, ups)]
    out = torch._foreach_sub(ups, base)
    torch._foreach_mul_(out, factor)
    torch._foreach_add_(out, base)
    return {**upload, **dict(zip(names, out))}
