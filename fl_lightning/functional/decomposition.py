"""Filter-atom decomposition as plain functions (Chen & Qiu, "Extra Clients at No Extra Cost", ICML 2025).

A convolutional filter bank ``W[c_out, c_in, k, k]`` is a linear combination of ``m_a`` filter atoms
``D[q, k, k]`` shared by the whole layer, with atom coefficients ``alpha[c_out, c_in, q]`` (Sec. 4)::

    W[o, i] = sum_q alpha[o, i, q] * D[q]

Federated aggregation averages ``alpha`` and ``D`` separately, so the global filter is a product of
averages; expanding it (Sec. 4, eq. 8) gives ``m`` "own" models with weights ``p_k^2`` and
``m^2 - m`` cross terms ``alpha_k1 x D_k2`` ("latent clients") with weights ``p_k1 p_k2``.
The layer (:class:`~fl_lightning.models.decomposed.DecomposedConv2d`) and the strategies call these
functions; the tests check them on their own.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "atom_conv2d",
    "conv_from_decomposed",
    "cross_term_expansion",
    "decomposed_num_params",
    "fast_slow_ratio",
    "orthonormal_atoms",
    "reconstruct_filters",
    "svd_atoms",
]


def reconstruct_filters(coefficients: Tensor, atoms: Tensor) -> Tensor:
    """``W[o, i, h, w] = sum_q alpha[o, i, q] * D[q, h, w]`` (Sec. 4, the element formula).

    Args:
        coefficients: ``alpha`` of shape ``[c_out, c_in, m_a]``.
        atoms: ``D`` of shape ``[m_a, kh, kw]``.

    Returns:
        The filter bank of shape ``[c_out, c_in, kh, kw]`` (differentiable in both factors).
    """
    c_out, c_in, m = coefficients.shape
    return (coefficients.reshape(c_out * c_in, m) @ atoms.reshape(m, -1)).reshape(
        c_out, c_in, *atoms.shape[1:]
    )


def conv_from_decomposed(
    x: Tensor,
    coefficients: Tensor,
    atoms: Tensor,
    bias: Tensor | None = None,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] | str = 0,
    dilation: int | tuple[int, int] = 1,
    groups: int = 1,
) -> Tensor:
    """Reconstruct-then-convolve: ``conv2d(x, alpha x D)``, one standard conv plus a tiny matmul."""
    return F.conv2d(x, reconstruct_filters(coefficients, atoms), bias, stride, padding, dilation, groups)


def atom_conv2d(
    x: Tensor,
    coefficients: Tensor,
    atoms: Tensor,
    bias: Tensor | None = None,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] | str = 0,
    dilation: int | tuple[int, int] = 1,
    groups: int = 1,
) -> Tensor:
    """The two-stage form (App. B): an atom conv, then a 1×1 atom-coefficient conv.

    Every input channel ``i`` is convolved with every atom ``q`` (a depthwise conv with ``groups=c_in``
    on the atoms repeated ``c_in`` times), giving ``c_in * m_a`` channels ordered input-channel-major
    (channel ``i * m_a + q``); a 1×1 conv with ``alpha.reshape(c_out, c_in/groups * m_a, 1, 1)``
    and the layer's groups combines them. Equal to :func:`conv_from_decomposed` by linearity.
    """
    c_in = x.shape[1]
    m = atoms.shape[0]
    bank = atoms.unsqueeze(1).repeat(c_in, 1, 1, 1)  # [c_in*m, 1, kh, kw]: channel i*m+q = atom q
    z = F.conv2d(x, bank, None, stride, padding, dilation, groups=c_in)
    c_out, c_in_g, _ = coefficients.shape
    return F.conv2d(z, coefficients.reshape(c_out, c_in_g * m, 1, 1), bias, groups=groups)


def orthonormal_atoms(
    num_atoms: int,
    kernel_size: tuple[int, int],
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Random atoms ``D[m_a, kh, kw]`` that are orthonormal as ``m_a`` vectors of size ``kh*kw``.

    When ``m_a > kh*kw`` the rows cannot be orthonormal; the columns are (``D^T D = I``), so every
    ``kh×kw`` filter is still exactly representable. QR of a Gaussian matrix (Haar-distributed).
    """
    size = kernel_size[0] * kernel_size[1]
    g = torch.randn(max(num_atoms, size), min(num_atoms, size), generator=generator, dtype=torch.float64)
    q, r = torch.linalg.qr(g)
    q = q * torch.sign(torch.diagonal(r)).unsqueeze(0)  # unique, Haar-distributed
    flat = q.T if num_atoms <= size else q  # [m, size]
    return flat.reshape(num_atoms, *kernel_size).to(dtype)


def svd_atoms(
    weight: Tensor, num_atoms: int, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """The best rank-``m_a`` factorisation ``W ≈ alpha x D`` of a filter bank (Eckart–Young).

    ``W`` is flattened to ``(c_out*c_in) × (kh*kw)``; ``D`` holds its top ``m_a`` right singular
    vectors and ``alpha = W_flat D_flat^T``, so ``||W - alpha x D||_F^2`` is the sum of the discarded
    squared singular values, and the factorisation is exact when ``m_a >= rank(W_flat)`` (always when
    ``m_a >= kh*kw``, e.g. every 3×3 conv with the paper's ``m_a = 9``). For ``m_a > kh*kw`` the atoms
    are random with orthonormal columns (:func:`orthonormal_atoms`), which is also exact.

    Args:
        weight: ``[c_out, c_in, kh, kw]`` filters.
        num_atoms: ``m_a``.
        generator: RNG for the ``m_a > kh*kw`` case.

    Returns:
        ``(coefficients [c_out, c_in, m_a], atoms [m_a, kh, kw])`` in ``weight``'s dtype.
    """
    c_out, c_in, kh, kw = weight.shape
    flat = weight.detach().reshape(c_out * c_in, kh * kw).double()
    if num_atoms <= kh * kw:  # right singular vectors = eigenvectors of the small Gram matrix
        _, vecs = torch.linalg.eigh(flat.T @ flat)  # ascending eigenvalues
        atoms = vecs.flip(1)[:, :num_atoms].T
    else:
        atoms = orthonormal_atoms(num_atoms, (kh, kw), generator, torch.float64).reshape(num_atoms, -1)
        atoms = atoms.to(flat.device)  # drawn on the host (the generator's device)
    coefficients = flat @ atoms.T
    return (
        coefficients.reshape(c_out, c_in, num_atoms).to(weight.dtype),
        atoms.reshape(num_atoms, kh, kw).to(weight.dtype),
    )


def cross_term_expansion(
    coefficients: Sequence[Tensor], atoms: Sequence[Tensor], weights: Sequence[float]
) -> tuple[Tensor, Tensor]:
    """The two parts of the aggregated filter ``(sum_k p_k alpha_k) x (sum_k p_k D_k)`` (eq. 8).

    Returns ``(own, cross)`` with ``own = sum_k p_k^2 alpha_k x D_k`` (the ``m`` real clients) and
    ``cross = sum_{k1 != k2} p_k1 p_k2 alpha_k1 x D_k2`` (the ``m^2 - m`` latent clients); their sum
    is the product of the averages, and the weights sum to ``(sum_k p_k)^2 = 1``.
    """
    own: Tensor | None = None
    cross: Tensor | None = None
    for k1, (a, p1) in enumerate(zip(coefficients, weights)):
        for k2, (d, p2) in enumerate(zip(atoms, weights)):
            term = p1 * p2 * reconstruct_filters(a, d)
            if k1 == k2:
                own = term if own is None else own + term
            else:
                cross = term if cross is None else cross + term
    if own is None:
        raise ValueError("cross_term_expansion needs at least one client")
    return own, torch.zeros_like(own) if cross is None else cross


def decomposed_num_params(
    in_channels: int, out_channels: int, kernel_size: int | tuple[int, int], num_atoms: int, groups: int = 1
) -> int:
    """Parameters of one decomposed layer without bias: ``c_out*c_in/groups*m_a + m_a*kh*kw`` (App. F)."""
    kh, kw = (kernel_size, kernel_size) if isinstance(kernel_size, int) else kernel_size
    return out_channels * (in_channels // groups) * num_atoms + num_atoms * kh * kw


def fast_slow_ratio(slow: int, fast: int, period: int) -> float:
    """Communication of the fast/slow protocol relative to sending everything every round (App. F).

    With ``beta = 1/period``: ``[beta*(slow + fast) + (1 - beta)*fast] / (slow + fast)``, which is
    ``≈ beta`` only when the slow part (the coefficients) dominates, ``slow >> fast``.

    Args:
        slow: Entries sent once every ``period`` rounds (e.g. all atom coefficients).
        fast: Entries sent every round (atoms, heads, biases, 1×1 convs).
        period: ``1/beta``, rounds between two sends of the slow entries.
    """
    beta = 1.0 / period
    return (beta * (slow + fast) + (1.0 - beta) * fast) / (slow + fast)
