"""Plain functions behind the strategies and the round loop: no state, unit-tested on their own.

Payloads are what crosses the network in a round: ``{group: {name: tensor}}``, e.g.
``{"weights": {"conv1.weight": ...}, "control": {...}}``. Every byte count in the framework is taken
from the tensors of a payload, so it is the real traffic of the simulated protocol.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

Payload = dict[str, dict[str, Tensor]]


def derive_seed(*keys: int) -> int:
    """A 63-bit seed derived from integer keys (e.g. ``(run_seed, round, client_id)``).

    Uses ``numpy.random.SeedSequence`` so that nearby keys give unrelated streams and the value
    depends only on the keys, never on how many draws happened before (resume-safe).
    """
    state = np.random.SeedSequence([int(k) for k in keys]).generate_state(2, dtype=np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1]))


def seed_rng(seed: int, device: torch.device) -> None:
    """Seed the default RNG of the CPU and, for a CUDA device, of that device only.

    Cheaper than ``torch.manual_seed``, which also queues a lazy seeding of every accelerator type
    (it captures a stack trace each call, milliseconds per client).
    """
    torch.random.default_generator.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.default_generators[device.index or 0].manual_seed(seed)


def module_device(module: nn.Module) -> torch.device:
    """The device of ``module``'s first parameter (or buffer); the CPU for a module without tensors."""
    for t in module.parameters():
        return t.device
    for t in module.buffers():
        return t.device
    return torch.device("cpu")


def to_device(batch: Any, device: torch.device | str) -> Any:
    """``batch`` with every tensor on ``device`` (tuples, lists and dicts rebuilt; no copy if already there).

    Copies to an accelerator are ``non_blocking`` (the device orders them before any kernel that reads
    the result on the same stream); copies to the host are blocking, since a host op could otherwise
    read the tensor before the copy has landed.
    """
    device = torch.device(device)
    return _to_device(batch, device, device.type != "cpu")


def _to_device(batch: Any, device: torch.device, non_blocking: bool) -> Any:
    if isinstance(batch, Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, tuple | list):
        return type(batch)(_to_device(b, device, non_blocking) for b in batch)
    if isinstance(batch, Mapping):
        return {k: _to_device(v, device, non_blocking) for k, v in batch.items()}
    return batch


def payload_bytes(payload: Mapping[str, Mapping[str, Tensor]]) -> int:
    """Bytes of every tensor in a payload (``numel * element_size``), as sent over the wire."""
    return sum(t.numel() * t.element_size() for group in payload.values() for t in group.values())


def shared_state(module: nn.Module, exclude: Iterable[str] = ()) -> dict[str, Tensor]:
    """The floating-point entries of ``module.state_dict()`` (parameters and float buffers).

    Integer buffers such as BatchNorm's ``num_batches_tracked`` are local bookkeeping and are not
    communicated. Tensors are returned without copying (``keep_vars`` semantics on ``.data``).
    """
    skip = set(exclude)
    return {
        name: t
        for name, t in module.state_dict(keep_vars=False).items()
        if t.is_floating_point() and name not in skip
    }


@torch.no_grad()
def load_tensors(module: nn.Module, tensors: Mapping[str, Tensor]) -> None:
    """Copy ``tensors`` into the same-named entries of ``module``'s state in place.

    In-place copies keep parameter identity, so optimizers built on the module stay valid.
    Raises KeyError for a name the module does not have.
    """
    state = module.state_dict(keep_vars=True)
    for name, value in tensors.items():
        state[name].data.copy_(value)


def proximal_term(module: nn.Module | Mapping[str, Tensor], reference: Mapping[str, Tensor]) -> Tensor:
    """``1/2 * sum_j ||w_j - w_ref_j||^2`` over the module's parameters named in ``reference``.

    The FedProx local term (Li et al., 2020, eq. 2) is ``mu`` times this value; Ditto's personal term
    (Li et al., 2021, eq. 2) is ``lambda`` times it with ``module`` a dict of personal tensors. Pairs the
    parameters with the reference by name, then :func:`proximal_terms`.
    """
    named = list(module.named_parameters() if isinstance(module, nn.Module) else module.items())
    pairs = [(p, reference[n]) for n, p in named if p.requires_grad and n in reference]
    if not pairs:
        return torch.zeros((), device=named[0][1].device if named else None)
    return proximal_terms([p for p, _ in pairs], [r for _, r in pairs])


def proximal_terms(params: Sequence[Tensor], reference: Sequence[Tensor]) -> Tensor:
    """``1/2 * sum_j ||w_j - w_ref_j||^2`` for aligned lists, differentiable in ``params``.

    Multi-tensor ops (one subtraction, one norm per group; autograd supports both), so the term costs
    the same few kernels per step whatever the number of parameter tensors: ``1/2 sum_j n_j^2`` with
    ``n_j = ||w_j - w_ref_j||`` (the gradient ``w - w_ref`` at distance 0 is exactly 0).
    """
    if not params:
        return torch.zeros(())
    refs = [r.detach() if r.requires_grad else r for r in reference]
    diffs = torch._foreach_sub(list(params), refs)
    return 0.5 * torch.stack(torch._foreach_norm(diffs, 2)).square().sum()


def accumulate(acc: dict[str, Tensor], tensors: Mapping[str, Tensor], weight: float) -> None:
    """``acc[name] += weight * tensors[name]`` for every entry (allocating on first use).

    Streaming weighted sums keep one model-sized buffer per group however many clients a round
    has, and a sum is what a collective ``all_reduce`` combines across processes.
    """
    with torch.no_grad():
        known = [n for n in tensors if n in acc]
        if known:  # one multi-tensor op for the entries already summed
            torch._foreach_add_([acc[n] for n in known], [tensors[n] for n in known], alpha=weight)
        for name, t in tensors.items():
            if name not in acc:
                acc[name] = t.detach().mul(weight)


def pseudo_gradient(global_params: Mapping[str, Tensor], target: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The FedOpt pseudo-gradient ``Delta = w_global - target`` for every name in ``target``.

    Reddi et al. (2021), Alg. 1: a server optimizer step with this gradient and lr 1 under plain
    SGD moves ``w_global`` exactly to ``target`` (FedAvg); momentum or Adam give FedAvgM/FedAdam.
    """
    return {name: global_params[name].detach() - value for name, value in target.items()}


def all_finite(payload: Mapping[str, Mapping[str, Tensor]]) -> bool:
    """True when every tensor of a payload is finite (no NaN or Inf).

    One host sync for the whole payload: ``0 * t`` is 0 where ``t`` is finite and NaN where it is not,
    so the L1 norms of ``0 * t_j`` (multi-tensor ops, no overflow possible) are all 0 exactly when
    the payload is finite; they are reduced on the device and only the final flag is read back.
    """
    tensors = [t for group in payload.values() for t in group.values() if t.is_floating_point()]
    if not tensors:
        return True
    groups = _by_device(tensors).values()
    norms = [n for ts in groups for n in torch._foreach_norm(torch._foreach_mul(ts, 0.0), 1)]
    if len({n.device for n in norms}) > 1:
        norms = [n.cpu() for n in norms]
    return bool(torch.isfinite(torch.stack(norms)).all())


def _by_device(tensors: list[Tensor]) -> dict[tuple[torch.device, torch.dtype], list[Tensor]]:
    groups: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    return groups
