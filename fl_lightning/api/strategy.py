"""The strategy API: one class holds both sides of one federated algorithm.

Before the first round the engine calls ``setup(model, num_clients)`` and ``check(model, spec)`` (a
configuration the strategy cannot run, e.g. a task it does not support, is a one-line ``ConfigError``
there, never a client failure). A round of the :class:`~fl_lightning.engine.round.Engine` calls, in order::

    server: select_clients(num_clients, count, round, seed) -> the round's clients (seeded uniform)
            aggregator()                                -> this round's Aggregator: per-group weighting,
                                                           receive transform, reduction (streaming mean)
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
    server: <aggregator: add per client (receive, weights), combine across processes, means>
            process_aggregate(means, info)              -> means, e.g. noise for central DP
            server_update(model, means, info)             set .grad (pseudo-gradient), assign buffers
            <server optimizer step>                       SGD(lr) = FedAvg; momentum, Adam = FedOpt
            on_after_server_step(model, means, info)
            round_metrics()                               -> scalars logged per round (privacy/epsilon)
            cluster_ids()                                 -> each client's cluster (IFCA, CFL), or None
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

Vectorised clients (``model.runtime.vectorize=C``): the loop may run the local steps of up to ``C`` clients as
one batched computation. A strategy class declares that its client hooks obey this contract in its OWN class
body, with ``vectorizable = True`` or ``vectorizable = Vectorizable(scratch=..., unless=...)`` (the
declaration is not inherited, since a subclass may add terms that do not vectorise); the engine reads it
through :func:`cannot_vectorize` and :func:`vector_scratch` and nowhere else. Otherwise the round falls back
to one client at a time with a one-line notice naming the reason:

- ``on_client_start``, ``configure_client_optimizer``, ``local_loss``, ``local_step``,
  ``on_before_optimizer_step`` and ``on_after_optimizer_step`` are then called ONCE for the group on a
  stacked module whose parameters (same names) and gradients are ``[C, *shape]``, with a stacked
  context (``ctx.stacked == C``): ``ctx.state`` holds every client's entries stacked along dim 0 (an
  entry a client does not have is zeros: declare it only if a missing entry means zero), and each message
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
  ``ctx.scratch`` are listed in :attr:`Vectorizable.scratch` (tensors stacked along dim 0, or plain Python
  values); a client's values are taken when its own last step is done (clients with fewer steps stop
  there, whatever the group does afterwards).
- No randomness from the global RNG during the steps (batch order comes from the client's generator).
- :meth:`upload` and :meth:`process_upload` run per client, exactly as in the sequential round, on the
  worker holding that client's trained weights, after :meth:`on_client_start` was called again on it
  (with its message and its state at the start of the round) and the final ``ctx.state`` entries and
  scratch values were put into its context.
- A plug-in (:class:`StrategyWrapper`) declares it for its own hooks and vectorises only when its base does
  too; its scratch keys add to its base's. Clients with personal layers never vectorise (a client's first
  round starts them from the initial model).

Capabilities (:data:`CAPABILITIES`): what the engine needs to know of a strategy's client hooks is declared
by class attributes, inherited, and read through :func:`declaring` alone, never from which methods a class
overrides: ``steps_itself`` (its :meth:`local_step` replaces ``optimizer.step(closure)``: refused under
16-mixed), ``changes_gradients`` (a hook adds to, reads or changes the gradients between backward and step:
the local SGD step is not fused into the backward), ``deploys_personal_model`` (:meth:`personalize` or
:meth:`adapt` make a client's deployed model differ from the global one: per-client evaluation) and
``prepares_clients`` (:meth:`on_client_start` does more than load personal entries, e.g. reads the weights:
vectorised clients load the message first). Every strategy of the package declares those its hooks need. A
class (a user's) that overrides a capability's hook in its own body without declaring the capability there
or inheriting it gets the safe fallback: the capability is set for it (the conservative reading) and named
in its ``undeclared`` attribute; a class may declare ``False`` in its own body for a hook that needs none.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor, nn

from fl_lightning.api.aggregation import Aggregator
from fl_lightning.api.types import ClientContext, LocalTraining, RoundInfo, RunSpec
from fl_lightning.errors import ConfigError, check_number
from fl_lightning.functional.sampling import sample_clients
from fl_lightning.functional.tensor import Payload, load_tensors, pseudo_gradient, shared_state

if TYPE_CHECKING:
    from fl_lightning.data.federated import ClientData

PERSONAL = "personal/"


@dataclass(frozen=True)
class Vectorizable:
    """A strategy class's declaration that its client hooks follow the vectorised-clients contract (module
    docstring), set in its own class body: ``vectorizable = Vectorizable(...)`` (``True`` is
    ``Vectorizable()``).

    Attributes:
        scratch: ``ctx.scratch`` keys whose step-to-step values :meth:`Strategy.upload` reads, taken per
            client after its own last step (SCAFFOLD's raw-gradient sum, FedSMOO's last perturbation,
            FedNova's step count). A subclass's declaration adds to its parents' keys (its upload reads
            theirs too); the declaration itself is not inherited.
        unless: ``unless(strategy, module)``: a reason the run's clients cannot be stacked after all, known
            only from the strategy's arguments or state (None: they can), e.g. FastSlow's slow-entry cache.
    """

    scratch: tuple[str, ...] = ()
    unless: Callable[[Any, nn.Module], str | None] | None = None


#: Each declared capability (a class attribute of :class:`Strategy`) and the hooks whose override needs it.
CAPABILITIES: dict[str, tuple[str, ...]] = {
    "steps_itself": ("local_step",),
    "changes_gradients": ("local_step", "local_loss", "on_before_optimizer_step", "on_after_optimizer_step"),
    "deploys_personal_model": ("personalize", "adapt"),
    "prepares_clients": ("on_client_start",),
}


class Strategy(nn.Module):
    """Base strategy: FedAvg's behaviour on every hook; subclasses override what differs.

    Each hook's docstring names the strategies that override it.

    Args:
        server_lr: Learning rate of the server optimizer applied to the pseudo-gradient
            ``Delta = w - sum_k p_k w_k`` (1.0 reproduces plain averaging).
    """

    #: Registry name (set by subclasses; used by :func:`fl_lightning.strategies.list_strategies`).
    name: str = ""
    #: The client hooks follow the vectorised-clients contract (module docstring): ``True`` or a
    #: :class:`Vectorizable`; read from the class's own body only, never inherited.
    vectorizable: ClassVar[Vectorizable | bool] = False
    #: The plug-ins (class names) that may wrap this strategy; None: any. A strategy whose server holds
    #: several models (IFCA, CFL) names the few whose hooks do not assume one global model; any other plug-in
    #: around it is a one-line error when the plug-in is built.
    allowed_plugins: ClassVar[tuple[str, ...] | None] = None
    #: A client's deployed model is built from server state that Flower's evaluate message (the global
    #: weights) does not carry (IFCA's and CFL's cluster models): refused on the Flower path, never evaluated
    #: wrongly.
    deploys_server_models: ClassVar[bool] = False
    # The capabilities (module docstring, :data:`CAPABILITIES`), declared where the hooks need them:
    #: Its :meth:`local_step` replaces ``optimizer.step(closure)`` (refused under 16-mixed's gradient scaler).
    steps_itself: ClassVar[bool] = False
    #: A client hook adds to, reads or changes the gradients between backward and step.
    changes_gradients: ClassVar[bool] = False
    #: :meth:`personalize` or :meth:`adapt` make a client's deployed model differ from the global one.
    deploys_personal_model: ClassVar[bool] = False
    #: :meth:`on_client_start` does more than load the personal entries (it reads or changes the weights).
    prepares_clients: ClassVar[bool] = False
    #: The capabilities this class left undeclared and got by the safe fallback (empty for the package's).
    undeclared: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """The safe fallback of an undeclared capability (module docstring)."""
        super().__init_subclass__(**kwargs)
        # the class's own body and its mixins (bases that are no strategies, e.g. SharpnessAware)
        local = [k for k in cls.__mro__ if k is cls or not issubclass(k, Strategy)]
        parents = [b for b in cls.__bases__ if issubclass(b, Strategy)]

        def defined(name: str) -> bool:
            return any(name in vars(k) for k in local)

        missing = [
            capability
            for capability, hooks in CAPABILITIES.items()
            if not defined(capability)
            and not any(getattr(p, capability) for p in parents)
            and any(defined(h) for h in hooks)
        ]
        for capability in missing:
            setattr(cls, capability, True)
        cls.undeclared = tuple(missing)

    def __init__(self, server_lr: float = 1.0) -> None:
        super().__init__()
        check_number(server_lr, "model.strategy.server_lr", low=0, low_open=True, hint="FedAvg uses 1.0")
        self.server_lr = server_lr
        self.num_clients = 0

    # ----------------------------------------------------------------------------------- setup
    def setup(self, model: nn.Module, num_clients: int) -> None:
        """Allocate server state for ``model`` and ``num_clients`` clients (once per run).

        Called before a checkpoint is restored, so buffers registered here are loaded by Lightning.
        Overridden by every stateful strategy (SCAFFOLD's ``c``, FedDyn's ``h``, FedGen's generator, ...).
        """
        self.num_clients = num_clients

    def check(self, model: nn.Module, spec: RunSpec) -> None:
        """Refuse, with one :class:`~fl_lightning.errors.ConfigError` line, a run this strategy cannot do.

        Called once before round 1, after :meth:`setup`, with the global model and what the run is made
        of (task, classes, input shape, precision). Check here everything a client hook would otherwise
        find out in every round (the task, the labels, the model's layers); overrides call ``super()``.
        Used by VHL, FedReg (multiclass only), FedPAC (integer labels), FedNova (an SGD local optimizer).
        (The engine itself refuses a strategy with its own :meth:`local_step` under 16-bit mixed
        precision, whose gradient scaler steps the local optimizer itself: see :func:`own_local_step`.)
        """

    def configure_server_optimizer(self, params: list[nn.Parameter]) -> torch.optim.Optimizer:
        """The server optimizer over the global parameters; FedAvg: ``SGD(lr=server_lr)``.

        FedAvgM (SGD with momentum), FedAdam (Adam), TDPFed (``beta`` as the lr).
        """
        return torch.optim.SGD(params, lr=self.server_lr)

    def personal_names(self, model: nn.Module) -> set[str]:
        """State entries that stay on the client and are never communicated (default: none).

        FedPer, FedRep, FedPAC (the head), LG-FedAvg (the body), Local (everything).
        """
        return set()

    def select_clients(self, num_clients: int, count: int, round: int, seed: int) -> list[int]:
        """The ``count`` clients that train in ``round`` (``count`` from participation/clients_per_round).

        Default: ``count`` distinct clients drawn uniformly by a generator seeded from ``(seed, round)``
        (:func:`~fl_lightning.functional.sampling.sample_clients`), so a resumed run draws the same
        clients. An override returns distinct ids in ``0..num_clients-1`` (any number, at least one; the
        loop sorts them) and must be a function of its arguments and the strategy's state, identical on
        every process. Overridden by DP and FedAvg (s.a.r.), which record the round's seed and count.
        """
        return sample_clients(num_clients, count, seed, round)

    def aggregator(self) -> Aggregator:
        """How this round's uploads are combined: the strategy's one aggregation declaration.

        Called at the start of every round for a fresh :class:`~fl_lightning.api.aggregation.Aggregator`,
        configured with the per-group ``weighting`` (SCAFFOLD's control variates, FedCM's ``K eta``,
        FedSMOO's and FedGen's groups uniform; FedDyn, FedDC uniform throughout; FedNova ``n_k /
        ||a_k||_1``), the ``receive`` transform applied to each upload on the server (TDPFed-ACT, FedAvg
        (s.a.r.), FedGen) and a ``reduce`` that needs every upload (FedPAC's classifier collaboration, the
        robust plug-ins). A plug-in builds on its base's (DP: ``reweighted``; robust plug-ins:
        ``replace(reduce=...)``). Default: the streaming mean weighted by client sample count.
        """
        return Aggregator()

    # ---------------------------------------------------------------------------- server → client
    def message(self, model: nn.Module, client_id: int, round: int) -> Payload:
        """What the server sends ``client_id`` in ``round``; FedAvg: ``{"weights": w^t}``.

        Extra groups: SCAFFOLD, FedDC (``c``), FedCM (``Delta^t``), FedSMOO (``s``), FedGen (the
        generator), FedPAC (prototypes, combined head), TDPFed-ACT, DP (the clip norm); FedAvg (s.a.r.)
        and FastSlow thin it.
        """
        return {"weights": shared_state(model, exclude=self.personal_names(model))}

    # --------------------------------------------------------------------------------- client side
    def on_client_start(self, module: nn.Module, ctx: ClientContext) -> None:
        """After the loop loaded ``ctx.message["weights"]`` into ``module``: load personal entries.

        Where strategies build the round's aligned lists (FedProx, SCAFFOLD, FedDyn, FedCM, ...) or
        per-client work before the steps (FedCOG's generation, the Moreau envelope's ``theta``, FedPAC's
        statistics).
        """
        load_personal(module, ctx.state)

    def configure_client_optimizer(self, module: nn.Module, ctx: ClientContext) -> torch.optim.Optimizer:
        """The local optimizer; default: the client LightningModule's ``configure_optimizers()``.

        pFedMe and TDPFed (the Moreau envelope) record its undecayed learning rate here.
        """
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
        and returns the loss. Override for steps that need more than one closure-based optimizer step:
        the SAM family (FedSAM, MoFedSAM, FedGamma, FedSpeed, FedSMOO: perturb/restore), pFedMe and
        TDPFed (inner personalisation loop), Ditto, FedRep, FedReg, PersonalAtoms. With 16-bit mixed
        precision and a gradient scaler the loop steps the optimizer itself and this hook is not used.
        """
        optimizer.step(closure)

    def local_loss(self, module: nn.Module, ctx: ClientContext, batch: Any, outputs: Tensor) -> Tensor | None:
        """A term added to the task loss at every local step; None for none.

        FedProx (proximal), MOON (contrastive), FedDecorr, VHL, FedPAC (alignment), FedGen and FedCOG
        (distillation). The local loop calls it after ``module.training_step(batch)``; ``outputs`` are the
        outputs that step returned (``{"loss": ..., "outputs": ...}``), None when it returned a bare loss
        (or in the corrections pass of a SAM step): compute what you need from ``batch`` then.
        """
        return None

    def on_before_optimizer_step(
        self, module: nn.Module, optimizer: torch.optim.Optimizer, ctx: ClientContext
    ) -> None:
        """Edit gradients after backward and before the local step: SCAFFOLD's ``c - c_i``, FedDyn's dual
        terms, FedCM's momentum direction, FedDC's drift penalty."""

    def on_after_optimizer_step(
        self, module: nn.Module, optimizer: torch.optim.Optimizer, ctx: ClientContext
    ) -> None:
        """After each local optimizer step: SCAFFOLD's raw-gradient sum, FedNova's count of the steps
        actually taken."""

    def upload(self, module: nn.Module, ctx: ClientContext) -> Payload:
        """What the client sends back; FedAvg: ``{"weights": w_k}`` (shared entries only).

        Personal entries are saved to ``ctx.state`` here instead of being uploaded. Extra groups and
        client state: SCAFFOLD's ``Delta c_i``, FedDyn's ``lambda_i``, FedCM's ``K eta``, FedNova's
        ``||a_k||_1``, ...
        """
        personal = self.personal_names(module)
        if personal:
            state = module.state_dict()
            ctx.state.update({PERSONAL + n: state[n].detach().clone() for n in personal})
        return {"weights": shared_state(module, exclude=personal)}

    def process_upload(self, upload: Payload, ctx: ClientContext) -> Payload:
        """Client side, after :meth:`upload`: what is really sent (default: ``upload`` unchanged).

        The place for clipping, local noise (local DP) and compression: the round's ``bytes_up`` and
        the aggregate see the returned payload (DP clips the update here). Random draws here use the
        client's RNG stream (seeded by ``(seed, round, client_id)``), so they repeat on a rerun and on any
        process.
        """
        return upload

    def personalize(self, module: nn.Module, client_id: int, state: dict[str, Tensor]) -> None:
        """Turn the global model (already loaded in ``module``) into the model ``client_id`` deploys.

        Used for per-client evaluation; default: load the client's personal entries, if any. Ditto,
        pFedMe and TDPFed (the personalised model), FedPAC (the combined head), PersonalAtoms.
        """
        load_personal(module, state)

    def adapt(
        self, module: nn.Module, data: ClientData, state: dict[str, Tensor], local: LocalTraining
    ) -> None:
        """Client-side work on its own training data after :meth:`personalize`, before its evaluation.

        For deployed models that the client computes at evaluation time from the current global
        model: FineTune (the "+FT" baselines) and FedBABU fine-tune through ``local.fine_tune`` (the
        engine's local steps: precision, clipping, the client's RNG discipline), Per-FedAvg takes one step,
        FedALA its aggregation, IFCA picks its cluster (``local.batch_size``: the local batch size);
        default: none.
        """

    # --------------------------------------------------------------------------------- server side
    def process_aggregate(self, means: Payload, info: RoundInfo) -> Payload:
        """Server side, after aggregation and before :meth:`server_update` (default: unchanged).

        DP: Gaussian noise on the aggregate. Runs on every process with the same ``means``; draw noise from
        a generator seeded by the round so all processes agree.
        """
        return means

    @torch.no_grad()
    def server_update(self, model: nn.Module, means: Payload, info: RoundInfo) -> None:
        """Prepare the server optimizer step from the round's averaged uploads.

        FedAvg/FedOpt (Reddi et al., 2021): for parameters ``p.grad = w - mean_k(w_k)``; float
        buffers (e.g. BatchNorm statistics) are assigned the average directly. Parameters with no
        averaged value keep ``grad=None`` and are left unchanged by the optimizer. Overridden by the
        strategies with server state or another server step (SCAFFOLD, FedDyn, FedDC, FedCM, FedExP,
        FedNova, FedPAC, TDPFed-ACT, FedAvg (s.a.r.), FastSlow).
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
        """After the server optimizer step: FedSMOO's global perturbation, FedGen's generator training,
        FastSlow's restore of the slow entries."""

    def round_metrics(self) -> dict[str, float]:
        """Scalars on the strategy's state after the round (default none), e.g. DP's
        ``{"privacy/epsilon": 1.2}``.

        The module logs them with the round's scalars (TensorBoard, at step = rounds done), keeps them
        in the run history, and the summary writes the last values to ``summary.json``. Must be the
        same on every process.
        """
        return {}

    def cluster_ids(self) -> dict[int, int] | None:
        """Each client's cluster now, ``{client id: cluster}``, for a clustered strategy (IFCA: the cluster
        a client last chose to train; CFL: the cluster it belongs to); None (the default) for a strategy
        without clusters.

        Read after every round (the TensorBoard text ``cluster/assignment``) and at the end of fit (the
        ``cluster`` column of ``clients.csv``); a client not in the dict has no cluster yet (never trained).
        Must be the same on every process.
        """
        return None

    def stop_reason(self, round: int) -> str:
        """Why ``round`` (0-based) must not run, e.g. DP's spent privacy budget; ``""`` lets it run.

        Asked after each round for the next one, where a reason ends fit cleanly after the round
        (logged, checkpoint written), and before each round, after :meth:`select_clients`, where a
        reason (a run resumed past its budget) stops the run with a one-line error before any client
        trains. Must be the same on every process.
        """
        return ""

    def extra_repr(self) -> str:
        return f"server_lr={self.server_lr}"


#: Every hook of :class:`Strategy`, in the order of the module docstring (:class:`StrategyWrapper`
#: forwards each of them to its base).
HOOKS = (
    "setup",
    "check",
    "configure_server_optimizer",
    "personal_names",
    "select_clients",
    "aggregator",
    "message",
    "on_client_start",
    "configure_client_optimizer",
    "local_step",
    "local_loss",
    "on_before_optimizer_step",
    "on_after_optimizer_step",
    "upload",
    "process_upload",
    "personalize",
    "adapt",
    "process_aggregate",
    "server_update",
    "on_after_server_step",
    "round_metrics",
    "cluster_ids",
    "stop_reason",
)


def declaring(strategy: Strategy, capability: str) -> str | None:
    """The name of the class of ``strategy``'s wrapper chain (the outermost plug-in first) that declares
    ``capability`` (a key of :data:`CAPABILITIES`), None if none does."""
    if capability not in CAPABILITIES:
        raise ValueError(f"unknown capability {capability!r}; one of {', '.join(CAPABILITIES)}")
    for part in reversed(list(_chain(strategy))):
        if getattr(type(part), capability):
            return type(part).__name__
    return None


def own_local_step(strategy: Strategy) -> str | None:
    """The name of the class whose own :meth:`Strategy.local_step` ``strategy`` uses (a wrapper's, else its
    base's: the declared ``steps_itself``), None if the default ``optimizer.step(closure)`` is used."""
    return declaring(strategy, "steps_itself")


def load_personal(module: nn.Module, state: dict[str, Tensor]) -> None:
    """Load the ``personal/<name>`` entries of a client state into ``module`` (none: no-op)."""
    personal = {k[len(PERSONAL) :]: v for k, v in state.items() if k.startswith(PERSONAL)}
    if personal:
        load_tensors(module, personal)


class StrategyWrapper(Strategy):
    """A strategy that adds behaviour around another one (plug-ins such as FedCOG or fast/slow sync).

    Every hook (:data:`HOOKS`) delegates to ``base``: the forwarding methods are made from the hook list
    when the class is created (each keeps its hook's signature and docstring); ``setup`` also records
    ``num_clients`` on the wrapper. A subclass overrides the hooks it changes and calls
    ``self.base.<hook>(...)`` (or ``super().<hook>(...)``) for the rest. The wrapped strategy is a
    submodule, so its server state is checkpointed with the wrapper's.

    Args:
        base: The wrapped strategy.
    """

    def __init__(self, base: Strategy) -> None:
        super().__init__(server_lr=base.server_lr)
        for part in _chain(base):
            allowed = type(part).allowed_plugins
            if allowed is not None and type(self).__name__ not in allowed:
                takes = ", ".join(allowed) if allowed else "no plug-in"
                raise ConfigError(
                    f"model.strategy: {type(self).__name__} cannot wrap {type(part).__name__}, whose server "
                    f"keeps several models ({type(self).__name__} assumes one global model); "
                    f"{type(part).__name__} takes {takes}"
                )
        self.base = base

    @property
    def deploys_server_models(self) -> bool:  # type: ignore[override]
        """The wrapped strategy's (a plug-in deploys what its base deploys)."""
        return self.base.deploys_server_models

    def setup(self, model: nn.Module, num_clients: int) -> None:
        self.num_clients = num_clients
        self.base.setup(model, num_clients)

    def extra_repr(self) -> str:
        return ""


def _forwarding(name: str) -> Callable[..., Any]:
    hook = getattr(Strategy, name)

    @functools.wraps(hook)
    def forward(self: StrategyWrapper, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.base, name)(*args, **kwargs)

    return forward


for _name in HOOKS:
    if _name not in vars(StrategyWrapper):
        setattr(StrategyWrapper, _name, _forwarding(_name))


# ------------------------------------------------------------------------------ vectorised clients
def _chain(strategy: Strategy) -> Iterator[Strategy]:
    """``strategy``'s innermost base first, then each plug-in around it."""
    if isinstance(strategy, StrategyWrapper):
        yield from _chain(strategy.base)
    yield strategy


def _declared(strategy: Strategy) -> Vectorizable | None:
    declared = type(strategy).__dict__.get("vectorizable")
    return Vectorizable() if declared is True else declared if isinstance(declared, Vectorizable) else None


def cannot_vectorize(strategy: Strategy, module: nn.Module) -> str | None:
    """Why ``strategy``'s clients cannot be trained vectorised on ``module`` (None: they can).

    Read from the :class:`Vectorizable` declarations alone: every class of the wrapper chain (innermost
    first) must declare it in its own body, none of their ``unless`` may give a reason, and the clients keep
    no personal layers (a client's first round starts them from the initial model).
    """
    for part in _chain(strategy):
        declared = _declared(part)
        if declared is None:
            return f"{type(part).__name__} does not declare vectorizable local terms"
        reason = declared.unless(part, module) if declared.unless is not None else None
        if reason:
            return reason
    if strategy.personal_names(module):
        return f"{type(strategy).__name__} keeps personal layers"
    return None


def vector_scratch(strategy: Strategy) -> tuple[str, ...]:
    """The ``ctx.scratch`` keys of the step-to-step values ``strategy``'s uploads read: those declared by its
    class and its parent classes (the upload that reads them is inherited too), and by the strategies it
    wraps."""
    keys = [
        key
        for part in _chain(strategy)
        for cls in reversed(type(part).__mro__)
        if isinstance(declared := cls.__dict__.get("vectorizable"), Vectorizable)
        for key in declared.scratch
    ]
    return tuple(dict.fromkeys(keys))


# ------------------------------------------------------------------------------ registry
STRATEGIES: dict[str, type[Strategy]] = {}


def register_strategy(cls: type[Strategy]) -> type[Strategy]:
    """Class decorator adding a :class:`Strategy` subclass to the registry under ``cls.name``.

    A class registered from a module outside the package (imported before the command line parses, or
    once by its class path) is then named by its class name too, as the package's are.
    """
    if not cls.name:
        raise ValueError(f"{cls.__name__} needs a non-empty class attribute `name` to be registered")
    STRATEGIES[cls.name] = cls
    return cls


def list_strategies() -> list[str]:
    """Class names of all registered strategies: the values ``--model.strategy`` takes (``FedProx``)."""
    return sorted((cls.__name__ for cls in STRATEGIES.values()), key=str.lower)


#: How a strategy in a module of one's own is named where its module was never imported.
CLASS_PATH_HINT = "a strategy of your own is named by its class path, e.g. my_package.my_module.MyProx"


def get_strategy(name: str, **kwargs: object) -> Strategy:
    """Instantiate a strategy by class name (``FedProx``), registry name (``fedprox``) or class path
    (``my_package.my_module.MyProx``, imported here).

    Names are matched case-insensitively among the registered strategies.
    """
    if "." in name:
        module, _, attr = name.rpartition(".")
        try:
            found = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as err:
            raise ConfigError(f"model.strategy={name!r} cannot be imported ({err})") from None
        if not (isinstance(found, type) and issubclass(found, Strategy)):
            raise ConfigError(f"model.strategy={name!r} is not a Strategy subclass")
        return found(**kwargs)
    key = name.lower()
    cls = STRATEGIES.get(key) or next((c for c in STRATEGIES.values() if c.__name__.lower() == key), None)
    if cls is None:
        raise ConfigError(
            f"model.strategy={name!r} is not a known strategy; choose one of {', '.join(list_strategies())}; "
            f"{CLASS_PATH_HINT}"
        )
    return cls(**kwargs)
