"""Client-level differential privacy (DP-FedAvg) as a plug-in to any strategy, with Opacus accounting.

``DP(base)`` clips each client's update to a global L2 norm ``C`` on the client, averages the clipped
uploads with uniform weights over a fixed denominator (the clients sampled in the round) and adds
Gaussian noise to the aggregate on the server (McMahan et al., ICLR 2018, Alg. 1); ``C`` is fixed or
adapted towards a quantile of the update norms (Andrew et al., NeurIPS 2021, Alg. 1). The privacy
spent is computed after every round by an Opacus accountant and logged as ``privacy/epsilon``; with
``target_epsilon`` the run ends before a round that would exceed it. Math:
:mod:`fl_lightning.functional.privacy`.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import torch
from torch import nn

from fl_lightning.api import (
    Aggregator,
    ClientContext,
    Payload,
    RoundInfo,
    Strategy,
    StrategyWrapper,
    register_strategy,
)
from fl_lightning.errors import ConfigError, RunError, check_number
from fl_lightning.functional.privacy import (
    ACCOUNTANTS,
    History,
    add_step,
    clip_update,
    default_delta,
    epsilon_spent,
    make_accountant,
    noised_fraction,
    noised_mean_update,
    update_clip_norm,
    update_noise_multiplier,
)
from fl_lightning.functional.tensor import derive_seed, shared_state
from fl_lightning.strategies.fedavg import FedAvg

log = logging.getLogger(__name__)

_NOISE_STREAM = 0xD9  # seed stream of the server's DP noise: (seed, stream, round)
GROUP = "dp"  # payload group: the clip norm sent down, the unclipped indicator b_k sent up


@register_strategy
class DP(StrategyWrapper):
    """Client-level DP-FedAvg around any strategy (McMahan et al., 2018; Andrew et al., 2021).

    Per round ``t`` with ``n`` sampled clients out of ``m`` and weights ``x = w^t``:

    1. the message carries ``C``; client ``k`` uploads ``x + Delta_k min(1, C / ||Delta_k||)`` with
       ``Delta_k = y_k - x`` over every uploaded weight (clipped on the client, after the base's
       :meth:`process_upload`), and with adaptive clipping ``b_k = 1[||Delta_k|| <= C]``;
    2. the server averages the uploads uniformly (whatever the base's weighting of ``"weights"``) and
       releases ``x + (sum_k clip(Delta_k) + N(0, (z_Delta C)^2 I)) / n``, i.e. noise of standard
       deviation ``z_Delta C / n`` on the mean, once, after the processes' all-reduce, from a generator
       seeded by ``(seed, round)`` (the same on every process and on a resumed run); the base's
       :meth:`process_aggregate` and :meth:`server_update` then see the noised mean;
    3. adaptive clipping: ``b~ = 1/2 + (sum_k (b_k - 1/2) + N(0, sigma_b^2)) / n`` (the indicators
       centred so that one client moves the sum by at most 1/2, the sensitivity Thm. 1 assumes; with
       every sampled client reporting, ``(sum_k b_k + N(0, sigma_b^2)) / n``) and
       ``C <- C exp(-clip_lr (b~ - target_quantile))``; the update noise uses
       ``z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2)`` so that the round costs one Gaussian mechanism with
       multiplier ``z`` (Andrew et al., Thm. 1). Fixed clipping: ``z_Delta = z``;
    4. the accountant takes one step of a sampled Gaussian mechanism with noise multiplier ``z`` and
       sampling rate ``q = n / m`` and reports ``epsilon`` at ``delta`` (``privacy/epsilon``).

    The guarantee is client-level, for the ``"weights"`` group: other groups a base uploads
    (SCAFFOLD's control variates, FedDyn's ...) are averaged as the base says, without clipping or
    noise, and a warning names them. Opacus's accountants assume Poisson sampling with rate ``q``;
    the loop samples exactly ``n`` clients, the usual approximation (as in both papers). Robust
    (buffered) aggregators are refused: the noise is calibrated to the mean.

    Args:
        base: The wrapped strategy (default FedAvg).
        noise_multiplier: ``z``, the noise standard deviation on the sum of updates in units of ``C``
            (``>= 0``; 0: clipping only, no privacy, no accounting).
        clip_norm: ``C``, the bound on each client's update norm (with adaptive clipping, its initial
            value).
        clipping: ``"fixed"`` or ``"adaptive"`` (Andrew et al., 2021).
        target_quantile: ``gamma``, the fraction of updates that adaptive clipping leaves unclipped
            (Andrew et al. recommend 0.5, the median norm).
        clip_lr: ``eta_C``, the step of the geometric update of ``C`` (recommended 0.2).
        clipped_count_stddev: ``sigma_b``, the noise on the count of unclipped updates (default: the
            clients per round / 20, as recommended); must exceed ``noise_multiplier / 2``.
        accountant: ``"rdp"`` (Rényi DP; Mironov et al.) or ``"prv"`` (privacy random variables;
            Gopi et al., tighter), Opacus's accountants.
        delta: ``delta`` of the reported ``(epsilon, delta)``, in (0, 1); default ``1 / m^1.1`` for
            ``m`` clients (below ``1/m``).
        target_epsilon: A privacy budget: the run ends, with a message, before a round whose
            ``epsilon`` would exceed it (None: no budget).
    """

    name = "dp"
    vectorizable = True  # clipping in process_upload (per client), noise on the aggregate

    def __init__(
        self,
        base: Strategy | None = None,
        noise_multiplier: float = 1.0,
        clip_norm: float = 1.0,
        clipping: Literal["fixed", "adaptive"] = "fixed",
        target_quantile: float = 0.5,
        clip_lr: float = 0.2,
        clipped_count_stddev: float | None = None,
        accountant: Literal["rdp", "prv"] = "rdp",
        delta: float | None = None,
        target_epsilon: float | None = None,
    ) -> None:
        super().__init__(FedAvg() if base is None else base)
        check_number(
            noise_multiplier, "model.strategy.noise_multiplier", low=0, hint="(z; e.g. 1.0, or 0 for none)"
        )
        check_number(clip_norm, "model.strategy.clip_norm", low=0, low_open=True, hint="e.g. 1.0")
        if clipping not in ("fixed", "adaptive"):
            raise ConfigError(f"model.strategy.clipping={clipping!r} must be 'fixed' or 'adaptive'")
        check_number(target_quantile, "model.strategy.target_quantile", low=0, high=1, hint="e.g. 0.5")
        check_number(clip_lr, "model.strategy.clip_lr", low=0, low_open=True, hint="e.g. 0.2")
        if clipped_count_stddev is not None:  # only adaptive clipping uses it; there it must exceed z / 2
            check_number(
                clipped_count_stddev,
                "model.strategy.clipped_count_stddev",
                low=noise_multiplier / 2 if clipping == "adaptive" else 0,
                low_open=clipping == "adaptive",
                hint="(must exceed noise_multiplier / 2; or null: clients per round / 20)",
            )
        if accountant not in ACCOUNTANTS:
            raise ConfigError(
                f"model.strategy.accountant={accountant!r} must be one of {', '.join(map(repr, ACCOUNTANTS))}"
            )
        if delta is not None:
            check_number(
                delta, "model.strategy.delta", low=0, high=1, low_open=True, high_open=True, hint="e.g. 1e-5"
            )
        if target_epsilon is not None:
            check_number(target_epsilon, "model.strategy.target_epsilon", low=0, low_open=True, hint="e.g. 8")
            if noise_multiplier == 0:
                raise ConfigError(
                    "model.strategy.target_epsilon needs model.strategy.noise_multiplier > 0 "
                    "(without noise epsilon is infinite)"
                )
        if noise_multiplier > 0:
            make_accountant(accountant, [])  # Opacus present? else one line: pip install fl_lightning[dp]
        self.noise_multiplier = float(noise_multiplier)
        self.clip_norm = float(clip_norm)
        self.clipping = clipping
        self.target_quantile = float(target_quantile)
        self.clip_lr = float(clip_lr)
        self.clipped_count_stddev = clipped_count_stddev
        self.accountant = accountant
        self.delta = delta
        self.target_epsilon = target_epsilon
        self._model: list[nn.Module] = []  # a list: not registered as a submodule
        self._reset()

    def _reset(self) -> None:
        # Server state, checkpointed through get_extra_state (plain Python values: exact, dtype-proof)
        self.current_clip = self.clip_norm
        self.history: History = []
        # Per-round facts, identical on every process (select_clients runs everywhere)
        self._seed = 0
        self._count = 0
        self._metrics: dict[str, float] = {}
        self._warned: set[str] = set()
        self._epsilons: dict[tuple, float] = {}

    # ------------------------------------------------------------------------------------ state
    def setup(self, model: nn.Module, num_clients: int) -> None:
        super().setup(model, num_clients)
        if self.base.aggregator().buffered:
            raise ConfigError(
                f"model.strategy: DP cannot wrap {type(self.base).__name__}, whose robust aggregate is not "
                "the mean its noise is calibrated for; wrap a mean-aggregating strategy (e.g. FedAvg)"
            )
        self._model = [model]
        self._reset()

    def get_extra_state(self) -> dict[str, Any]:
        return {"clip_norm": self.current_clip, "history": [list(h) for h in self.history]}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        self.current_clip = float(state["clip_norm"])
        self.history = [(float(z), float(q), int(s)) for z, q, s in state["history"]]
        self._metrics = {}

    @property
    def delta_value(self) -> float:
        """``delta``: the configured value, else ``1 / m^1.1``."""
        return self.delta if self.delta is not None else default_delta(max(self.num_clients, 2))

    def count_stddev(self, count: int) -> float:
        """``sigma_b``: the configured value, else ``count / 20`` (Andrew et al.'s recommendation)."""
        return self.clipped_count_stddev if self.clipped_count_stddev is not None else count / 20

    def update_noise_multiplier(self, count: int) -> float:
        """``z_Delta``: ``z`` for fixed clipping; Andrew et al.'s split of ``z`` for adaptive clipping."""
        if self.clipping == "fixed":
            return self.noise_multiplier
        sigma_b = self.count_stddev(count)
        try:
            return update_noise_multiplier(self.noise_multiplier, sigma_b)
        except ValueError as err:
            raise RunError(
                f"model.strategy.clipped_count_stddev: {err} (with {count} clients per round the default is "
                f"{count}/20); raise model.strategy.clipped_count_stddev or clients per round"
            ) from err

    def epsilon(self, extra_rounds: int = 0) -> float:
        """``epsilon`` at :attr:`delta_value` after the rounds accounted (plus ``extra_rounds`` more)."""
        history = self.history
        if extra_rounds:
            history = add_step(history, self.noise_multiplier, self._rate(), extra_rounds)
        key = (tuple(history), self.delta_value)
        if key not in self._epsilons:  # the budget check computes next round's value one round early
            if len(self._epsilons) >= 4:
                self._epsilons.clear()
            self._epsilons[key] = epsilon_spent(history, self.delta_value, self.accountant)
        return self._epsilons[key]

    def _rate(self) -> float:
        return self._count / max(self.num_clients, 1)

    # ----------------------------------------------------------------------------------- hooks
    def select_clients(self, num_clients: int, count: int, round: int, seed: int) -> list[int]:
        self._seed, self._count = int(seed), int(count)
        return self.base.select_clients(num_clients, count, round, seed)

    def aggregator(self) -> Aggregator:
        """The base's aggregator with the weights and the unclipped indicators averaged uniformly."""
        return self.base.aggregator().reweighted({"weights": "uniform", GROUP: "uniform"})

    def message(self, model: nn.Module, client_id: int, round: int) -> Payload:
        payload = self.base.message(model, client_id, round)
        return {**payload, GROUP: {"clip_norm": torch.tensor(self.current_clip, dtype=torch.float32)}}

    def process_upload(self, upload: Payload, ctx: ClientContext) -> Payload:
        upload = self.base.process_upload(upload, ctx)
        if not upload.get("weights"):
            return upload
        sent = ctx.message.get("weights", {})
        names = list(upload["weights"])
        unsent = [n for n in names if n not in sent]
        if unsent:  # an update needs the weights it started from, or its norm is unbounded
            raise RunError(
                f"DP: {type(self.base).__name__} uploads weights the message did not carry ({unsent[:3]}); "
                "DP clips the update against the sent weights"
            )
        clip = float(ctx.message[GROUP]["clip_norm"]) if GROUP in ctx.message else self.current_clip
        clipped, norm = clip_update([upload["weights"][n] for n in names], [sent[n] for n in names], clip)
        out = {**upload, "weights": {**upload["weights"], **dict(zip(names, clipped))}}
        if self.clipping == "adaptive":
            out[GROUP] = {"unclipped": (norm <= clip).to(torch.float32).reshape(())}
        return out

    @torch.no_grad()
    def process_aggregate(self, means: Payload, info: RoundInfo) -> Payload:
        means = dict(means)
        counts = means.pop(GROUP, {})
        if not means.get("weights"):
            return self.base.process_aggregate(means, info)
        self._warn_unprotected(means)
        n = len(info.sampled)
        k = info.weight_totals.get("weights", float(len(info.aggregated)))
        clip = self.current_clip
        z_update = self.update_noise_multiplier(n)
        generator = torch.Generator().manual_seed(derive_seed(self._seed, _NOISE_STREAM, info.round))
        metrics: dict[str, float] = {}
        if self.clipping == "adaptive":  # the count is released first, from the same generator
            reported = info.weight_totals.get(GROUP, k) if counts else 0.0
            below = float(counts["unclipped"]) * reported if counts else 0.0
            noise_b = self.count_stddev(n) if self.noise_multiplier > 0 else 0.0
            fraction = noised_fraction(below, reported, n, noise_b, generator)
            self.current_clip = update_clip_norm(clip, fraction, self.target_quantile, self.clip_lr)
            metrics["privacy/unclipped_fraction"] = fraction
        weights = means["weights"]
        names = list(weights)
        reference = shared_state(self._model[0]) if self._model else {}
        missing = [n for n in names if n not in reference]
        if missing:
            raise RunError(f"DP: the aggregate has entries the global model lacks: {missing[:3]}")
        noised = noised_mean_update(
            [weights[n] for n in names], [reference[n] for n in names], k, n, z_update * clip, generator
        )
        means["weights"] = dict(zip(names, noised))
        if self.noise_multiplier > 0:
            self.history = add_step(self.history, self.noise_multiplier, n / max(info.num_clients, 1))
            metrics["privacy/epsilon"] = self.epsilon()
            metrics["privacy/delta"] = self.delta_value
        metrics["privacy/clip_norm"] = clip
        metrics["privacy/noise_std"] = z_update * clip / n
        self._metrics = metrics
        return self.base.process_aggregate(means, info)

    def _warn_unprotected(self, means: Payload) -> None:
        other = sorted(g for g in means if g != "weights" and g not in self._warned)
        if other:
            self._warned.update(other)
            log.warning(
                "DP protects the uploaded weights only: %s of %s %s averaged without clipping or noise",
                ", ".join(other),
                type(self.base).__name__,
                "is" if len(other) == 1 else "are",
            )

    def round_metrics(self) -> dict[str, float]:
        return {**self.base.round_metrics(), **self._metrics}

    def stop_reason(self, round: int) -> str:
        reason = self.base.stop_reason(round)
        if reason or self.target_epsilon is None or not self._count:
            return reason
        eps = self.epsilon(extra_rounds=1)
        if eps <= self.target_epsilon:
            return ""
        spent = self.epsilon()
        return (
            f"the privacy budget model.strategy.target_epsilon={self.target_epsilon:g} is spent: epsilon "
            f"is {spent:.4g} after {round} rounds and would be {eps:.4g} after the next "
            f"(delta={self.delta_value:.3g}, {self.accountant} accountant); raise target_epsilon or "
            "noise_multiplier"
        )

    def extra_repr(self) -> str:
        return (
            f"noise_multiplier={self.noise_multiplier}, clip_norm={self.clip_norm}, "
            f"clipping={self.clipping}, accountant={self.accountant}"
        )
