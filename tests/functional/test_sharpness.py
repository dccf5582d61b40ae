"""SAM math: one global norm over all tensors, the offsets, an exact restore."""

import math

import torch
from torch import nn

from fl_lightning.functional.sharpness import (
    clip_grads_,
    global_grad_norm,
    global_norm,
    perturb,
    restore,
    sam_offsets,
)


def test_global_norm_is_one_norm_over_the_concatenation():
    a, b = torch.tensor([3.0, 4.0]), torch.tensor([[12.0]])
    assert global_norm([a, None, b]).item() == 13.0  # sqrt(9 + 16 + 144), not 5 + 12 nor max
    lin = nn.Linear(3, 2)
    lin.weight.grad = torch.full((2, 3), 2.0)
    lin.bias.grad = torch.tensor([1.0, -1.0])
    expected = torch.cat([p.grad.flatten() for p in lin.parameters()]).norm()
    torch.testing.assert_close(global_grad_norm(lin.parameters()), expected, rtol=0, atol=0)
    assert global_norm([]).item() == 0.0


def test_sam_offsets_have_global_norm_rho_and_keep_the_direction():
    d = [torch.tensor([3.0, 4.0]), None, torch.tensor([12.0])]
    e = sam_offsets(d, rho=0.5)
    assert e[1] is None
    scale = 0.5 / (13.0 + 1e-7)
    torch.testing.assert_close(e[0], torch.tensor([3.0, 4.0]) * scale)
    torch.testing.assert_close(e[2], torch.tensor([12.0]) * scale)
    assert math.isclose(global_norm(e).item(), 0.5 * 13.0 / (13.0 + 1e-7), rel_tol=1e-6)
    zero = sam_offsets(d, rho=0.0)
    assert torch.equal(zero[0], torch.zeros(2)) and torch.equal(zero[2], torch.zeros(1))


def test_restore_is_bit_exact_where_subtracting_the_offset_is_not():
    w = torch.tensor([0.1, 1.0, 3.3])
    e = torch.tensor([0.3, 1e-3, 0.7])
    assert not torch.equal((w + e) - e, w)  # why restore copies instead of subtracting
    p = nn.Parameter(w.clone())
    saved = perturb([p], [e])
    assert torch.equal(p.detach(), w + e)
    restore([p], saved)
    assert torch.equal(p.detach(), w)


# ------------------------------------------------------------------------ stacked clients (vectorised)
def test_stacked_norms_clipping_and_offsets_are_per_client():
    torch.manual_seed(0)
    stacked = [torch.randn(3, 4, 2), torch.randn(3, 5) * 10, torch.randn(3)]
    norms = global_norm(stacked, stacked=True)
    assert norms.shape == (3,)
    for k in range(3):
        own = [t[k] for t in stacked]
        torch.testing.assert_close(norms[k], global_norm(own))
    offsets = sam_offsets(stacked, 0.5, stacked=True)
    for k in range(3):
        own = sam_offsets([t[k] for t in stacked], 0.5)
        for e, o in zip(offsets, own):
            torch.testing.assert_close(e[k], o)
    params = [torch.zeros_like(t, requires_grad=True) for t in stacked]
    for p, t in zip(params, stacked):
        p.grad = t.clone()
    clip_grads_(params, 1.0, stacked=True)
    for k in range(3):
        own = [torch.zeros_like(t[k], requires_grad=True) for t in stacked]
        for p, t in zip(own, stacked):
            p.grad = t[k].clone()
        clip_grads_(own, 1.0)
        for p, o in zip(params, own):
            torch.testing.assert_close(p.grad[k], o.grad)
