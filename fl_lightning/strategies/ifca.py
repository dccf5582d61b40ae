"""IFCA (Ghosh, Chung, Yin & Ramchandran, NeurIPS 2020): k cluster models, each client trains the one with the
lowest loss on its own data."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor, nn

from fl_lightning.api import (
    Aggregator,
    ClientContext,
    LocalTraining,
    RoundInfo,
    RunSpec,
    Strategy,
    Vectorizable,
    register_strategy,
)
from fl_lightning.data.federated import ClientData
from fl_lightning.errors import ConfigError
from fl_lightning.functional.clustering import Layout, lowest_loss
from fl_lightning.functional.tensor import Payload, derive_seed, load_tensors
from fl_lightning.strategies.clustered import (
    agreement,
    as_flat,
    as_weights,
    layout_of,
    log_client,
    scores,
    true_group,
)

#: Message groups ``cluster/<slot>``: the cluster models sent down (and, on the server, their uploads).
CLUSTER = "cluster/"
#: Upload group: the slot the client trained, its id, its true group (-1: none), its lowest loss per restart.
META = "ifca"
#: Server-side groups made from :data:`META` by the aggregator's receive transform.
ASSIGN, LOSS = "ifca/assign", "ifca/loss"
_INIT_STREAM = 0x1FCA


def _own_data(strategy: Any, module: nn.Module) -> str:
    return "IFCA scores each cluster model on a client's own data before its steps (a stacked group has none)"


def _check_count(value: Any, field: str, hint: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{field}={value!r} must be an integer >= 1 ({hint})")
    return value


@register_strategy
class IFCA(Strategy):
    """IFCA, Ghosh et al., "An Efficient Framework for Clustered Federated Learning", Alg. 2 (model avg.).

    The server keeps ``k`` cluster models ``theta_1..theta_k`` (strategy buffers, one flat vector each,
    checkpointed with the strategy) and sends all of them. A client ``i`` estimates its cluster on its whole
    training split (eval mode) and trains that model with the run's local steps:

    .. math:: \\hat j = \\arg\\min_j F_i(\\theta_j), \\qquad
        \\theta_j \\leftarrow \\theta_j + \\eta_s \\Big(\\sum_{i \\in S_j} \\tfrac{n_i}{\\sum_{S_j} n} w_i
        - \\theta_j\\Big)

    with ``w_i`` the client's trained model, ``S_j`` the round's clients that chose ``j`` and ``eta_s`` =
    ``server_lr`` (1: the paper's averaging; a cluster no client chose keeps its model). The upload is the
    trained model plus the chosen slot; the aggregator's receive transform files it under its cluster, so
    the streaming weighted mean yields every cluster's average on every path (one at a time, vectorised,
    processes, Flower) with no buffer of uploads.

    **Initialisation and restarts.** Each cluster model is a fresh random draw of the network
    (``reset_parameters()`` of its layers under a generator seeded by ``(seed, slot)``). The paper runs IFCA
    from several random initialisations and keeps the best run (Sec. 5.1; its code: 10 training seeds per
    setting, the best kept). Here ``restarts = R`` draws ``R`` sets of ``k`` models; the first round sends
    all ``R k``, each client picks the lowest-loss model among them and also reports, per set, its lowest
    loss ``min_j F_i(theta_j^r)``; after that round the server keeps the set with the lowest sample-weighted
    mean of those losses (IFCA's objective at the start) with that round's averages, and drops the others.
    ``R = 1`` (default) is plain random initialisation; whole reruns with other ``seed`` values are the
    paper's way and remain the stronger one.

    **Record.** Every client's choice is in its round metrics (``z_client/<id>/ifca/cluster``), and the last
    choice of each is kept (:meth:`cluster_ids`: the TensorBoard text ``cluster/assignment`` after every
    round, the ``cluster`` column of ``clients.csv``); the round
    metrics give each cluster's count of clients (``ifca/clients<j>``), the objective ``ifca/loss`` (mean
    lowest loss) and, when a client transform makes groups (``Rotation``, ``LabelPermutation``), the
    adjusted Rand index of the round's choices against them, ``cluster_ari`` (also in ``summary.json``).
    Each client uploads its true group for this measurement only; the algorithm never reads it.

    **Deployment.** A client's personalised model (``personal/*``) is the cluster model with the lowest
    loss on its training data, chosen afresh at each evaluation (so unseen clients get one too). The global
    model (``global/*``) is the sample-weighted mean of the round's trained models (FedAvg's, for
    reference). Plug-ins: only ``FineTune`` (fine-tunes the deployed cluster model).

    Args:
        k: Number of cluster models (at most ``data.num_clients``).
        restarts: Random initialisations raced in the first round (1: none).
        seed: Seed of the random initialisations (None: the run's seed, ``seed_everything``).
        server_lr: ``eta_s`` (1: the paper's averaging).
    """

    name = "ifca"
    deploys_personal_model = True
    prepares_clients = True
    vectorizable = Vectorizable(unless=_own_data)
    allowed_plugins = ("FineTune",)
    deploys_server_models = True  # the cluster models: not deployable from a Flower node

    def __init__(
        self, k: int = 2, restarts: int = 1, seed: int | None = None, server_lr: float = 1.0
    ) -> None:
        super().__init__(server_lr=server_lr)
        self.k = _check_count(k, "model.strategy.k", "the number of cluster models; e.g. 4")
        self.restarts = _check_count(restarts, "model.strategy.restarts", "1: one random initialisation")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ConfigError(
                f"model.strategy.seed={seed!r} must be an integer >= 0 or null (the run's seed)"
            )
        self.seed = seed
        self.register_buffer("models", torch.zeros(0))
        self.register_buffer("kept", torch.tensor(-1))  # the restart kept (-1: still racing)
        self.register_buffer("assigned", torch.zeros(0, dtype=torch.long))  # per client: last choice, -1
        self._layout: Layout = []
        self._model: list[nn.Module] = []  # not a submodule
        self._resettable = True
        self._metrics: dict[str, float] = {}

    # ------------------------------------------------------------------------------------ setup
    def setup(self, model: nn.Module, num_clients: int) -> None:
        super().setup(model, num_clients)
        self._model = [model]
        self._layout, dtype = layout_of(model)
        seed = self.seed if self.seed is not None else torch.initial_seed()
        draws = []
        for slot in range(self.restarts * self.k):
            fresh = copy.deepcopy(model)
            self._resettable = _reinitialise(fresh, derive_seed(seed, _INIT_STREAM, slot))
            draws.append(as_flat(dict(fresh.state_dict()), self._layout, torch.zeros((), dtype=dtype)))
        device = next(iter(model.parameters())).device
        self.models = torch.stack(draws).to(device)
        self.kept = torch.tensor(0 if self.restarts == 1 else -1, device=device)
        self.assigned = torch.full((num_clients,), -1, dtype=torch.long, device=device)

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        # a checkpoint written before the choices were kept: none known yet (the next rounds record them)
        state_dict.setdefault(prefix + "assigned", self.assigned.clone())
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def check(self, model: nn.Module, spec: RunSpec) -> None:
        super().check(model, spec)
        if self.k > spec.num_clients:
            raise ConfigError(
                f"model.strategy.k={self.k} is larger than data.num_clients={spec.num_clients}: a cluster "
                f"model would have no client; use k <= {spec.num_clients}"
            )
        if not self._resettable:
            raise ConfigError(
                f"model.strategy=IFCA draws its cluster models with the layers' reset_parameters(), which "
                f"{type(model).__name__}'s network has in none of its layers; use a network of torch.nn "
                "layers"
            )

    def slots(self) -> range:
        """The cluster models in play: ``R k`` in the first round of a race of restarts, else ``k``."""
        return range(self.k) if int(self.kept) >= 0 else range(self.restarts * self.k)

    def cluster_weights(self, slot: int) -> dict[str, Tensor]:
        """Cluster model ``slot`` as ``{name: tensor}`` (views of the strategy's buffer)."""
        return as_weights(self.models[slot], self._layout, self._model[0])

    # ---------------------------------------------------------------------------- server -> client
    def message(self, model: nn.Module, client_id: int, round: int) -> Payload:
        """Every cluster model in play, ``{"cluster/<slot>": theta_slot}`` (no ``"weights"``)."""
        return {f"{CLUSTER}{s}": self.cluster_weights(s) for s in self.slots()}

    # --------------------------------------------------------------------------------- client side
    def on_client_start(self, module: nn.Module, ctx: ClientContext) -> None:
        """Score every cluster model received on the client's training data and load the lowest."""
        super().on_client_start(module, ctx)
        if ctx.data is None:
            raise ValueError("IFCA needs the client's data (ctx.data) to choose its cluster")
        slots = sorted(int(g[len(CLUSTER) :]) for g in ctx.message if g.startswith(CLUSTER))
        losses = scores(module, [ctx.message[f"{CLUSTER}{s}"] for s in slots], ctx.data)
        best = slots[lowest_loss(losses)]
        load_tensors(module, ctx.message[f"{CLUSTER}{best}"])
        per_restart = losses.view(-1, self.k).min(dim=1).values
        ctx.scratch["ifca"] = (best, per_restart)

    def upload(self, module: nn.Module, ctx: ClientContext) -> Payload:
        """The trained model and ``{"slot", "client", "group", "losses"}`` (a few numbers)."""
        slot, per_restart = ctx.scratch["ifca"]
        log_client(module, "ifca/cluster", float(slot % self.k))
        payload = super().upload(module, ctx)
        facts = torch.tensor([slot, ctx.client_id, true_group(ctx.data)], dtype=per_restart.dtype)
        payload[META] = {"facts": facts.to(per_restart.device), "losses": per_restart}
        return payload

    def adapt(
        self, module: nn.Module, data: ClientData, state: dict[str, Tensor], local: LocalTraining
    ) -> None:
        """Deploy the cluster model with the lowest loss on the client's training data."""
        candidates = [self.cluster_weights(s) for s in range(self.k)]
        losses = scores(module, candidates, data)
        load_tensors(module, candidates[lowest_loss(losses)])
        super().adapt(module, data, state, local)

    # --------------------------------------------------------------------------------- server side
    def aggregator(self) -> Aggregator:
        """The streaming mean, each upload filed by :meth:`receive` (the client codes uniformly weighted)."""
        return Aggregator(weighting={ASSIGN: "uniform"}, receive=self.receive)

    def receive(self, upload: Payload) -> Payload:
        """A client's upload as the groups whose means the server update reads: ``weights`` (every client),
        ``cluster/<slot>`` (its cluster's clients), ``ifca/loss`` (per restart) and ``ifca/assign`` (its slot
        + 1 and group + 2 at its own index of a vector over the clients: summed, they say who went where)."""
        facts, weights = upload[META]["facts"], upload["weights"]
        slot, cid, group = (int(v) for v in facts.tolist())
        code = torch.zeros(2, self.num_clients, dtype=facts.dtype, device=facts.device)
        code[0, cid], code[1, cid] = slot + 1, group + 2
        return {
            "weights": weights,
            f"{CLUSTER}{slot}": weights,
            LOSS: {"restart": upload[META]["losses"]},
            ASSIGN: {"code": code},
        }

    @torch.no_grad()
    def server_update(self, model: nn.Module, means: Payload, info: RoundInfo) -> None:
        """The global model from the mean of every upload; each cluster model from its clients' mean (module
        docstring); after a race of restarts, the kept set into slots ``0..k-1``; the round's record."""
        super().server_update(model, {"weights": means.get("weights", {})}, info)
        code = torch.round(means[ASSIGN]["code"] * info.weight_totals[ASSIGN]).long().cpu()
        slot_of, group_of = code[0] - 1, code[1] - 2
        for s in self.slots():
            if f"{CLUSTER}{s}" in means:
                target = as_flat(means[f"{CLUSTER}{s}"], self._layout, self.models)
                self.models[s].lerp_(target, self.server_lr)
        losses = means[LOSS]["restart"]
        kept = int(self.kept)
        scored = 0  # the restart the round's choices and losses belong to: after the race, the kept set
        if kept < 0:  # (in slots 0..k-1, the only set sent); in the race, the set kept now
            kept = scored = lowest_loss(losses)
            self.models[: self.k] = self.models[kept * self.k : (kept + 1) * self.k].clone()
            self.kept.fill_(kept)
        clients = [c for c in range(self.num_clients) if slot_of[c] >= 0 and slot_of[c] // self.k == scored]
        found = [int(slot_of[c]) % self.k for c in clients]
        if clients:
            self.assigned[clients] = torch.tensor(found, dtype=torch.long, device=self.assigned.device)
        self._metrics = {
            "ifca/loss": float(losses[scored]),
            **{f"ifca/clients{j}": float(found.count(j)) for j in range(self.k)},
            **agreement([int(group_of[c]) for c in clients], found),
        }
        if self.restarts > 1:
            self._metrics["ifca/restart"] = float(kept)

    def round_metrics(self) -> dict[str, float]:
        return dict(self._metrics)

    def cluster_ids(self) -> dict[int, int]:
        """The cluster each client chose the last time it trained (clients that never trained left out)."""
        return {c: j for c, j in enumerate(self.assigned.tolist()) if j >= 0}

    def extra_repr(self) -> str:
        return f"k={self.k}, restarts={self.restarts}, seed={self.seed}, server_lr={self.server_lr}"


def _reinitialise(module: nn.Module, seed: int) -> bool:
    """A fresh random draw of ``module``'s layers (``reset_parameters()``) from a generator seeded by
    ``seed``, leaving the global RNG as it was; False if no layer has ``reset_parameters``."""
    devices = sorted({p.device for p in module.parameters() if p.device.type == "cuda"}, key=str)
    found = False
    with torch.random.fork_rng(devices=devices, device_type="cuda"):
        torch.manual_seed(seed)
        for layer in module.modules():
            reset = getattr(layer, "reset_parameters", None)
            if callable(reset):
                reset()
                found = True
    return found
