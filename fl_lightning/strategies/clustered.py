"""What IFCA and CFL share: flat cluster models beside the one global model, a client's loss on its own
training data, the true groups of a client transform, and the record of who went where."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from fl_lightning.data.federated import ClientData
from fl_lightning.data.transforms import ClientTransform
from fl_lightning.functional.clustering import Layout, adjusted_rand, flatten_state, unflatten_state
from fl_lightning.functional.tensor import load_tensors, module_device, shared_state, to_device

#: Batch size of a client's pass over its training data to score a model (no gradients).
SCORE_BATCH = 256


def layout_of(model: nn.Module) -> tuple[Layout, torch.dtype]:
    """The flat layout of ``model``'s communicated entries and the dtype the flat copies use (the first's)."""
    state = shared_state(model)
    layout = [(n, t.shape) for n, t in state.items()]
    dtype = next(iter(state.values())).dtype if state else torch.float32
    return layout, dtype


def as_weights(flat: Tensor, layout: Layout, model: nn.Module) -> dict[str, Tensor]:
    """A flat cluster model as ``{name: tensor}`` in the dtypes of ``model``'s entries (views where equal)."""
    return unflatten_state(flat, layout, like=shared_state(model))


def as_flat(weights: dict[str, Tensor], layout: Layout, like: Tensor) -> Tensor:
    """``weights`` as one vector in the dtype and on the device of ``like``."""
    return flatten_state(weights, layout).to(like.device, like.dtype)


@torch.no_grad()
def training_loss(module: nn.Module, data: ClientData, batch_size: int = SCORE_BATCH) -> Tensor:
    """``F_i(w)``: the mean task loss of ``module`` (eval mode, restored after) over the client's whole
    training split as it sees it (its transform applied), a 0-dim tensor on the module's device."""
    device = module_device(module)
    was = module.training
    module.eval()
    total = torch.zeros((), device=device)
    idx_all = data.train_idx.to(data.x.device)
    try:
        for start in range(0, idx_all.numel(), batch_size):
            x, y = to_device(data.take(idx_all[start : start + batch_size]), device)
            total += module.task_loss(module(x), y).float() * y.shape[0]
    finally:
        module.train(was)
    return total / max(1, idx_all.numel())


def scores(module: nn.Module, candidates: list[dict[str, Tensor]], data: ClientData) -> Tensor:
    """``[F_i(theta_j) for j]``: each candidate model loaded into ``module`` in turn, on the client's training
    data (``module`` is left holding the last candidate)."""
    out = []
    for weights in candidates:
        load_tensors(module, weights)
        out.append(training_loss(module, data))
    return torch.stack(out)


def true_group(data: ClientData | None) -> int:
    """The client's group under a client transform that makes groups (``Rotation``, ``LabelPermutation``); -1
    when the run has none (no transform, one group, or one per client)."""
    t = None if data is None else data.transform
    if t is None or t.num_groups < 2 or type(t).group_of is ClientTransform.group_of:
        return -1
    return int(t.group_of(data.client_id))


def agreement(truth: list[int], found: list[int]) -> dict[str, float]:
    """``{"cluster_ari": ARI}`` of the clusters found against the true groups, when every client has one."""
    if not truth or any(g < 0 for g in truth):
        return {}
    return {"cluster_ari": adjusted_rand(truth, found)}


def log_client(module: nn.Module, name: str, value: float) -> None:
    """Record ``value`` in the client's metrics of the round (``z_client/<id>/<name>``) while it trains."""
    if getattr(module, "_local_logs", None) is not None:  # ClientModule.local_training: the client's metrics
        module.log(name, value)
