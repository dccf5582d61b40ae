"""The strategy API: one class holds both sides of one federated algorithm.

Before the first round the engine calls ``setup(model, num_clients)`` and ``check(model, spec)`` (a
configuration the strategy cannot run, e.g. a task it does not support, is a one-line ``ConfigError``
there, never a client failure). A round of the :class:`~fl_lightning.engine.round.Engine` calls, in order::

    server: select_clients(num_clients, count, round, seed) -> the round's clients (seeded uniform)
            aggregator()                                -> this round's Aggregator (StreamingMean)
            message(model, client_id, round)           -> payload sent down
    client: on_client_start(module, ctx)                  (after the loop loaded message["weights"])
            configure_client_optimizer(module, ctx)     -> local optimizer (may be closure-based, SAM)
            per local step:  local_step(module, optimizer, ctx, batch, closure)  (optimizer.step(closure))
                             the closure: zero_grad, module.training_step (task loss), + local_loss(...),
                             backward, on_before_optimizer_step(module, optimizer, ctx), clipping
                             on_after_optimizer_step(module, optimizer, ctx)
            upload(module, ctx)                         -> payload (ctx.state persists)
            process_upload(upload, ctx)                 -> payload sent up: clip, noise, compress
                                                           (bytes_up counts this)
    server: server_receive(upload)                        per upload, inside the aggregator's add
            weighting(group)                              "samples" or "uniform" per payload group
            <aggregator: add per client, combine across processes, means>
            process_aggregate(means, info)              -> means, e.g. noise for central DP
            server_update(model, means, info)             set .grad (pseudo-gradient), assign buffers
            <server optimizer step>                       SGD(lr) = FedAvg; momentum, Adam = FedOpt
            on_after_server_step(model, means, info)
            round_metrics()                               -> scalars logged per round (privacy/epsilon)
            stop_reason(round + 1)                        -> non-empty: fit ends before that round

Evaluation of the clients' deployed models (``FederatedModule.evaluate_clients``, every client, or a
seeded ``model.eval_fraction`` of them during fit) calls ``personalize`` then ``adapt`` per client.

Server state lives in buffers registered on the strategy (it is an ``nn.Module``, so Lightning
checkpoints it and moves it to the device); per-client state lives in ``ctx.state``, a dict of tensors
that the loop loads from and saves to the client state store, so it survives checkpoints and can be
trained on any process.

Personal entries (never communicated) are named by :meth:`personal_names`; the base class keeps them
in ``ctx.state["personal/<name>"]``: :meth:`on_client_start` loads them (a client's first round
starts from the global model's initial values), :meth:`upload` saves them, :meth:`personalize`
loads them for evaluation. Subclasses that override these hooks call ``super()``.

Vectorised clients (``model.vectorize=C``): the loop may run the local steps of up to ``C`` clients as one
batched computation. A strategy opts in by setting ``vectorizable = True`` in its OWN class body (the
attribute is not inherited, since a subclass may add terms that do not vectorise) when its client hooks
obey this contract; otherwise the round falls back to one client at a time with a one-line notice:

- ``on_client_start``, ``configure_client_optimizer``, ``local_loss``, ``local_step``,
  ``on_before_optimizer_step`` and ``on_after_optimizer_step`` are then called ONCE for the group on a
  stacked module whose parameters (same names) and gradients are ``[C, *shape]``, with a stacked
  context (``ctx.stacked == C``): ``ctx.state`` holds every client's entries stacked along dim 0 (an
  entry a client does not have is zeros: opt in only if a missing entry means zero), and each message
  entry is either shared (the same tensor for every client, unstacked) or stacked. In these calls
  ``ctx.client_id`` is -1, ``ctx.data`` None and ``ctx.num_steps`` the group's largest.
- The per-step terms are elementwise (``torch._foreach_*`` on aligned lists broadcast over the client
  dim): FedProx's ``mu/2 ||w - w^t||^2`` summed over clients, SCAFFOLD's ``c - c_i``, FedDyn's
  ``alpha (w - w^t) - lambda_i``. A ``local_loss`` is the SUM of the clients' terms, so one backward gives
  each client its own gradient; its ``outputs`` are ``[C, B, ...]``. Reductions over a client's parameters
  (global norms for clipping or a SAM perturbation) pass ``stacked=ctx.stacked > 0`` to
  :func:`~fl_lightning.functional.sharpness.global_norm`, ``clip_grads_`` or ``sam_offsets``.
- New per-client tensors created during the steps are created like a parameter or gradient (so they
  are stacked), not like a message entry. Step-to-step values that :meth:`upload` reads from
  ``ctx.scratch`` are listed in :attr:`vector_scratch` (tensors stacked along dim 0, or plain Python
  values); a client's values are taken when its own last step is done (clients with fewer steps stop
  there, whatever the group does afterwards).
- No randomness from the global RNG during the steps (batch order comes from the client's generator).
- :meth:`upload` and :meth:`process_upload` run per client, exactly as in the sequential round, on the
  worker holding that client's trained weights, after :meth:`on_client_start` was called again on it
  (with its message and its state at the start of the round) and the final ``ctx.state`` entries and
  :attr:`vector_scratch` values were put into its context.
- A plug-in (:class:`StrategyWrapper`) declares :attr:`vectorizable` for its own hooks and vectorises
  only when its base does too; its :attr:`vector_scratch` is the base's plus its own
  :attr:`StrategyWrapper.wrapper_scratch`. Override :meth:`cannot_vectorize` to give a specific reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from fl_lightning.api.aggregation import Aggregator, StreamingMean
from fl_lightning.api.types import ClientContext, RoundInfo, RunSpec
from fl_lightning.errors import ConfigError, check_number
from fl_lightning.functional.sampling import sample_clients
from fl_lightning.functional.tensor import Payload, load_tensors, pseudo_gradient, shared_state

if TYPE_CHECKING:
    from fl_lightning.data.federated import ClientData

PERSONAL = "personal/"


class Strategy(nn.Module):
    """Base strategy: FedAvg's behaviour on every hook; subclasses override what differs.

    Args:
        server_lr: Learning rate of the server optimizer applied to the pseudo-gradient
            ``Delta = w - sum_k p_k w_k`` (1.0 reproduces plain averaging).
    """

    #: Registry name (set by subclasses; used by :func:`fl_lightning.strategies.list_strategies`).
    name: str = ""
    #: The client hooks follow the vectorised-clients contract (module docstring); read from the class's
    #: own body only, never inherited.
    vectorizable: ClassVar[bool] = False
    #: ``ctx.scratch`` keys whose per-step values :meth:`upload` reads (taken per client after its last
    #: step in a vectorised round).
    vector_scratch: ClassVar[tuple[str, ...]] = ()

    def __init__(self, server_lr: float = 1.0) -> None:
        super().__init__()
        check_number(server_lr, "model.strategy.server_lr", low=0, low_open=True, hint="FedAvg uses 1.0")
        self.server_lr = server_lr
        self.num_clients = 0

    # ----------------------------------------------------------------------------------- setup
    def setup(self, model: nn.Module, num_clients: int) -> None:
        """Allocate server state for ``model`` and ``num_clients`` clients (once per run).

        Called before a checkpoint is restored, so buffers registered here are loaded by Lightning.
        """
        self.num_clients = num_clients

    def check(self, model: nn.Module, spec: RunSpec) -> None:
        """Refuse, with one :class:`~fl_lightning.errors.ConfigError` line, a run this strategy cannot do.

        Called once before round 1, after :meth:`setup`, with the global model and what the run is made
        of (task, classes, input shape, precision). Check here everything a client hook would otherwise
        find out in every round (the task, the labels, the model's layers); overrides call ``super()``.
        (The engine itself refuses a strategy with its own :meth:`local_step` under 16-bit mixed
        precision, whose gradient scaler steps the local optimizer itself: see :func:`own_local_step`.)
        """

    def configure_server_optimizer(self, params: list[nn.Parameter]) -> torch.optim.Optimizer:
        """The server optimizer over the global parameters; FedAvg: ``SGD(lr=server_lr)``."""
        return torch.optim.SGD(params, lr=self.server_lr)

    def personal_names(self, model: nn.Module) -> set[str]:
        """State entries that stay on the client and are never communicated (default: none)."""
        return set()

    def shared_names(self, model: nn.Module) -> list[str]:
        """Names of the model entries that are communicated: floating state minus personal ones."""
        return list(shared_state(model, exclude=self.personal_names(model)))

    def select_clients(self, num_clients: int, count: int, round: int, seed: int) -> list[int]:
        """The ``count`` clients that train in ``round`` (``count`` from participation/clients_per_round).

        Default: ``count`` distinct clients drawn uniformly by a generator seeded from ``(seed, round)``
        (:func:`~fl_lightning.functional.sampling.sample_clients`), so a resumed run draws the same
        clients. An override returns distinct ids in ``0..num_clients-1`` (any number, at least one; the
        loop sorts them) and must be a function of its arguments and the strategy's state, identical on
        every process.
        """
        return sample_clients(num_clients, count, seed, round)

    def aggregator(self) -> Aggregator:
        """A fresh aggregator for one round; default: the streaming weighted mean.

        Return a :class:`~fl_lightning.api.aggregation.BufferedAggregator` subclass for reductions that need
        every upload (median, trimmed mean, Krum). The aggregator applies :meth:`server_receive` and
        :meth:`weighting` of the strategy it is bound to.
        """
        return StreamingMean(self)

    # ---------------------------------------------------------------------------- server → client
    def message(self, model: nn.Module, client_id: int, round: int) -> Payload:
        """What the server sends ``client_id`` in ``round``; FedAvg: ``{"weights": w^t}``."""
        return {"weights": shared_state(model, exclude=self.personal_names(model))}

    # --------------------------------------------------------------------------------- client side
    def on_client_start(self, module: nn.Module, ctx: ClientContext) -> None:
        """After the loop loaded ``ctx.message["weights"]`` into ``module``: load personal entries."""
        load_personal(module, ctx.state)

    def configure_client_optimizer(self, module: nn.Module, ctx: ClientContext) -> torch.optim.Optimizer:
        """The local optimizer; default: the client LightningModule's ``configure_optimizers()``."""
        return module.configure_optimizers()

    def local_step(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        ctx: ClientContext,
        batch: Any,
        closure: Callable[[], Tensor],
    ) -> None:
        """One local step on ``batch``; default ``optimizer.step(closure)``.

        ``closure()`` zeroes the gradients, computes ``module.training_step`` (task loss plus
        :meth:`local_loss`), backpropagates, runs the ``on_before_optimizer_step`` hooks and clipping,
        and returns the loss. Override for steps that need more than one closure-based optimizer step
        (inner personalisation loops, perturb/restore); with 16-bit mixed precision and a gradient
        scaler the loop steps the optimizer itself and this hook is not used.
        """
        optimizer.step(closure)

    def local_loss(self, module: nn.Module, ctx: ClientContext, batch: Any, outputs: Tensor) -> Tensor | None:
        """A term added to the task loss at every local step (proximal, dual, KD...); None for none.

        The local loop calls it after ``module.training_step(batch)``; ``outputs`` are the outputs that
        step returned (``{"loss": ..., "outputs": ...}``), None when it returned a bare loss (or in the
        corrections pass of a SAM step): compute what you need from ``batch`` then.
        """
        return None

    def on_before_optimizer_step(
        self, module: nn.Module, optimizer: torch.optim.Optimizer, ctx: ClientContext
    ) -> None:
        """Edit gradients after backward and before the local step (e.g. SCAFFOLD's ``c - c_i``)."""

    def on_after_optimizer_step(
        self, module: nn.Module, optimizer: torch.optim.Optimizer, ctx: ClientContext
    ) -> None:
        """After each local optimizer step (e.g. accumulate a per-step quantity)."""

    def upload(self, module: nn.Module, ctx: ClientContext) -> Payload:
        """What the client sends back; FedAvg: ``{"weights": w_k}`` (shared entries only).

        Personal entries are saved to ``ctx.state`` here instead of being uploaded.
        """
        personal = self.personal_names(module)
        if personal:
            state = module.state_dict()
            ctx.state.update({PERSONAL + n: state[n].detach().clone() for n in personal})
        return {"weights": shared_state(module, exclude=personal)}

    def process_upload(self, upload: Payload, ctx: ClientContext) -> Payload:
        """Client side, after :meth:`upload`: what is really sent (default: ``upload`` unchanged).

        The place for clipping, local noise (local DP) and compression: the round's ``bytes_up`` and
        the aggregate see the returned payload. Random draws here use the client's RNG stream (seeded
        by ``(seed, round, client_id)``), so they repeat on a rerun and on any process.
        """
        return upload

    def personalize(self, module: nn.Module, client_id: int, state: dict[str, Tensor]) -> None:
        """Turn the global model (already loaded in ``module``) into the model ``client_id`` deploys.

        Used for per-client evaluation; default: load the client's personal entries, if any.
        """
        load_personal(module, state)

    def adapt(self, module: nn.Module, data: ClientData, state: dict[str, Tensor], batch_size: int) -> None:
        """Client-side work on its own training data after :meth:`personalize`, before its evaluation.

        For deployed models that the client computes at evaluation time from the current global
        model, e.g. fine-tuning it locally (the "+FT" baselines); default: none.
        """

    # --------------------------------------------------------------------------------- server side
    def server_receive(self, upload: Payload) -> Payload:
        """Server side, per client: turn an upload into what is averaged (default: as is).

        Runs after the upload's bytes are counted and before it enters the weighted sums, so a
        strategy can aggregate something the server derives from each upload (TDPFed-ACT composes
        full tensors from the uploaded CP factors) without sending it.
        """
        return upload

    def weighting(self, group: str) -> Literal["samples", "uniform"]:
        """How uploads of ``group`` are averaged: by client sample count (default) or uniformly."""
        return "samples"

    def process_aggregate(self, means: Payload, info: RoundInfo) -> Payload:
        """Server side, after aggregation and before :meth:`server_update` (default: unchanged).

        E.g. Gaussian noise on the aggregate for central DP. Runs on every process with the same
        ``means``; draw noise from a generator seeded by the round so all processes agree.
        """
        return means

    @torch.no_grad()
    def server_update(self, model: nn.Module, means: Payload, info: RoundInfo) -> None:
        """Prepare the server optimizer step from the round's averaged uploads.

        FedAvg/FedOpt (Reddi et al., 2021): for parameters ``p.grad = w - mean_k(w_k)``; float
        buffers (e.g. BatchNorm statistics) are assigned the average directly. Parameters with no
        averaged value keep ``grad=None`` and are left unchanged by the optimizer.
        """
        weights = means.get("weights", {})
        params = dict(model.named_parameters())
        grads = pseudo_gradient(
            {n: p for n, p in params.items()}, {n: v for n, v in weights.items() if n in params}
        )
        for name, grad in grads.items():
            params[name].grad = grad.to(params[name].dtype)
        load_tensors(model, {n: v for n, v in weights.items() if n not in params})

    def on_after_server_step(self, model: nn.Module, means: Payload, info: RoundInfo) -> None:
        """After the server optimizer step (e.g. update server-side duals)."""

    def round_metrics(self) -> dict[str, float]:
        """Scalars on the strategy's state after the round, e.g. ``{"privacy/epsilon": 1.2}`` (default none).

        The module logs them with the round's scalars (TensorBoard, at step = rounds done), keeps them
        in the run history, and the summary writes the last values to ``summary.json``. Must be the
        same on every process.
        """
        return {}

    def stop_reason(self, round: int) -> str:
        """Why ``round`` (0-based) must not run, e.g. a spent privacy budget; ``""`` lets it run.

        Asked after each round for the next one, where a reason ends fit cleanly after the round
        (logged, checkpoint written), and before each round, after :meth:`select_clients`, where a
        reason (a run resumed past its budget) stops the run with a one-line error before any client
        trains. Must be the same on every process.
        """
        return ""

    def cannot_vectorize(self, module: nn.Module) -> str | None:
        """Why this strategy's clients cannot be trained vectorised on ``module`` (None: they can).

        Default: not unless the class itself sets :attr:`vectorizable` (see the module docstring), and
        never with personal layers (a client's first round starts them from the initial model).
        """
        cls = type(self)
        if cls.__dict__.get("vectorizable") is not True:
            return f"{cls.__name__} does not declare vectorizable local terms"
        if self.personal_names(module):
            return f"{cls.__name__} keeps personal layers"
        return None

    def extra_repr(self) -> str:
        return f"server_lr={self.server_lr}"


def own_local_step(strategy: Strategy) -> str | None:
    """The name of the class that overrides :meth:`Strategy.local_step` in ``strategy`` (a wrapper's own
    override, else its base's), None if the default ``optimizer.step(closure)`` is used."""
    if isinstance(strategy, StrategyWrapper):
        if type(strategy).local_step is not StrategyWrapper.local_step:
            return type(strategy).__name__
        return own_local_step(strategy.base)
    return type(strategy).__name__ if type(strategy).local_step is not Strategy.local_step else None


def load_personal(module: nn.Module, state: dict[str, Tensor]) -> None:
    """Load the ``personal/<name>`` entries of a client state into ``module`` (none: no-op)."""
    personal = {k[len(PERSONAL) :]: v for k, v in state.items() if k.startswith(PERSONAL)}
    if personal:
        load_tensors(module, personal)


class StrategyWrapper(Strategy):
    """A strategy that adds behaviour around another one (plug-ins such as FedCOG or fast/slow sync).

    Every hook delegates to ``base``; a subclass overrides the hooks it changes and calls
    ``self.base.<hook>(...)`` (or ``super().<hook>(...)``) for the rest. The wrapped strategy is a
    submodule, so its server state is checkpointed with the wrapper's.

    Args:
        base: The wrapped strategy.
    """

    #: ``ctx.scratch`` keys of the wrapper's own step-to-step values (:attr:`Strategy.vector_scratch`);
    #: :attr:`vector_scratch` adds them to the base's.
    wrapper_scratch: ClassVar[tuple[str, ...]] = ()

    def __init__(self, base: Strategy) -> None:
        super().__init__(server_lr=base.server_lr)
        self.base = base

    @property
    def vector_scratch(self) -> tuple[str, ...]:  # type: ignore[override]
        """The base's step-to-step ``ctx.scratch`` keys and the wrapper's own (:attr:`wrapper_scratch`)."""
        return tuple(dict.fromkeys((*self.base.vector_scratch, *self.wrapper_scratch)))

    def setup(self, model: nn.Module, num_clients: int) -> None:
        self.num_clients = num_clients
        self.base.setup(model, num_clients)

    def check(self, model: nn.Module, spec: RunSpec) -> None:
        self.base.check(model, spec)

    def configure_server_optimizer(self, params: list[nn.Parameter]) -> torch.optim.Optimizer:
        return self.base.configure_server_optimizer(params)

    def personal_names(self, model: nn.Module) -> set[str]:
        return self.base.personal_names(model)

    def shared_names(self, model: nn.Module) -> list[str]:
        return self.base.shared_names(model)

    def select_clients(self, num_clients: int, count: int, round: int, seed: int) -> list[int]:
        return self.base.select_clients(num_clients, count, round, seed)

    def aggregator(self) -> Aggregator:
        agg = self.base.aggregator()
        agg.strategy = self  # the wrapper's server_receive/weighting (delegating by default) apply
        return agg

    def message(self, model: nn.Module, client_id: int, round: int) -> Payload:
        return self.base.message(model, client_id, round)

    def on_client_start(self, module: nn.Module, ctx: ClientContext) -> None:
        self.base.on_client_start(module, ctx)

    def configure_client_optimizer(self, module: nn.Module, ctx: ClientContext) -> torch.optim.Optimizer:
        return self.base.configure_client_optimizer(module, ctx)

    def local_step(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        ctx: ClientContext,
        batch: Any,
        closure: Callable[[], Tensor],
    ) -> None:
        self.base.local_step(module, optimizer, ctx, batch, closure)

    def local_loss(self, module: nn.Module, ctx: ClientContext, batch: Any, outputs: Tensor) -> Tensor | None:
        return self.base.local_loss(module, ctx, batch, outputs)

    def on_before_optimizer_step(
        self, module: nn.Module, optimizer: torch.optim.Optimizer, ctx: ClientContext
    ) -> None:
        self.base.on_before_optimizer_step(module, optimizer, ctx)

    def on_after_optimizer_step(
        self, module: nn.Module, optimizer: torch.optim.Optimizer, ctx: ClientContext
    ) -> None:
        self.base.on_after_optimizer_step(module, optimizer, ctx)

    def upload(self, module: nn.Module, ctx: ClientContext) -> Payload:
        return self.base.upload(module, ctx)

    def process_upload(self, upload: Payload, ctx: ClientContext) -> Payload:
        return self.base.process_upload(upload, ctx)

    def personalize(self, module: nn.Module, client_id: int, state: dict[str, Tensor]) -> None:
        self.base.personalize(module, client_id, state)

    def adapt(self, module: nn.Module, data: ClientData, state: dict[str, Tensor], batch_size: int) -> None:
        self.base.adapt(module, data, state, batch_size)

    def server_receive(self, upload: Payload) -> Payload:
        return self.base.server_receive(upload)

    def weighting(self, group: str) -> Literal["samples", "uniform"]:
        return self.base.weighting(group)

    def process_aggregate(self, means: Payload, info: RoundInfo) -> Payload:
        return self.base.process_aggregate(means, info)

    def server_update(self, model: nn.Module, means: Payload, info: RoundInfo) -> None:
        self.base.server_update(model, means, info)

    def on_after_server_step(self, model: nn.Module, means: Payload, info: RoundInfo) -> None:
        self.base.on_after_server_step(model, means, info)

    def round_metrics(self) -> dict[str, float]:
        return self.base.round_metrics()

    def stop_reason(self, round: int) -> str:
        return self.base.stop_reason(round)

    def cannot_vectorize(self, module: nn.Module) -> str | None:
        """The base's reason, else the wrapper's own (a plug-in declares :attr:`vectorizable` itself)."""
        reason = self.base.cannot_vectorize(module)
        return reason if reason is not None else super().cannot_vectorize(module)

    def extra_repr(self) -> str:
        return ""


STRATEGIES: dict[str, type[Strategy]] = {}


def register_strategy(cls: type[Strategy]) -> type[Strategy]:
    """Class decorator adding a :class:`Strategy` subclass to the registry under ``cls.name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} needs a non-empty class attribute `name` to be registered")
    STRATEGIES[cls.name] = cls
    return cls


def list_strategies() -> list[str]:
    """Class names of all registered strategies: the values ``--model.strategy`` takes (``FedProx``)."""
    return sorted((cls.__name__ for cls in STRATEGIES.values()), key=str.lower)


def get_strategy(name: str, **kwargs: object) -> Strategy:
    """Instantiate a registered strategy by class name (``FedProx``) or registry name (``fedprox``).

    Both are matched case-insensitively.
    """
    key = name.lower()
    cls = STRATEGIES.get(key) or next((c for c in STRATEGIES.values() if c.__name__.lower() == key), None)
    if cls is None:
        raise ConfigError(
            f"model.strategy={name!r} is not a known strategy; choose one of {', '.join(list_strategies())}"
        )
    return cls(**kwargs)
