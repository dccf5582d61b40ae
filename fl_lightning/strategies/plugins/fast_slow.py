"""The fast/slow communication protocol (Chen & Qiu, ICML 2025, Sec. 4.2, App. F, Algorithm 2)."""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from fl_lightning.api import (
    ClientContext,
    RoundInfo,
    Strategy,
    StrategyWrapper,
    Vectorizable,
    register_strategy,
)
from fl_lightning.errors import ConfigError
from fl_lightning.functional.tensor import Payload, load_tensors
from fl_lightning.strategies.fedavg import FedAvg

log = logging.getLogger(__name__)

#: Prefix of a client's cached copy of the slow entries in its state.
SLOW_CACHE = "slow_cache/"


def matches(name: str, patterns: Sequence[str]) -> bool:
    """True when a glob pattern matches the dotted ``name`` or its last component (``coefficients``)."""
    leaf = name.rsplit(".", 1)[-1]
    return any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(leaf, p) for p in patterns)


@register_strategy
class FastSlow(StrategyWrapper):
    """Slow entries (atom coefficients) are exchanged every ``period = 1/beta`` rounds, the rest every round.

    Algorithm 2 (App. F, eq. 7): clients train every parameter in every round; in a sync round
    (``t % period == 0``, i.e. ``beta t`` integer: t = 0, 1/beta, 2/beta, ...) they upload everything and
    the server aggregates everything; in the other rounds they do **not** upload the slow entries (in
    any payload group of the base strategy) and the server keeps them::

        alpha^{t+1} = sum_k p_k alpha_k^{t+1}   if beta t in N   else   alpha^t
        D^{t+1}     = sum_k p_k D_k^{t+1},      theta_h^{t+1} = sum_k p_k theta_h,k^{t+1}

    The base strategy's server update runs on what was uploaded; slow parameters get no pseudo-gradient
    in non-sync rounds (the server optimizer skips them) and are restored bit-identically after the step.
    The paper pairs the protocol with FedAvg; under a stateful base (SCAFFOLD, FedDyn, FedDC) a client's
    own state for the slow entries (``c_i``, ``lambda_i``, ``h_i``) still moves every round while the
    server's moves only in sync rounds, since the uploads that would update it are not sent.

    Downlink: Algorithm 2 sends ``alpha^t`` every round; with ``cache=True`` a client keeps the slow
    entries it last received in its state and the server sends them only when they changed since
    (server-side record ``held`` of the version each client holds), as the paper's "whole models every
    1/beta rounds" accounting assumes. The saving per round is the slow entries' bytes, so the total
    relative to Algorithm 1 is ``[beta (slow + fast) + (1 - beta) fast] / (slow + fast)``
    (:func:`~fl_lightning.functional.decomposition.fast_slow_ratio`); it approaches ``beta`` only when the
    coefficients dominate the model. For the paper's LeNets the fully connected head dominates and the
    ratio stays near 1 (about 0.94 for CIFAR-100 with ``beta = 1/5``, spec §7.4). With ``fast: [atoms]``
    (Sec. 6.4: atoms every round, whole models every ``1/beta`` rounds) everything else is slow and the
    ratio is close to ``beta``.

    Args:
        base: The strategy whose uploads and server update are thinned (default FedAvg).
        period: ``1/beta``: rounds between two exchanges of the slow entries (paper: 2, 5, 10); 1 is the
            base strategy unchanged.
        slow: Glob patterns of the slow entries, matched against the full state name or its last
            component (default: every decomposed layer's ``coefficients``).
        fast: Glob patterns of the entries exchanged every round; when given, every other entry is
            slow and ``slow`` is ignored. ``[atoms]`` is the reading of Sec. 6.4 ("communicates filter
            atoms every round but transmits whole models every 2nd, 5th, or 10th round").
        cache: Let clients cache the slow entries so the server sends them down only when changed.
    """

    name = "fast_slow"
    prepares_clients = True
    #: Only the upload is thinned; unless clients cache the slow entries (their messages and cached state
    #: then differ per client).
    vectorizable = Vectorizable(
        unless=lambda strategy, module: (
            "FastSlow's slow-entry cache gives the clients different messages "
            "(model.strategy.cache=false vectorises)"
            if strategy.cache and strategy._slow
            else None
        )
    )

    def __init__(
        self,
        base: Strategy | None = None,
        period: int = 5,
        slow: Sequence[str] = ("coefficients",),
        fast: Sequence[str] | None = None,
        cache: bool = True,
    ) -> None:
        super().__init__(FedAvg() if base is None else base)
        if period < 1:
            raise ConfigError(
                f"model.strategy.period={period} must be >= 1 (1/beta: 5 for beta=1/5; 1 syncs every round)"
            )
        if not slow and fast is None:
            raise ConfigError("model.strategy.slow is empty; name the slow entries, e.g. [coefficients]")
        self.period = period
        self.slow = list(slow)
        self.fast = None if fast is None else list(fast)
        self.cache = cache
        self._slow: list[str] = []
        self._kept: dict[str, Tensor] | None = None

    def is_sync(self, round: int) -> bool:
        """Whether round ``round`` exchanges the slow entries (``beta * round`` is an integer)."""
        return round % self.period == 0

    def version(self, round: int) -> int:
        """How many aggregations of the slow entries happened before ``round``: ``ceil(round / period)``."""
        return -(-round // self.period)

    # ------------------------------------------------------------------------------------- setup
    def setup(self, model: nn.Module, num_clients: int) -> None:
        super().setup(model, num_clients)
        personal = self.personal_names(model)
        shared = [n for n, t in model.state_dict().items() if t.is_floating_point() and n not in personal]
        if self.fast is not None:
            self._slow = [n for n in shared if not matches(n, self.fast)]
        else:
            self._slow = [n for n in shared if matches(n, self.slow)]
        if not self._slow:
            log.warning(
                "FastSlow: no model entry is slow (model.strategy.slow=%s, fast=%s); every round syncs "
                "everything (wrap model.client.init_args.net in fl_lightning.models.Decomposed)",
                self.slow,
                self.fast,
            )
        self.register_buffer("held", torch.full((num_clients,), -1, dtype=torch.long))

    # ---------------------------------------------------------------------------- server -> client
    def message(self, model: nn.Module, client_id: int, round: int) -> Payload:
        msg = super().message(model, client_id, round)
        if self.cache and self._slow and int(self.held[client_id]) == self.version(round):
            skip = set(self._slow)
            msg = {**msg, "weights": {n: t for n, t in msg.get("weights", {}).items() if n not in skip}}
        return msg

    # ------------------------------------------------------------------------------- client side
    def on_client_start(self, module: nn.Module, ctx: ClientContext) -> None:
        if self.cache and self._slow:
            weights = ctx.message.get("weights", {})
            missing = [n for n in self._slow if n not in weights]
            if missing:
                if any(SLOW_CACHE + n not in ctx.state for n in missing):
                    raise RuntimeError(
                        f"FastSlow: client {ctx.client_id} was sent no slow entries and has none cached"
                    )
                cached = {n: ctx.state[SLOW_CACHE + n] for n in missing}
                load_tensors(module, cached)
                ctx.message = {**ctx.message, "weights": {**weights, **cached}}  # the full global model
            else:
                ctx.state.update({SLOW_CACHE + n: weights[n].detach().clone() for n in self._slow})
        super().on_client_start(module, ctx)

    def upload(self, module: nn.Module, ctx: ClientContext) -> Payload:
        up = super().upload(module, ctx)
        if self.is_sync(ctx.round) or not self._slow:
            return up
        skip = set(self._slow)
        return {group: {n: t for n, t in tensors.items() if n not in skip} for group, tensors in up.items()}

    # ------------------------------------------------------------------------------- server side
    @torch.no_grad()
    def server_update(self, model: nn.Module, means: Payload, info: RoundInfo) -> None:
        if self.is_sync(info.round) or not self._slow:
            super().server_update(model, means, info)
            return
        state = model.state_dict()
        self._kept = {n: state[n].detach().clone() for n in self._slow}
        super().server_update(model, means, info)
        params = dict(model.named_parameters())
        for n in self._slow:
            if n in params:
                params[n].grad = None

    def on_after_server_step(self, model: nn.Module, means: Payload, info: RoundInfo) -> None:
        super().on_after_server_step(model, means, info)
        if self._kept is not None:
            load_tensors(model, self._kept)
            self._kept = None
        if info.aggregated:
            self.held[torch.tensor(info.aggregated, device=self.held.device)] = self.version(info.round)

    def extra_repr(self) -> str:
        which = f"fast={self.fast}" if self.fast is not None else f"slow={self.slow}"
        return f"period={self.period}, {which}, cache={self.cache}"
