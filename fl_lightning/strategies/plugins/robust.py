"""Byzantine-robust aggregation plug-ins (median, trimmed mean, Krum, norm bounding) and an attack simulation.

The robust plug-ins wrap any strategy and replace the weighted mean of the ``"weights"`` group by a
robust reduction of the client updates ``Delta_k = w_k - w^t`` (``w^t``: the weights the round's
message carried), computed on the server from every upload, which the base's
:class:`~fl_lightning.api.aggregation.Aggregator` (its weighting and receive transform) keeps for the
plug-in's ``reduce``; the aggregate handed to the base's ``server_update`` is
``w^t + robust(Delta_1..Delta_K)``. Other payload groups (control variates, duals)
keep the base's weighted mean. Test a defence with ``model.attack`` (simulated malicious clients, any
strategy) or nest :class:`Attack`, which declares the same attack: ``Median(Attack(FedAvg(), fraction=0.4))``.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from fl_lightning.api import (
    Aggregator,
    Entry,
    Payload,
    SimulatedAttack,
    Strategy,
    StrategyWrapper,
    register_strategy,
    weighted_mean,
)
from fl_lightning.errors import ConfigError, RunError, check_number
from fl_lightning.functional.robust import (
    clip_norms,
    coordinate_median,
    krum,
    stack_flat,
    trimmed_mean,
    unflatten,
)
from fl_lightning.functional.tensor import shared_state
from fl_lightning.strategies.fedavg import FedAvg


class RobustWrapper(StrategyWrapper):
    """Base of the robust plug-ins: subclasses implement :meth:`reduce_updates` on stacked updates.

    ``w^t`` is taken from the weights of the round's messages (recorded by :meth:`message`, no copy:
    the global model is unchanged until the server update), or from the global model given to
    :meth:`setup` on a process that sent no message this round.
    """

    def __init__(self, base: Strategy | None = None) -> None:
        super().__init__(FedAvg() if base is None else base)
        self._model: list[nn.Module] = []  # a list: not registered as a submodule
        self._reference: dict[str, Tensor] | None = None

    def setup(self, model: nn.Module, num_clients: int) -> None:
        super().setup(model, num_clients)
        self._model = [model]

    def aggregator(self) -> Aggregator:
        """The base's aggregator (its weighting and receive transform) keeping every upload for
        :meth:`robust_aggregate`; a new round's messages record ``w^t`` afresh."""
        self._reference = None
        return self.base.aggregator().replace(reduce=self.robust_aggregate)

    def robust_aggregate(self, entries: list[Entry]) -> Payload:
        """``w^t + reduce_updates(Delta_1..Delta_K)`` for the ``"weights"`` group, the weighted mean for the
        others."""
        rest = [(c, {g: ts for g, ts in p.items() if g != "weights"}, w) for c, p, w in entries]
        means = weighted_mean(rest)
        uploads = [p["weights"] for _, p, _ in entries if "weights" in p]
        if uploads:
            names = list(uploads[0])
            if any(set(u) != set(names) for u in uploads):
                raise RunError("robust aggregation needs every client to upload the same weights entries")
            reference = self.reference()
            ref = {n: reference[n] for n in names}
            base = stack_flat([ref], names)[0]
            deltas = stack_flat(uploads, names) - base
            weights = torch.tensor(
                [w["weights"] for _, p, w in entries if "weights" in p], device=deltas.device
            )
            means["weights"] = unflatten(base + self.reduce_updates(deltas, weights), ref)
        return means

    def message(self, model: nn.Module, client_id: int, round: int) -> Payload:
        payload = self.base.message(model, client_id, round)
        if self._reference is None and "weights" in payload:
            self._reference = payload["weights"]
        return payload

    def reference(self) -> dict[str, Tensor]:
        """``w^t``: the weights this round's messages carried."""
        if self._reference is not None:
            return self._reference
        if not self._model:
            raise RunError(f"{type(self).__name__} needs setup() or message() before aggregating")
        return shared_state(self._model[0])

    def reduce_updates(self, deltas: Tensor, weights: Tensor) -> Tensor:
        """The robust aggregate ``(D,)`` of the ``(K, D)`` updates (``weights``: aggregation weights)."""
        raise NotImplementedError


@register_strategy
class Median(RobustWrapper):
    """Coordinate-wise median of the client updates (Yin et al., ICML 2018), unweighted.

    Args:
        base: The wrapped strategy (default FedAvg).
    """

    name = "median"
    vectorizable = True  # server-side reduction only; the clients train as the base

    def reduce_updates(self, deltas: Tensor, weights: Tensor) -> Tensor:
        return coordinate_median(deltas)


@register_strategy
class TrimmedMean(RobustWrapper):
    """Coordinate-wise trimmed mean (Yin et al., ICML 2018): drop ``floor(beta K)`` values each side.

    Args:
        base: The wrapped strategy (default FedAvg).
        beta: Fraction trimmed from each side, in ``[0, 0.5)``.
    """

    name = "trimmed_mean"
    vectorizable = True  # server-side reduction only; the clients train as the base

    def __init__(self, base: Strategy | None = None, beta: float = 0.1) -> None:
        super().__init__(base)
        check_number(beta, "model.strategy.beta", low=0, high=0.5, high_open=True, hint="e.g. 0.1")
        self.beta = beta

    def reduce_updates(self, deltas: Tensor, weights: Tensor) -> Tensor:
        if deltas.shape[0] - 2 * int(self.beta * deltas.shape[0]) < 1:
            raise RunError(f"model.strategy.beta={self.beta} trims every one of {deltas.shape[0]} clients")
        return trimmed_mean(deltas, self.beta)

    def extra_repr(self) -> str:
        return f"beta={self.beta}"


@register_strategy
class Krum(RobustWrapper):
    """Krum / Multi-Krum (Blanchard et al., NeurIPS 2017): the mean of the ``m`` updates with lowest score.

    A score is the sum of squared distances to the ``K - f - 2`` nearest other updates; each round needs
    more than ``f + 2`` clients (the guarantee needs ``K > 2f + 2``).

    Args:
        base: The wrapped strategy (default FedAvg).
        f: Number of Byzantine clients tolerated.
        m: Updates averaged (1: Krum; more: Multi-Krum).
    """

    name = "krum"
    vectorizable = True  # server-side reduction only; the clients train as the base

    def __init__(self, base: Strategy | None = None, f: int = 1, m: int = 1) -> None:
        super().__init__(base)
        check_number(f, "model.strategy.f", low=0, hint="(Byzantine clients tolerated per round)")
        check_number(m, "model.strategy.m", low=1, hint="(1 is Krum, more is Multi-Krum)")
        if int(f) != f or int(m) != m:
            raise ConfigError(f"model.strategy.f={f} and model.strategy.m={m} must be whole numbers")
        self.f, self.m = int(f), int(m)

    def reduce_updates(self, deltas: Tensor, weights: Tensor) -> Tensor:
        k = deltas.shape[0]
        if k <= self.f + 2 or self.m > k:
            raise RunError(
                f"Krum with model.strategy.f={self.f}, m={self.m} needs more than {self.f + 2} and at least "
                f"{self.m} clients per round, got {k}; raise clients_per_round or lower f/m"
            )
        return krum(deltas, self.f, self.m)[0]

    def extra_repr(self) -> str:
        return f"f={self.f}, m={self.m}"


@register_strategy
class NormBounded(RobustWrapper):
    """Norm-bounded averaging (Sun et al., 2019): clip each ``Delta_k`` to norm ``max_norm``, then average.

    Clipping is done on the server (a malicious client would skip its own); the clipped updates keep
    the base's aggregation weights (``n_k`` for FedAvg).

    Args:
        base: The wrapped strategy (default FedAvg).
        max_norm: The bound ``C`` on each client's update norm (over all its weights).
    """

    name = "norm_bounded"
    vectorizable = True  # server-side reduction only; the clients train as the base

    def __init__(self, base: Strategy | None = None, max_norm: float = 1.0) -> None:
        super().__init__(base)
        check_number(max_norm, "model.strategy.max_norm", low=0, low_open=True, hint="e.g. 1.0")
        self.max_norm = max_norm

    def reduce_updates(self, deltas: Tensor, weights: Tensor) -> Tensor:
        w = weights.to(deltas.dtype)
        return (clip_norms(deltas, self.max_norm) * (w / w.sum()).unsqueeze(1)).sum(dim=0)

    def extra_repr(self) -> str:
        return f"max_norm={self.max_norm}"


@register_strategy
class Attack(StrategyWrapper):
    """Attack simulation as a plug-in: a fixed fraction of clients upload manipulated weights.

    Another spelling of ``model.attack`` (which needs no nesting and is the usual way), for a config that
    keeps the attack with the strategy, e.g. ``Median(Attack(FedAvg()))``. The plug-in only declares the
    attack (:attr:`attack`, a :class:`~fl_lightning.api.SimulatedAttack` checked once); the engine finds it
    at setup and applies it where it applies ``model.attack``: to what a malicious client sends, after its
    whole ``process_upload`` chain, wherever the plug-in is nested. The ``round(fraction * num_clients)``
    malicious clients are drawn from the run seed (``seed_everything``); each replaces its update
    ``Delta_k = w_k - w^t`` (``w^t``: the weights it was sent) by ``-scale * Delta_k`` (``"sign_flip"``) or
    ``scale * Delta_k`` (``"scale"``). A run declares at most one attack (``model.attack`` and this plug-in
    together are a one-line error).

    Args:
        base: The wrapped strategy (default FedAvg).
        fraction: Fraction of all clients that are malicious, in ``[0, 1]``.
        kind: ``"sign_flip"`` or ``"scale"``.
        scale: The factor ``s`` (> 0).
    """

    name = "attack"
    vectorizable = True  # no client hooks of its own: the engine applies the attack to the upload

    def __init__(
        self,
        base: Strategy | None = None,
        fraction: float = 0.2,
        kind: Literal["sign_flip", "scale"] = "sign_flip",
        scale: float = 1.0,
    ) -> None:
        super().__init__(FedAvg() if base is None else base)
        self.attack = SimulatedAttack(kind, fraction, scale)
        self.attack.check("model.strategy")

    @property
    def fraction(self) -> float:
        return self.attack.fraction

    @property
    def kind(self) -> str:
        return self.attack.kind

    @property
    def scale(self) -> float:
        return self.attack.scale

    def malicious(self, seed: int) -> frozenset[int]:
        """The malicious client ids for run seed ``seed`` (after :meth:`setup`)."""
        return self.attack.malicious(self.num_clients, seed)

    def extra_repr(self) -> str:
        return f"fraction={self.fraction}, kind={self.kind}, scale={self.scale}"
