"""FedPAC (Xu, Tong & Huang, ICLR 2023): feature alignment to global prototypes, classifier collaboration."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from fl_lightning.api import (
    Aggregator,
    ClientContext,
    Entry,
    RoundInfo,
    RunSpec,
    register_strategy,
    weighted_mean,
)
from fl_lightning.errors import ConfigError, check_number
from fl_lightning.functional.prototypes import (
    alignment_loss,
    class_statistics,
    combination_weights,
    combine_heads,
    global_prototypes,
    head_statistics,
    local_prototypes,
)
from fl_lightning.functional.representation import FeatureTap, features_of, frozen, linear_layer_names
from fl_lightning.functional.tensor import Payload, load_tensors
from fl_lightning.strategies.fedrep import FedRep, head_steps

_TAP = "fedpac/tap"
_STATS = "fedpac/stats"
#: Payload groups: the client's head and statistics (up), the global prototypes and a combined head (down).
HEAD, STATS, PROTOS = "fedpac_head", "fedpac_stats", "fedpac_protos"


@register_strategy
class FedPAC(FedRep):
    """FedPAC, Xu, Tong & Huang, "Personalized Federated Learning with Feature Alignment and Classifier
    Collaboration" (ICLR 2023), Alg. 1.

    The network is a shared feature extractor ``f_theta`` (body) and a personal linear head ``phi_i``,
    split as in FedPer/FedRep. A sampled client ``i`` receives ``theta^t`` and the global class
    prototypes ``c^t``, then

    1. computes, with ``theta^t``, its statistics ``(h_i, V_i)`` (class-weighted feature means and the
       variance term, :func:`~fl_lightning.functional.prototypes.head_statistics`);
    2. trains its head for ``head_epochs`` with the body frozen, then the body for ``body_epochs`` with the
       head frozen, on the cross-entropy plus the feature-alignment term (Sec. 4.2)

       .. math:: \\min_\\theta \\; \\frac1{n_i}\\sum_l \\ell(\\phi_i; f_\\theta(x_l), y_l)
                 + \\lambda\\, \\frac1{n_i d}\\sum_l \\lVert f_\\theta(x_l) - c_{y_l} \\rVert^2

    3. uploads ``theta_i``, its head ``phi_i``, its local prototypes ``c_hat_{i,k}`` (computed with the
       trained body) and class counts, and ``(h_i, V_i)``.

    The server averages the body (``theta^{t+1} = sum_i n_i/n theta_i``), forms the global prototypes
    ``c_k = sum_i n_{i,k} c_hat_{i,k} / sum_i n_{i,k}``, and for every client ``i`` of the round solves
    the quadratic program of Sec. 4.3 (eq. 10) over the round's clients,

    .. math:: \\alpha_i^* = \\arg\\min_{\\alpha_i \\ge 0,\\ \\sum_j \\alpha_{ij} = 1}
              \\sum_j \\alpha_{ij}^2 V_j + \\Big\\lVert h_i - \\sum_j \\alpha_{ij} h_j \\Big\\rVert^2,
              \\qquad \\hat\\phi_i = \\sum_j \\alpha^*_{ij} \\phi_j ,

    (:func:`~fl_lightning.functional.prototypes.simplex_qp`, accelerated projected gradient) and the
    combined head ``phi_hat_i`` becomes client ``i``'s head: the server keeps it (``combined``, one head
    per client, ``num_clients x |phi|`` floats) and sends it with the client's next message; a client's
    deployed model is ``(theta^t, phi_hat_i)`` (its own head if it never trained).

    Choices where the paper leaves room (following the authors' code): in round 0 there are no global
    prototypes and no alignment term; samples of a class with no global prototype get none either (the
    code pulls them to the client's own prototype from before training); the head phase comes first
    and both phases use the client optimizer (Chen & Qiu, App. G: SGD lr 0.01 momentum 0.9 for every
    method; the authors' code trains the head at lr 0.1). The statistics and prototypes are computed by
    two extra forward passes over the local training split in eval mode without gradient.

    Args:
        head: The personal layers: a count of last ``nn.Linear`` layers (1: the classifier) or module
            names; the features ``f_theta(x)`` are the input of the head's first layer.
        lam: Weight ``lambda >= 0`` of the alignment term (authors' code: 1; 0 switches it off).
        head_epochs: Share of the head phase in the round's local steps (FedPAC: 1 epoch).
        body_epochs: Share of the body phase (FedPAC: E, the local epochs; 10 in Chen & Qiu's Table 2
            setup): set ``model.local_epochs`` to ``head_epochs + body_epochs``.
        collaborate: Combine the heads by the quadratic program (False: every client keeps its own head,
            FedPAC without classifier collaboration).
        server_lr: Server learning rate on the pseudo-gradient of the body.
    """

    name = "fedpac"
    deploys_personal_model = True

    def __init__(
        self,
        head: int | Sequence[str] = 1,
        lam: float = 1.0,
        head_epochs: int = 1,
        body_epochs: int = 10,
        collaborate: bool = True,
        server_lr: float = 1.0,
    ) -> None:
        super().__init__(head=head, head_epochs=head_epochs, body_epochs=body_epochs, server_lr=server_lr)
        check_number(lam, "model.strategy.lam", low=0, hint="(FedPAC's alignment weight; its code uses 1)")
        self.lam = lam
        self.collaborate = collaborate
        self._head_layer = ""
        self._head_names: list[str] = []
        #: The last round's combination weights: ``(client ids, A)`` with ``A[i]`` the weights of client
        #: ``ids[i]`` over the heads of ``ids`` (for inspection and tests).
        self.last_weights: tuple[list[int], Tensor] | None = None

    # ------------------------------------------------------------------------------------- setup
    def setup(self, model: nn.Module, num_clients: int) -> None:
        super().setup(model, num_clients)
        first = linear_layer_names(model)[-self.head] if isinstance(self.head, int) else self.head[0]
        layer = model.get_submodule(first)
        if not isinstance(layer, nn.Linear):
            raise ConfigError(
                f"model.strategy.head: FedPAC's head must start with an nn.Linear layer (its input is the "
                f"feature f(x)); {first!r} is a {type(layer).__name__}"
            )
        self._head_layer = first
        self._head_names = sorted(self.personal_names(model))
        state = model.state_dict()
        size = sum(state[n].numel() for n in self._head_names)
        num_classes = linear_layer_names(model)[-1]
        classes = model.get_submodule(num_classes).out_features
        self.register_buffer("prototypes", torch.zeros(classes, layer.in_features))
        self.register_buffer("proto_counts", torch.zeros(classes))
        self.register_buffer("combined", torch.zeros(num_clients, size))
        self.register_buffer("has_combined", torch.zeros(num_clients, dtype=torch.bool))

    def aggregator(self) -> Aggregator:
        """Every upload kept for :meth:`round_aggregate`; the bodies weighted by sample count, the rest
        uniformly."""
        return Aggregator(weighting={"weights": "samples", "*": "uniform"}, reduce=self.round_aggregate)

    # ---------------------------------------------------------------------------- server -> client
    def message(self, model: nn.Module, client_id: int, round: int) -> Payload:
        msg = super().message(model, client_id, round)
        msg[PROTOS] = {"prototypes": self.prototypes, "counts": self.proto_counts}
        if bool(self.has_combined[client_id]):
            msg[HEAD] = self._unflatten(self.combined[client_id], model)
        return msg

    # ------------------------------------------------------------------------------- client side
    def check(self, model: nn.Module, spec: RunSpec) -> None:
        super().check(model, spec)
        if spec.task.multilabel or not spec.integer_labels:
            raise ConfigError(
                "model.strategy=FedPAC needs single-label classification data (integer class labels: its "
                "class prototypes have one class per sample); choose another strategy for this data"
            )

    def on_client_start(self, module: nn.Module, ctx: ClientContext) -> None:
        super().on_client_start(module, ctx)
        if HEAD in ctx.message:  # the head the server combined for this client after its last round
            load_tensors(module, ctx.message[HEAD])
        layer = module.get_submodule(self._head_layer)
        ctx.scratch[_STATS] = head_statistics(*self._statistics(module, ctx))  # with theta^t (step 1)
        protos = ctx.message.get(PROTOS, {})
        if self.lam != 0 and protos and bool((protos["counts"] > 0).any()):
            FeatureTap(module, ctx.scratch, _TAP, layer=layer)

    def local_loss(self, module: nn.Module, ctx: ClientContext, batch: Any, outputs: Tensor) -> Tensor | None:
        tap: FeatureTap | None = ctx.scratch.get(_TAP)
        if tap is None or ctx.step < head_steps(ctx.num_steps, self.head_epochs, self.body_epochs):
            return None  # no global prototypes yet, or the head phase (the body is frozen)
        x, y = batch
        z = tap.features_for(outputs)
        if z is None:
            z, _ = features_of(module, x, layer=module.get_submodule(self._head_layer))
        protos = ctx.message[PROTOS]
        present = protos["counts"] > 0
        return self.lam * alignment_loss(
            z.float(), y, protos["prototypes"].to(z.device), present.to(z.device)
        )

    def upload(self, module: nn.Module, ctx: ClientContext) -> Payload:
        FeatureTap.release(ctx.scratch, _TAP)
        payload = super().upload(module, ctx)
        sums, counts, _ = self._statistics(module, ctx)  # prototypes with the trained body (step 3)
        h, v = ctx.scratch[_STATS]
        state = module.state_dict()
        payload[HEAD] = {n: state[n].detach() for n in self._head_names}
        payload[STATS] = {"prototypes": local_prototypes(sums, counts), "counts": counts, "h": h, "v": v}
        return payload

    def _statistics(self, module: nn.Module, ctx: ClientContext) -> tuple[Tensor, Tensor, Tensor]:
        """Per-class feature sums, counts and squared norms over the local training split (eval mode)."""
        data = ctx.data
        if data is None:
            raise RuntimeError("FedPAC needs the client's data in its context (ctx.data)")
        layer = module.get_submodule(self._head_layer)
        classes = self.prototypes.shape[0]
        total: list[Tensor] | None = None
        with torch.no_grad(), frozen(module):
            for start in range(0, data.num_samples, 512):
                idx = data.train_idx[start : start + 512].to(data.x.device)
                x, y = data.take(idx)
                z, _ = features_of(module, x, layer=layer)
                stats = class_statistics(z.float(), y.to(z.device), classes)
                total = list(stats) if total is None else [a + b for a, b in zip(total, stats)]
        assert total is not None
        return total[0], total[1], total[2]

    # ------------------------------------------------------------------------------- server side
    @torch.no_grad()
    def server_update(self, model: nn.Module, means: Payload, info: RoundInfo) -> None:
        super().server_update(model, means, info)
        protos = means.get(PROTOS)
        if protos is not None:
            self.prototypes.copy_(protos["prototypes"])
            self.proto_counts.copy_(protos["counts"])
        combined = means.get("fedpac_combined", {})
        for cid, head in combined.items():
            self.combined[int(cid)] = head.to(self.combined)
            self.has_combined[int(cid)] = True

    def personalize(self, module: nn.Module, client_id: int, state: dict[str, Tensor]) -> None:
        super().personalize(module, client_id, state)
        if bool(self.has_combined[client_id]):
            load_tensors(module, self._unflatten(self.combined[client_id], module))

    def _unflatten(self, flat: Tensor, model: nn.Module) -> dict[str, Tensor]:
        state = model.state_dict()
        out: dict[str, Tensor] = {}
        offset = 0
        for n in self._head_names:
            t = state[n]
            out[n] = flat[offset : offset + t.numel()].view_as(t).to(t.dtype)
            offset += t.numel()
        return out

    def round_aggregate(self, entries: list[Entry]) -> Payload:
        """The round's aggregate: the weighted mean of the bodies, the global prototypes, the combined
        heads."""
        means = weighted_mean([(c, {"weights": p["weights"]}, w) for c, p, w in entries if "weights" in p])
        ids = [c for c, p, _ in entries if STATS in p]
        if not ids:
            return means
        stats = [p[STATS] for _, p, _ in entries if STATS in p]
        protos, total = global_prototypes(
            torch.stack([s["prototypes"] for s in stats]), torch.stack([s["counts"] for s in stats])
        )
        means[PROTOS] = {"prototypes": protos, "counts": total}
        if not self.collaborate:
            return means
        heads = torch.stack(
            [
                torch.cat([p[HEAD][n].reshape(-1).float() for n in self._head_names])
                for _, p, _ in entries
                if STATS in p
            ]
        )
        weights = combination_weights(
            torch.stack([s["h"] for s in stats]), torch.stack([s["v"].reshape(()) for s in stats])
        )
        self.last_weights = (ids, weights)
        means["fedpac_combined"] = {str(c): head for c, head in zip(ids, combine_heads(weights, heads))}
        return means

    def extra_repr(self) -> str:
        return (
            f"head={self.head}, lam={self.lam}, head_epochs={self.head_epochs}, "
            f"body_epochs={self.body_epochs}, collaborate={self.collaborate}, server_lr={self.server_lr}"
        )
