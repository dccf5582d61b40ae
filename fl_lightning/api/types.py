"""The values that travel through a round: what a client knows, what it returns, what the server aggregates.

``Payload`` (named groups of named tensors, e.g. ``{"weights": {...}, "controls": {...}}``) is what a
message or an upload holds. :class:`ClientContext` is a client's view during its local work,
:class:`ClientResult` its outcome; :class:`LocalTraining` is the run's local training handed to a client's
deployment-time work; :class:`RoundInfo` is what the server knows when it aggregates and
:class:`RoundResult` the round's aggregate. :class:`RunSpec` is what a strategy checks its configuration
against before the first round (:meth:`~fl_lightning.api.strategy.Strategy.check`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Any

from torch import Tensor, nn

from fl_lightning.functional.tensor import Payload

if TYPE_CHECKING:
    from fl_lightning.api.task import Task
    from fl_lightning.data.federated import ClientData


#: A client's training-metric states (``{metric: {state: tensor}}``), merged over the round's clients.
TrainState = dict[str, dict[str, Tensor]]


@dataclass
class ClientContext:
    """What a client knows during its local work in one round (the inputs of its work function).

    Attributes:
        client_id: The client's index in ``0..num_clients-1``.
        round: The 0-based round index.
        message: What the server sent (read-only; tensors may alias the global model).
        state: The client's persistent tensors; strategies read and write it in place.
        num_samples: Size of the client's local training split (its aggregation weight).
        num_steps: Local optimizer steps this round (``K``).
        lr: The local learning rate of this round (after the per-round decay).
        step: Local steps completed so far in this round.
        scratch: Per-round scratch space for the strategy (dropped after the round).
        data: The client's local data (index arrays into the shared training tensors; read-only),
            for strategies that need more than its size, e.g. its label counts or input shape
            (FedCOG). None when a context is built outside the round loop.
        seed: The run seed (``model.seed``, i.e. ``seed_everything``): derive any per-run draw of the
            strategy from it (as the simulated attack draws its malicious clients).
        stacked: 0 for one client. ``C > 0`` while the local steps of ``C`` clients run as one batched
            computation (``model.runtime.vectorize``): the module's parameters and gradients, ``state`` and
            the message's per-client entries then hold the clients along dim 0 (``[C, *shape]``), and
            reductions over a client's parameters must be per client (see
            :attr:`fl_lightning.api.strategy.Strategy.vectorizable`).

    The fields after ``lr`` are keyword-only.
    """

    client_id: int
    round: int
    message: Payload
    state: dict[str, Tensor]
    num_samples: int
    num_steps: int
    lr: float
    _: KW_ONLY
    step: int = 0
    scratch: dict[str, Any] = field(default_factory=dict)
    data: ClientData | None = None
    seed: int = 0
    stacked: int = 0


@dataclass(frozen=True)
class LocalTraining:
    """The run's local training as the engine hands it to
    :meth:`Strategy.adapt <fl_lightning.api.strategy.Strategy.adapt>` (a client's work on its own data before
    its evaluation): the strategies train through it, never with a loop of their own.

    Attributes:
        batch_size: The clients' local batch size.
        seed: The run seed (``model.seed``).
        run: The engine's local steps (:func:`fl_lightning.engine.local.fine_tune`):
            ``run(module, data, epochs, lr, seed)`` takes ``epochs`` passes of mini-batch steps of
            ``module``'s own optimizer (its lr replaced by ``lr`` unless None) on ``data``'s training split,
            through the loop of a client's local training (the precision plugin, ``model.grad_clip_norm``,
            the client's RNG discipline), in train mode (restored after), the global RNG left as it was.
    """

    batch_size: int
    seed: int
    run: Callable[[nn.Module, ClientData, int, float | None, int], None]

    def fine_tune(
        self,
        module: nn.Module,
        data: ClientData,
        epochs: int,
        lr: float | None = None,
        seed: int | None = None,
    ) -> None:
        """``epochs`` passes of local steps of ``module`` on ``data`` (see :attr:`run`); the batch order and
        the random draws come from a stream seeded by ``(seed, client)`` (``seed``: the run seed unless
        given)."""
        self.run(module, data, epochs, lr, self.seed if seed is None else seed)


@dataclass
class RoundInfo:
    """What the server knows when it aggregates a round.

    Attributes:
        round: The 0-based round index.
        sampled: Client ids sampled this round.
        aggregated: Client ids whose uploads entered the aggregate (failed clients excluded).
        num_clients: Total number of clients ``m`` in the federation.
        weight_totals: Sum of aggregation weights per payload group.
    """

    round: int
    sampled: list[int]
    aggregated: list[int]
    num_clients: int
    weight_totals: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class RunSpec:
    """What a run is made of, for :meth:`Strategy.check <fl_lightning.api.strategy.Strategy.check>`
    before round 1 (a configuration a strategy cannot run is a one-line error then, not a client failure
    in every round).

    Attributes:
        task: The data's task (multiclass or multilabel).
        num_classes: Classes (multiclass) or labels (multilabel) of the data.
        num_clients: Clients in the federation.
        input_shape: The shape of one input sample.
        integer_labels: Whether the training targets are integer class labels (single-label data).
        grad_scaler: The local steps run through a gradient scaler (``trainer.precision=16-mixed``), which
            steps the optimizer itself: :meth:`Strategy.local_step` is then not called.
        unseen: Clients held out of training (``data.unseen_clients``): never sampled, evaluated only.
    """

    task: Task
    num_classes: int
    num_clients: int
    input_shape: tuple[int, ...]
    integer_labels: bool = True
    grad_scaler: bool = False
    unseen: frozenset[int] = frozenset()


@dataclass
class ClientResult:
    """The outcome of one client's local work in one round.

    ``state`` is the client's new persistent state, None when the client keeps it itself (a Flower
    SuperNode keeps it in its own context).
    """

    client_id: int
    upload: Payload
    state: dict[str, Tensor] | None
    num_samples: int
    metrics: dict[str, float]
    bytes_down: int
    bytes_up: int
    train_state: TrainState = field(default_factory=dict)


@dataclass
class RoundResult:
    """The aggregate of one round, ready for the server update."""

    means: Payload
    info: RoundInfo
    client_metrics: dict[int, dict[str, float]] = field(default_factory=dict)
    bytes_down: int = 0
    bytes_up: int = 0
    failed: list[int] = field(default_factory=list)
    train_metrics: dict[str, float] = field(default_factory=dict)
    #: One line on the first failure of the round (``client <id>: <Type>: <message>``), "" if none.
    error: str = ""
    train_states: dict[int, TrainState] = field(default_factory=dict)
    #: Peak device memory allocated during the round's local training in GiB (CUDA only; None elsewhere).
    peak_memory_gb: float | None = None
    #: Clients of the round trained in vectorised groups (``model.runtime.vectorize``), over all processes.
    vectorised: int = 0


__all__ = ["ClientContext", "ClientResult", "Payload", "RoundInfo", "RoundResult", "RunSpec", "TrainState"]
