"""FedAvg (s.a.r.): FedAvg sending a random subset of the parameters (TDPFed paper, Table III)."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from fl_lightning.api import Aggregator, ClientContext, RoundInfo, Strategy, register_strategy
from fl_lightning.errors import ConfigError, check_number
from fl_lightning.functional.robust import unflatten
from fl_lightning.functional.sparsify import densify, flatten, indicator, random_indices, received_average
from fl_lightning.functional.tensor import Payload, derive_seed, load_tensors, shared_state

#: Client-state key of the client's own (flattened) local model, for ``fill="own"``.
LOCAL = "sar/local"
_DOWN = 0x5A2D  # stream tag of the downlink subsets


@register_strategy
class FedAvgSAR(Strategy):
    """FedAvg with random-subset transmission: "FedAvg (s.a.r.)", Wang et al. (TDPFed), Sec. VII-D, Table III.

    "To ensure the same compression rate, we let FedAvg randomly select some parameters for
    transmission according to the same proportion in the process of uploading and downloading model
    parameters." With the model flattened to ``w in R^D`` and ``q = 1 / ratio``:

    * down: the server sends client ``k`` the entries ``I_k^down`` (``round(qD)`` indices drawn
      uniformly per client and round) of ``w^t``; the client's start model is
      ``w_k <- fill_k`` with ``w_k[I_k^down] = w^t[I_k^down]``;
    * the client runs FedAvg's local SGD from ``w_k``;
    * up: it sends the entries ``I_k^up`` (a fresh uniform draw) of its trained ``w_k``; with
      ``M_k`` the 0/1 indicator of ``I_k^up`` and ``p_k = n_k / sum_j n_j``, the server sets, per entry,

      .. math:: w^{t+1} = \\frac{\\sum_k p_k M_k w_k}{\\sum_k p_k M_k} \\ (\\text{entries someone sent}),
         \\qquad w^{t+1} = w^t \\ (\\text{the others})

      (``fill="own"``), or ``w^{t+1} = sum_k p_k M_k w_k`` (``fill="zero"``).

    The paper does not say what a receiver puts at the entries it did not receive. ``fill="own"``
    (default) keeps the receiver's own values: the client its local model from its last round (the
    common initial model before its first), the server ``w^t``; so ``ratio = 1`` is FedAvg exactly.
    ``fill="zero"`` takes the paper's remark that "the position where the parameter amount is 0 still
    needs to be encoded" literally: unsent entries are zeros on both sides (no client state).

    Each sender draws its indices from a seed and sends the seed (8 bytes) with the ``round(qD)``
    values, so ``bytes_down`` and ``bytes_up`` are ``1/ratio`` of FedAvg's (the paper's TDPFed x1.5 / x2
    comparison); the paper notes that a real encoder might not reach this. Server-side, the loop's
    sampling seed and ``(round, client)`` seed the downlink draws; the client's per-round RNG stream
    seeds the uplink draw. Biases and float buffers are entries like any other.

    Args:
        ratio: Compression ratio ``CR >= 1``: each message and upload carries ``round(D / ratio)`` of
            the ``D`` model entries (TDPFed Table III: 1.5 and 2; 1 is FedAvg).
        fill: What a receiver holds at the entries it did not receive: ``"own"`` (its own current
            values) or ``"zero"``.
        server_lr: Server learning rate on the pseudo-gradient (1: the averaging above).
    """

    name = "fedavg_sar"
    prepares_clients = True

    def __init__(
        self, ratio: float = 2.0, fill: Literal["own", "zero"] = "own", server_lr: float = 1.0
    ) -> None:
        super().__init__(server_lr=server_lr)
        check_number(ratio, "model.strategy.ratio", low=1, hint="(TDPFed Table III: 1.5 or 2; 1 is FedAvg)")
        if fill not in ("own", "zero"):
            raise ConfigError(f"model.strategy.fill={fill!r} must be 'own' or 'zero'")
        self.ratio = ratio
        self.fill = fill
        self._seed = 0
        self._numel = 0

    def setup(self, model: nn.Module, num_clients: int) -> None:
        super().setup(model, num_clients)
        flat = flatten(shared_state(model))
        self._numel = flat.numel()
        if self.fill == "own":  # the common initial model: what a client holds before its first round
            self.register_buffer("initial", flat.clone())

    def select_clients(self, num_clients: int, count: int, round: int, seed: int) -> list[int]:
        self._seed = seed  # seeds the downlink subsets (the same on every process)
        return super().select_clients(num_clients, count, round, seed)

    # ---------------------------------------------------------------------------- server -> client
    def message(self, model: nn.Module, client_id: int, round: int) -> Payload:
        """``{"sparse": {"values": w^t[I_k^down], "seed": seed of I_k^down}}`` (no dense ``weights``)."""
        flat = flatten(shared_state(model))
        seed = derive_seed(self._seed, _DOWN, round, client_id)
        idx = random_indices(flat.numel(), self.ratio, seed, flat.device)
        return {"sparse": {"values": flat[idx], "seed": _seed_tensor(seed, flat.device)}}

    # ------------------------------------------------------------------------------- client side
    def on_client_start(self, module: nn.Module, ctx: ClientContext) -> None:
        """Start from the received entries, the client's own values (or zeros) elsewhere."""
        sparse = ctx.message["sparse"]
        values = sparse["values"]
        idx = random_indices(self._numel, self.ratio, int(sparse["seed"].item()), values.device)
        if self.fill == "own":
            fill = ctx.state.get(LOCAL, self.initial).to(values.device)
        else:
            fill = torch.zeros(self._numel, device=values.device)
        load_tensors(module, unflatten(densify(values, idx, fill), shared_state(module)))
        super().on_client_start(module, ctx)

    def upload(self, module: nn.Module, ctx: ClientContext) -> Payload:
        """``{"sparse": {"values": w_k[I_k^up], "seed": seed of I_k^up}}``; keeps ``w_k`` for "own"."""
        flat = flatten(shared_state(module))
        if self.fill == "own":
            ctx.state[LOCAL] = flat.clone()
        seed = int(torch.randint(0, 2**62, (1,)).item())  # the client's per-round RNG stream
        idx = random_indices(flat.numel(), self.ratio, seed, flat.device)
        return {"sparse": {"values": flat[idx], "seed": _seed_tensor(seed, flat.device)}}

    # ------------------------------------------------------------------------------- server side
    def aggregator(self) -> Aggregator:
        """The weighted mean (by sample count) of the dense ``M_k w_k`` and ``M_k`` (:meth:`expand`)."""
        return Aggregator(receive=self.expand)

    def expand(self, upload: Payload) -> Payload:
        """Expand an upload to ``M_k w_k`` and ``M_k`` (dense, server-side only) for the weighted sums."""
        sparse = upload["sparse"]
        values = sparse["values"]
        idx = random_indices(self._numel, self.ratio, int(sparse["seed"].item()), values.device)
        zeros = torch.zeros(self._numel, device=values.device)
        return {
            "masked": {"flat": densify(values, idx, zeros)},
            "mask": {"flat": indicator(idx, self._numel)},
        }

    @torch.no_grad()
    def server_update(self, model: nn.Module, means: Payload, info: RoundInfo) -> None:
        """Target: the per-entry average over the senders (``"own"``) or the zero-filled mean; FedOpt step."""
        if "masked" not in means:
            return
        state = shared_state(model)
        masked = means["masked"]["flat"]
        if self.fill == "own":
            target = received_average(masked, means["mask"]["flat"], flatten(state).to(masked.device))
        else:
            target = masked
        super().server_update(model, {"weights": unflatten(target, state)}, info)

    def extra_repr(self) -> str:
        return f"ratio={self.ratio}, fill={self.fill}, {super().extra_repr()}"


def _seed_tensor(seed: int, device: torch.device) -> Tensor:
    return torch.tensor([seed], dtype=torch.int64, device=device)
