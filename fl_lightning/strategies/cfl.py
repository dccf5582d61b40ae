"""CFL (Sattler, Müller & Samek, IEEE TNNLS 2020): split a cluster when its clients' updates disagree."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import Tensor, nn

from fl_lightning.api import (
    Aggregator,
    ClientContext,
    Entry,
    RoundInfo,
    RunSpec,
    Strategy,
    register_strategy,
    weighted_mean,
)
from fl_lightning.errors import ConfigError, check_number
from fl_lightning.functional.clustering import (
    Layout,
    bipartition,
    pairwise_cosine,
    should_split,
    update_norms,
)
from fl_lightning.functional.tensor import Payload, load_tensors
from fl_lightning.strategies.clustered import (
    agreement,
    as_flat,
    as_weights,
    layout_of,
    log_client,
    true_group,
)

log = logging.getLogger(__name__)

#: Upload group: the client's true group under a client transform (-1: none), for the record only.
META = "cfl"
_RESIZED = ("models", "cluster_of", "splits")


@register_strategy
class CFL(Strategy):
    """Clustered FL, Sattler et al., "Clustered Federated Learning: Model-Agnostic Distributed Multitask
    Optimization Under Privacy Constraints", Alg. 1.

    Every client belongs to one cluster ``c`` (all to cluster 0 at first) and trains from its cluster's model
    ``theta_c`` (its message); the server keeps every upload of the round (the buffered aggregator), forms the
    updates ``Delta_i = w_i - theta_c`` (over the parameters) and, for each cluster, after ``warmup`` rounds,
    splits it when

    .. math:: \\Big\\lVert \\sum_{i \\in c} \\tfrac{n_i}{n_c} \\Delta_i \\Big\\rVert < \\varepsilon_1
        \\quad\\text{and}\\quad \\max_{i \\in c} \\lVert \\Delta_i \\rVert > \\varepsilon_2

    and it has more than two clients: the bi-partition of the cosine similarities ``alpha_ij`` of the
    updates by complete linkage (as the authors' code does,
    :func:`~fl_lightning.functional.clustering.bipartition`); the part without the cluster's first client
    becomes a new cluster, starting from ``theta_c``. Then every cluster takes its clients' sample-weighted
    mean, ``theta_c <- theta_c + eta_s (sum_i n_i/n_c w_i - theta_c)`` (``eta_s`` = ``server_lr``; the
    authors' code averages uniformly). Later rounds test each cluster again: splits recurse. The paper's
    extra guard on the cross-cluster similarity is not applied (nor is it in the authors' code). A split needs
    every client of the cluster in the round (the bi-partition is over all of them; the unseen clients of
    ``data.unseen_clients``, which never train, are not waited for and stay in cluster 0); with partial
    participation a cluster that meets the criterion waits for such a round (logged).

    **Record.** Each split is logged (round, cluster, its two parts); the round metrics hold ``cfl/clusters``,
    ``cfl/splits`` (splits in this round), ``cfl/last_split_round`` (1-based, 0: none yet), the largest mean
    update norm over the clusters ``cfl/mean_norm`` and the largest client update norm ``cfl/max_norm`` (the
    two criteria), and, when a client transform makes groups, ``cluster_ari`` (the adjusted Rand index of the
    round's clients' clusters against their groups; each client uploads its group for this only). Each
    client's cluster is in its round metrics (``z_client/<id>/cfl/cluster``); every client's, after every
    round, in the TensorBoard text ``cluster/assignment``, and the final one in ``clients.csv``
    (:meth:`cluster_ids`).

    **Deployment.** A client's personalised model is its cluster's model (an unseen client's: cluster 0's);
    the global model is the sample-weighted mean of all the round's uploads (before the first split, the
    cluster's model: FedAvg). Plug-ins: ``FineTune`` and ``Attack``.

    Args:
        eps_1: Split only when the cluster's mean update norm is below it (> 0; the authors' code: 0.4).
        eps_2: ... and some client's update norm is above it (> eps_1; the authors' code: 1.6).
        warmup: Rounds before the first split test (the authors' code: 20).
        server_lr: ``eta_s`` (1: averaging).
    """

    name = "cfl"
    deploys_personal_model = True
    vectorizable = True  # the client side is FedAvg's (each client's cluster model is its message)
    allowed_plugins = ("FineTune", "Attack")
    deploys_server_models = True  # the cluster models: not deployable from a Flower node

    def __init__(
        self, eps_1: float = 0.4, eps_2: float = 1.6, warmup: int = 20, server_lr: float = 1.0
    ) -> None:
        super().__init__(server_lr=server_lr)
        check_number(eps_1, "model.strategy.eps_1", low=0, low_open=True, hint="(the authors' code: 0.4)")
        check_number(eps_2, "model.strategy.eps_2", low=0, low_open=True, hint="(the authors' code: 1.6)")
        if eps_1 >= eps_2:
            raise ConfigError(
                f"model.strategy.eps_1={eps_1} must be below model.strategy.eps_2={eps_2}: a split looks for "
                "a small mean update while some client's update stays large (the authors' code: 0.4 and 1.6)"
            )
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ConfigError(
                f"model.strategy.warmup={warmup!r} must be an integer >= 0 (the authors' code: 20)"
            )
        self.eps_1, self.eps_2, self.warmup = float(eps_1), float(eps_2), warmup
        self.register_buffer("models", torch.zeros(0))  # [clusters, D]: theta_c, flat
        self.register_buffer("cluster_of", torch.zeros(0, dtype=torch.long))  # [clients]
        self.register_buffer(
            "splits", torch.zeros(0, 3, dtype=torch.long)
        )  # (round, parent, child) per split
        self._layout: Layout = []
        self._params = torch.zeros(0, dtype=torch.bool)
        self._model: list[nn.Module] = []  # not a submodule
        self._entries: list[Entry] = []
        self._metrics: dict[str, float] = {}
        self._held_out: frozenset[int] = frozenset()  # unseen clients: in cluster 0, never in a round

    # ------------------------------------------------------------------------------------ setup
    def setup(self, model: nn.Module, num_clients: int) -> None:
        super().setup(model, num_clients)
        self._model = [model]
        self._layout, dtype = layout_of(model)
        params = {n for n, _ in model.named_parameters()}
        self._params = torch.cat(
            [torch.full((shape.numel(),), name in params, dtype=torch.bool) for name, shape in self._layout]
        )
        device = next(iter(model.parameters())).device
        start = as_flat(dict(model.state_dict()), self._layout, torch.zeros((), dtype=dtype, device=device))
        self.models = start.unsqueeze(0).clone()
        self.cluster_of = torch.zeros(num_clients, dtype=torch.long, device=device)
        self.splits = torch.zeros(0, 3, dtype=torch.long, device=device)

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        for name in _RESIZED:  # the clusters found so far: resize to the checkpoint's before loading
            saved = state_dict.get(prefix + name)
            if saved is not None:
                current = getattr(self, name)
                setattr(self, name, torch.empty(saved.shape, dtype=current.dtype, device=current.device))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def check(self, model: nn.Module, spec: RunSpec) -> None:
        """Note the clients held out of training (``data.unseen_clients``): a split never waits for them."""
        super().check(model, spec)
        self._held_out = spec.unseen

    @property
    def num_clusters(self) -> int:
        return int(self.models.shape[0])

    def cluster_weights(self, cluster: int) -> dict[str, Tensor]:
        """Cluster ``cluster``'s model as ``{name: tensor}`` (views of the strategy's buffer)."""
        return as_weights(self.models[cluster], self._layout, self._model[0])

    # ---------------------------------------------------------------------------- server -> client
    def message(self, model: nn.Module, client_id: int, round: int) -> Payload:
        """``{"weights": theta_c}`` for the client's cluster ``c``."""
        return {"weights": self.cluster_weights(int(self.cluster_of[client_id]))}

    # --------------------------------------------------------------------------------- client side
    def upload(self, module: nn.Module, ctx: ClientContext) -> Payload:
        """FedAvg's upload and the client's true group (the record's, never the algorithm's)."""
        log_client(module, "cfl/cluster", float(self.cluster_of[ctx.client_id]))
        payload = super().upload(module, ctx)
        like = next(iter(payload["weights"].values()))
        payload[META] = {"group": torch.tensor([float(true_group(ctx.data))], device=like.device)}
        return payload

    def personalize(self, module: nn.Module, client_id: int, state: dict[str, Tensor]) -> None:
        """Deploy the client's cluster model."""
        load_tensors(module, self.cluster_weights(int(self.cluster_of[client_id])))
        super().personalize(module, client_id, state)

    # --------------------------------------------------------------------------------- server side
    def _trainable(self, cluster: int) -> int:
        """The clients of ``cluster`` that can take part in a round (all but the unseen ones)."""
        ids = (self.cluster_of == cluster).nonzero().flatten().tolist()
        return sum(1 for cid in ids if cid not in self._held_out)

    def aggregator(self) -> Aggregator:
        """Every upload kept (the split needs each client's update)."""
        return Aggregator(reduce=self.keep)

    def keep(self, entries: list[Entry]) -> Payload:
        """Keep the round's uploads for :meth:`server_update`; the weighted mean of everything for the global
        model."""
        self._entries = entries
        return weighted_mean(entries)

    @torch.no_grad()
    def server_update(self, model: nn.Module, means: Payload, info: RoundInfo) -> None:
        """The global model from the mean of every upload; the split tests, then each cluster's mean."""
        super().server_update(model, {"weights": means.get("weights", {})}, info)
        mask = self._params.to(self.models.device)
        by_cluster: dict[int, list[tuple[int, Tensor, float]]] = {}
        truth: dict[int, int] = {}
        for cid, upload, weights in self._entries:
            flat = as_flat(upload["weights"], self._layout, self.models)
            by_cluster.setdefault(int(self.cluster_of[cid]), []).append((cid, flat, weights["weights"]))
            truth[cid] = int(upload[META]["group"].item()) if META in upload else -1
        mean_norms, max_norm, split_here = [0.0], 0.0, 0
        for c in sorted(by_cluster):
            members = by_cluster[c]
            w = torch.tensor([m[2] for m in members], device=self.models.device)
            updates = torch.stack([m[1][mask] for m in members]) - self.models[c][mask]
            mean_norm, top = update_norms(updates, w)
            mean_norms.append(mean_norm)
            max_norm = max(max_norm, top)
            if info.round < self.warmup or not should_split(
                mean_norm, top, self.eps_1, self.eps_2, len(members)
            ):
                continue
            if len(members) < self._trainable(c):
                log.info(
                    "CFL: round %d: cluster %d meets the split criterion but not all its clients took part",
                    info.round,
                    c,
                )
                continue
            _, second = bipartition(pairwise_cosine(updates))
            child = self.num_clusters
            self.models = torch.cat([self.models, self.models[c : c + 1].clone()])
            moved = [members[i][0] for i in second]
            self.cluster_of[moved] = child
            row = torch.tensor([[info.round, c, child]], device=self.splits.device)
            self.splits = torch.cat([self.splits, row])
            split_here += 1
            log.info(
                "CFL: round %d: cluster %d split in two, clients %s stay, clients %s form cluster %d "
                "(mean update norm %.4g < eps_1, max %.4g > eps_2)",
                info.round,
                c,
                sorted(m[0] for m in members if m[0] not in moved),
                sorted(moved),
                child,
                mean_norm,
                top,
            )
        for c in range(self.num_clusters):
            members = [
                (cid, flat, n)
                for group in by_cluster.values()
                for cid, flat, n in group
                if self.cluster_of[cid] == c
            ]
            if members:
                total = sum(n for _, _, n in members)
                target = sum(flat * (n / total) for _, flat, n in members)
                self.models[c].lerp_(target, self.server_lr)
        self._entries = []
        clients = sorted(truth)
        last = int(self.splits[-1, 0]) + 1 if self.splits.shape[0] else 0
        self._metrics = {
            "cfl/clusters": float(self.num_clusters),
            "cfl/splits": float(split_here),
            "cfl/last_split_round": float(last),
            "cfl/mean_norm": max(mean_norms),
            "cfl/max_norm": max_norm,
            **agreement([truth[c] for c in clients], [int(self.cluster_of[c]) for c in clients]),
        }

    def round_metrics(self) -> dict[str, float]:
        return dict(self._metrics)

    def cluster_ids(self) -> dict[int, int]:
        """Every client's cluster (all in cluster 0 until the first split; an unseen client's: 0)."""
        return dict(enumerate(self.cluster_of.tolist()))

    def extra_repr(self) -> str:
        return f"eps_1={self.eps_1}, eps_2={self.eps_2}, warmup={self.warmup}, server_lr={self.server_lr}"
