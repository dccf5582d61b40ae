"""The server: a LightningModule whose training step is one federated round."""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import Any

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_only
from torch import Tensor

from fl_lightning.api.client import ClientModule
from fl_lightning.api.collectives import all_gather_objects, is_distributed
from fl_lightning.api.metrics import TaskMetrics
from fl_lightning.api.strategy import Strategy, declaring
from fl_lightning.api.types import ClientResult, RoundResult
from fl_lightning.callbacks.base import FederatedCallback
from fl_lightning.callbacks.results import cluster_text, spread_scalars
from fl_lightning.data.datasets import is_synthetic
from fl_lightning.data.federated import FederatedDataModule
from fl_lightning.data.viz import counts_markdown, partition_heatmap
from fl_lightning.defaults import lazy_default
from fl_lightning.engine.attack import SimulatedAttack, as_attack
from fl_lightning.engine.config import upgrade_model_section
from fl_lightning.engine.executors import Executor, Sequential, default_executor
from fl_lightning.engine.local import LocalConfig, cpu_threads
from fl_lightning.engine.record import RoundRecord
from fl_lightning.engine.round import Engine, EngineConfig, RoundListener, ServerStep
from fl_lightning.engine.runtime import Runtime, as_runtime
from fl_lightning.engine.state import ClientStateStore
from fl_lightning.engine.system import RoundPolicy, SystemModel
from fl_lightning.engine.system.policy import as_round_policy
from fl_lightning.errors import ConfigError
from fl_lightning.functional.tensor import to_device
from fl_lightning.hparams import global_seed, rebuild, record_hyperparameters
from fl_lightning.lightning.checkpoint import (
    attached_trainer,
    check_resume,
    hyperparameters,
    load_checkpoint_file,
)
from fl_lightning.lightning.loggers import RoundStepLogger
from fl_lightning.lightning.trainer import FederatedTrainer
from fl_lightning.models.sizing import size_to_data
from fl_lightning.strategies.fedavg import FedAvg

log = logging.getLogger("fl_lightning")

#: Prefix of the per-client scalars, ``z_client/<id>/<metric>``: TensorBoard orders tag groups by name,
#: and the ``z`` puts the many per-client cards after the run-level groups (``global``, ``personal``,
#: ``round``, ``test``, ``train``) instead of first. Plain characters, valid for every Lightning logger.
CLIENT_PREFIX = "z_client"

_DEFAULT_CLIENT = lazy_default(ClientModule)
_DEFAULT_STRATEGY = lazy_default(FedAvg)
_DEFAULT_ROUND_POLICY = RoundPolicy()  # frozen: one shared default is safe
_DEFAULT_RUNTIME = Runtime()  # frozen too


class FederatedModule(LightningModule):
    """Federated training as a LightningModule: one training step is one round.

    A thin adapter over the round :class:`~fl_lightning.engine.round.Engine` (``self.engine``), which owns
    what a round means; this module maps it onto Lightning: a round is a training step, its record is
    logged, the federated callback hooks are called, validation evaluates the global model, and the
    engine's client states and history go into the checkpoint.

    The global model is ``self.client`` (a :class:`~fl_lightning.api.client.ClientModule`); its
    parameters are those of the server optimizer, which the strategy provides and which is stepped
    once per round with the pseudo-gradient ``w - mean_k(w_k)`` (FedOpt framing). So
    ``trainer.max_steps`` is the number of rounds, ``trainer.global_step`` is the number of rounds
    done, validation after each round evaluates the global model on the data module's validation split
    (``data.val_fraction > 0``), else on the global test set (``global/*``), ``test`` evaluates it on the
    test set (``test/*``), and ModelCheckpoint, EarlyStopping and LearningRateMonitor work per round.
    Fit it with :func:`~fl_lightning.lightning.trainer.federated_trainer`, whose defaults make a round a
    step (a plain ``Trainer`` validating once per epoch, i.e. after the last round, is refused in one line).
    :meth:`load_from_checkpoint` rebuilds it from a checkpoint (the arguments are saved in it).

    Args:
        client: The client LightningModule: network, task loss, local optimizer.
        strategy: The federated algorithm (FedAvg, FedProx, ...).
        attack: Simulated malicious clients (null: none), e.g. ``{kind: sign_flip, fraction: 0.2,
            scale: 1.0}``: ``round(fraction * num_clients)`` clients, drawn from the run seed, send
            ``w^t - scale * Delta_k`` (``sign_flip``) or ``w^t + scale * Delta_k`` (``scale``) instead of
            their update ``Delta_k``. Works with any strategy; test a defence with ``model.strategy``
            Median, TrimmedMean, Krum or NormBounded.
        system: The clients as devices on a simulated clock (null: off; every client online, equally fast,
            finishing its work): ``Devices`` (seeded speed, bandwidth, availability, dropout), ``Trace`` (a
            CSV file) or ``Stragglers`` (FedProx's, with ``fraction``). Logs ``round/sim_time_s`` and
            ``sim/time_s``; see README, "System heterogeneity".
        round_policy: What a round does with its slow clients, applied by ``system``: a round
            ``deadline_s``, ``policy`` (``drop`` or ``partial`` work past it; the stragglers' under
            ``Stragglers``), ``over_selection``, and the simulated run's ``target_accuracy`` and
            ``max_sim_time_s`` (a :class:`~fl_lightning.system.RoundPolicy`, or a mapping of its fields;
            e.g. ``--model.round_policy.deadline_s=30``).
        participation: Fraction of clients sampled per round, in (0, 1].
        clients_per_round: A fixed number of clients per round (overrides ``participation``).
        local_epochs: Local passes over the client's data per round (ignored if ``local_steps``).
        local_steps: Local optimizer steps per round (``K``); None to use ``local_epochs``.
        lr_decay: Per-round decay of the local learning rate: ``lr_t = lr * lr_decay ** t``.
        grad_clip_norm: Clip each local step's gradient to this global norm (None: no clipping).
        eval_clients_every: Evaluate every client's deployed model on its local test split every
            this many rounds (``z_client/<id>/*`` and ``personal/*``); 0: only at the end of fit.
        eval_fraction: Fraction of clients evaluated by those evaluations during fit, in (0, 1]:
            ``max(1, floor(eval_fraction * m))`` clients drawn by a generator seeded from
            ``(seed, round)``, ``personal/*`` merged over them. The evaluation at the end of fit, and
            ``validate``/``test``, evaluate every client.
        tolerate_client_failures: Exclude (and count) a client whose local training raises or
            returns non-finite values instead of stopping the run.
        max_failed_rounds: With ``tolerate_client_failures``, a round in which every sampled client
            failed is skipped (global model and server optimizer unchanged, ``round/failed_clients``
            logged, a warning); this many consecutive skipped rounds stop the run with a
            :class:`~fl_lightning.errors.RunError` that quotes the last error (FedBuff, FedAsync: this many
            times ``M`` consecutive failed arrivals).
        seed: Seed of client sampling and of every client's RNG stream (batch order, dropout). None: the
            run's one seed, that of the last ``lightning.seed_everything`` (0 if none was set), as on the
            command line, where it is ``seed_everything`` (linked; not a separate option).
        runtime: How the run executes, not what it trains (a :class:`~fl_lightning.Runtime`, or a mapping
            of its fields): the client state store's memory budget and folder (``state_memory_mb``,
            ``state_dir``), intra-op CPU threads (``threads_per_process``), ``torch.compile``
            (``compile``) and vectorised clients (``vectorize``, ``vectorize_memory_gb``,
            ``vectorize_cpu``); e.g. ``--model.runtime.vectorize=auto``.
    """

    def __init__(
        self,
        client: ClientModule = _DEFAULT_CLIENT,
        strategy: Strategy = _DEFAULT_STRATEGY,
        attack: SimulatedAttack | None = None,
        system: SystemModel | None = None,
        round_policy: RoundPolicy = _DEFAULT_ROUND_POLICY,
        participation: float = 1.0,
        clients_per_round: int | None = None,
        local_epochs: int = 2,
        local_steps: int | None = None,
        lr_decay: float = 1.0,
        grad_clip_norm: float | None = None,
        eval_clients_every: int = 1,
        eval_fraction: float = 1.0,
        tolerate_client_failures: bool = True,
        max_failed_rounds: int = 3,
        seed: int | None = None,
        runtime: Runtime = _DEFAULT_RUNTIME,
    ) -> None:
        arguments = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        super().__init__()
        seed = global_seed() if seed is None else seed
        if eval_clients_every < 0:
            raise ConfigError(f"model.eval_clients_every={eval_clients_every} must be >= 0")
        attack = as_attack(attack)
        # The CLI builds fresh objects from the config; from Python the defaults are shared objects,
        # so give each module its own.
        self.client = ClientModule() if client is _DEFAULT_CLIENT else client
        self.strategy = FedAvg() if strategy is _DEFAULT_STRATEGY else strategy
        self.automatic_optimization = False
        self.eval_clients_every = eval_clients_every
        self.system = system
        #: The round's policy (``model.round_policy``), which the system model applies.
        self.round_policy = as_round_policy(round_policy)
        self.seed = seed
        #: How the run executes (``model.runtime``): state store, threads, compile, vectorised clients.
        self.runtime = as_runtime(runtime)
        local = LocalConfig(  # the engine's configuration checks its own fields (one-line errors)
            batch_size=0,  # the data module's, set in setup
            local_epochs=local_epochs,
            local_steps=local_steps,
            lr_decay=lr_decay,
            grad_clip_norm=grad_clip_norm,
            seed=seed,
            compile=self.runtime.compile,
            vectorize=self.runtime.vectorize,
            vectorize_memory_gb=self.runtime.vectorize_memory_gb,
            vectorize_cpu=self.runtime.vectorize_cpu,
        )
        config = EngineConfig(
            local,
            participation=participation,
            clients_per_round=clients_per_round,
            tolerate_client_failures=tolerate_client_failures,
            max_failed_rounds=max_failed_rounds,
            attack=attack,
            eval_fraction=eval_fraction,
            system=system,
            round_policy=self.round_policy,
        )
        store = ClientStateStore(self.runtime.state_budget_bytes, self.runtime.state_dir)
        self.engine = Engine(self.client, self.strategy, config, store)
        self.client_eval: dict[int, dict[str, float]] = {}
        #: The global model's metrics on each client's local test split at the last client evaluation (the
        #: same object as ``client_eval`` when the strategy deploys the global model itself).
        self.client_eval_global: dict[int, dict[str, float]] = {}
        #: The global model's metrics on each participating client's training data (at the end of fit, with
        #: ``data.unseen_clients``: the out-of-sample gap's first term).
        self.client_eval_train: dict[int, dict[str, float]] = {}
        self._client_eval_round = -1
        self._client_train_round = -1
        self._checkpoint_rounds = 0
        self._executor: Executor | None = None
        self.global_metrics: TaskMetrics | None = None
        #: Per-group global metrics (``global/group<g>/*``) under a client transform's per-group evaluation.
        self.group_metrics: dict[int, TaskMetrics] = {}
        #: The checkpoint state of :meth:`load_from_checkpoint`, applied once a Trainer sets the module up.
        self._loaded_state: dict[str, Any] | None = None
        record_hyperparameters(
            self,
            {
                **arguments,
                "client": self.client,
                "strategy": self.strategy,
                "round_policy": self.round_policy,
                "runtime": self.runtime,
                "seed": seed,
            },
        )

    # ------------------------------------------------------------------------------ wiring
    @property
    def datamodule(self) -> FederatedDataModule:
        dm = getattr(self.trainer, "datamodule", None)
        if not isinstance(dm, FederatedDataModule):
            raise ConfigError("data must be a fl_lightning FederatedDataModule (set `data:` in the config)")
        return dm

    @property
    def round_unit(self) -> str:
        """What a training step is: ``"round"``, or ``"server step"`` for an asynchronous strategy."""
        schedule = self.engine.schedule
        return "round" if schedule is None else schedule.unit

    @property
    def history(self) -> list[RoundRecord]:
        """The record of every round done (the engine's; part of the checkpoint)."""
        return self.engine.history

    @property
    def store(self) -> ClientStateStore:
        """Every client's persistent state (the engine's; part of the checkpoint)."""
        return self.engine.store

    @property
    def worker(self) -> ClientModule:
        """The working copy trained for each client in turn (not part of the checkpoint)."""
        return self.engine.worker

    def use_executor(self, executor: Executor) -> None:
        """Run the clients' local work with ``executor`` (e.g. Flower's SuperNodes) instead of in-process.

        Call before ``trainer.fit``; the round itself (sampling, policies, aggregation) stays the engine's.
        """
        self._executor = executor

    def configure_callbacks(self) -> list:
        """No callbacks; refuses the Trainer options a federated round cannot honour (see below).

        Lightning calls this hook before it checks its own configuration, so the error here names
        the federated equivalent instead of Lightning's "not supported for manual optimization".
        """
        if self.trainer.state.fn == TrainerFn.FITTING:
            check_trainer_options(self.trainer)
        return []

    def setup(self, stage: str) -> None:
        if self.global_metrics is not None:
            return
        if self.trainer.strategy.root_device.type == "cpu":
            threads = cpu_threads(self.client, self.runtime.threads_per_process, self.trainer.num_devices)
            if threads is not None:
                torch.set_num_threads(threads)
        dm = self.datamodule
        dm.setup(stage)
        self.connect_data(dm, self.trainer.precision_plugin)
        self.global_metrics = TaskMetrics(dm.task, dm.num_classes)
        self.group_metrics = {g: TaskMetrics(dm.task, dm.num_classes) for g in dm.eval_groups}
        loaded, self._loaded_state = self._loaded_state, None
        if loaded is not None and stage != "fit":  # fit restores its ckpt_path (without one: a new run)
            self.on_load_checkpoint(loaded)

    def connect_data(self, dm: FederatedDataModule, precision_plugin: Any = None) -> None:
        """Check the model against ``dm`` (set up) and set the round engine up on its clients.

        ``setup`` calls it with the Trainer's precision plugin; a process that trains clients without a
        Trainer (a Flower ClientApp) calls it after ``dm.setup("fit")``, so a model that does not fit the
        data, or a strategy that cannot run on it, is the same one-line ``ConfigError`` on every path.
        """
        self.check_data(dm)
        local = self.engine.config.local
        local.batch_size, local.eval_batch_size = dm.batch_size, dm.eval_batch_size
        self.engine.model, self.engine.strategy = self.client, self.strategy  # as set on the module now
        executor = self._executor or default_executor(local)  # inside a process group: its share
        self.engine.unseen = frozenset(getattr(dm, "unseen_ids", ()))  # never sampled for training
        self.engine.setup(dm.clients, dm.task, dm.num_classes, precision_plugin, executor)

    def check_data(self, dm: FederatedDataModule) -> None:
        """Raise a one-line ``ConfigError`` if the client network does not fit ``dm``'s data (set up): its
        task, its input shape (a forward pass on two samples) and its number of outputs. Networks that
        leave sizes unset (CharLSTM, LogisticRegression) take them from the data first."""
        size_to_data(self.client, dm.splits.input_shape, dm.num_classes, dm.splits.vocab_size)
        synthetic = is_synthetic(dm.dataset)  # generated data: the fix is on the data side
        if self.client.task != dm.task:
            fix = (
                f"set data.synthetic.multilabel={str(self.client.task == 'multilabel').lower()}"
                if synthetic
                else f"set model.client.init_args.task={dm.task}"
            )
            raise ConfigError(
                f"model.client.task={self.client.task!r} but data.dataset={dm.dataset!r} is {dm.task}; {fix}"
            )
        x = dm.splits.train_x[:2].to(self.device)
        try:
            with torch.no_grad():
                was = self.client.training
                out = self.client.eval()(x)
                self.client.train(was)
        except RuntimeError as err:
            msg = str(err).splitlines()[0]
            fix = (
                "set data.synthetic.shape (or data.dataset=synthetic:<the config's dataset>)"
                if synthetic
                else "use --model.client.net=CharLSTM or LogisticRegression for token ids"
                if not x.is_floating_point()
                else "use --model.client.net=LogisticRegression (or MLP) for vectors"
                if x.dim() == 2
                else "set its in_channels/input size to match"
            )
            raise ConfigError(
                f"model.client.net cannot take data.dataset={dm.dataset!r} inputs of shape "
                f"{tuple(x.shape[1:])} "
                f"({msg}); {fix}"
            ) from err
        if out.shape[-1] != dm.num_classes:
            fix = (
                f"set data.synthetic.num_classes={out.shape[-1]}"
                if synthetic
                else f"set model.client.init_args.net.init_args.num_classes={dm.num_classes}"
            )
            raise ConfigError(
                f"model.client.net outputs {out.shape[-1]} values but data.dataset={dm.dataset!r} has "
                f"{dm.num_classes} classes; {fix}"
            )

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.engine.server_optimizer()

    def forward(self, x: Tensor) -> Tensor:
        return self.client(x)

    # ------------------------------------------------------------------------------ a round
    @property
    def rounds_done(self) -> int:
        """Rounds done: the step (x-axis) of every logged scalar.

        While fitting this is ``trainer.global_step`` (one server optimizer step per round), so the
        values logged after round ``r`` (0-based) are at step ``r + 1``; in ``validate``/``test`` it is
        the round count of the loaded checkpoint.
        """
        return max(self.global_step, self._checkpoint_rounds)

    def on_fit_start(self) -> None:
        dm = self.datamodule
        dm.to(self.device)
        self.engine.num_rounds = self.trainer.max_steps
        if self.engine.config.local.vectorized and self.device.type != "cuda":
            log.info(
                "model.runtime.vectorize: peak device memory (round/peak_memory_gb) is logged on CUDA only"
            )
        if self.global_step == 0:
            self._log_partition(dm)

    def training_step(self, batch: Any, batch_idx: int) -> None:
        """One round: the engine runs it; this logs it and tells the callbacks."""
        round_idx = self.global_step
        outcome = self.engine.run_round(round_idx, _LightningServerStep(self), _CallbackListener(self))
        self._log_round(outcome.record, outcome.result)
        self._call_federated("on_round_end", round_idx, outcome.record)
        if outcome.stop_reason:  # Lightning finishes the round as usual (validation, last.ckpt, summary)
            self.trainer.should_stop = True

    def _log_round(self, record: RoundRecord, res: RoundResult) -> None:
        scalars = record.scalars()
        train = {k: v for k, v in scalars.items() if k.startswith("train/")}
        rest = {k: v for k, v in scalars.items() if k not in train}
        self.log_dict(rest, on_step=True, on_epoch=False, batch_size=1)
        if train:
            self.log_dict(train, on_step=True, on_epoch=False, batch_size=1, prog_bar=True)
        per_client = {
            f"{CLIENT_PREFIX}/{cid}/{k}": float(v)
            for cid, m in res.client_metrics.items()
            for k, v in m.items()
            if k != "num_samples"
        }
        self._log_direct(per_client, step=record.round + 1)
        self._log_clusters(record.round + 1)
        self._log_step()

    def _log_step(self) -> None:
        """Make Lightning log this hook's metrics at step = rounds done.

        Lightning logs at its own batch counter, which counts a round only after the round's
        validation (steps 0..R-1); a logged ``step`` value is what its logger connector uses instead.
        """
        self.log("step", float(self.rounds_done), batch_size=1)

    def _log_direct(self, metrics: dict[str, float], step: int) -> None:
        """Per-client metrics go straight to the loggers (many keys; nothing monitors them)."""
        if metrics and self.trainer.is_global_zero:
            for logger in self.loggers:
                logger.log_metrics(metrics, step=step)

    def _call_federated(self, hook: str, *args: Any) -> None:
        for cb in self.trainer.callbacks:
            fn = getattr(cb, hook, None)
            if isinstance(cb, FederatedCallback) and fn is not None:
                fn(self.trainer, self, *args)

    # ------------------------------------------------------------------------------ evaluation
    def on_validation_epoch_start(self) -> None:
        self.global_metrics.reset()
        for m in self.group_metrics.values():
            m.reset()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        """Update the global metrics; a batch ``(x, y, g)`` of group ``g`` (a per-group client transform's
        evaluation) updates group ``g``'s too."""
        x, y, *group = to_device(batch, self.device)
        outputs = self.client(x).float()
        self.global_metrics.update(outputs, y)
        if group:
            self.group_metrics[int(group[0])].update(outputs, y)

    def on_validation_epoch_end(self) -> None:
        self._log_eval("global")

    def on_test_epoch_start(self) -> None:
        self.on_validation_epoch_start()

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.validation_step(batch, batch_idx)

    def on_test_epoch_end(self) -> None:
        self._log_eval("test")

    def predict_step(self, batch: Any, batch_idx: int) -> dict[str, Tensor]:
        """The global model on a batch of inputs: ``outputs`` (logits) and ``predictions``.

        Predictions are the arg-max class (multiclass) or the labels with a positive logit, i.e.
        probability above 0.5 (multilabel): :meth:`Task.predictions <fl_lightning.api.task.Task.predictions>`.
        """
        x = batch[0] if isinstance(batch, (list, tuple)) else batch
        outputs = self.client(x)
        return {"outputs": outputs, "predictions": self.client.task.predictions(outputs)}

    def _log_eval(self, prefix: str) -> None:
        values = {f"{prefix}/{k}": v for k, v in gather_metrics(self.global_metrics).compute().items()}
        groups = {
            f"{prefix}/group{g}/{k}": v
            for g, metrics in self.group_metrics.items()
            for k, v in gather_metrics(metrics).compute().items()
        }
        if groups:  # per group: in the logs, not on the progress bar
            self.log_dict(groups, batch_size=1)
        if values:
            self.log_dict(values, prog_bar=prefix == "global", batch_size=1)
            if self.trainer.state.fn == TrainerFn.FITTING:
                self._log_step()
            else:  # validate/test log at the checkpoint's round (a logged `step` would print in the table)
                for logger in self.loggers:
                    if isinstance(logger, RoundStepLogger):
                        logger.round_step = self.rounds_done
        if prefix == "global":
            self._record_metrics({**values, **groups})
        rounds_done = self.rounds_done
        due = self.eval_clients_every > 0 and rounds_done % self.eval_clients_every == 0
        # trainer.training is False during fit's own validation: test the entry point instead
        if self.trainer.state.fn != TrainerFn.FITTING:
            self.evaluate_clients()
        elif due:
            self.evaluate_clients(clients=self.engine.eval_sample(rounds_done))

    @property
    def personalised(self) -> bool:
        """Whether a client deploys a model other than the global one (the strategy, or a plug-in around it,
        declares ``deploys_personal_model``, or it keeps personal layers)."""
        return bool(
            declaring(self.strategy, "deploys_personal_model") or self.strategy.personal_names(self.client)
        )

    def eval_weights(self) -> dict[int, float]:
        """Each client's evaluation samples (its local test split, or its training data without one)."""
        return {c.client_id: float(c.test_idx.numel() or c.num_samples) for c in self.engine.clients}

    def evaluate_global_per_client(
        self, clients: list[int] | None = None, train: bool = False
    ) -> dict[int, dict[str, float]]:
        """The global model as it is (no ``personalize``, no ``adapt``, no personal state) on each of
        ``clients``' local test split (``train``: on its training data), one client at a time here."""
        e = self.engine
        chosen = list(range(e.num_clients)) if clients is None else list(clients)
        work = dataclasses.replace(e.work(-1, chosen, state=lambda c: {}), strategy=FedAvg())
        if train:
            empty = torch.zeros(0, dtype=torch.int64)
            data = [dataclasses.replace(c, test_idx=empty, test_x=None, test_y=None) for c in e.clients]
            work = dataclasses.replace(work, data=data)
        with torch.inference_mode(False), torch.no_grad():
            return Sequential().evaluate(work)[0]

    def _record_metrics(self, values: dict[str, Any]) -> None:
        """Keep an evaluation of the model after the last round in that round's record (while fitting)."""
        fitting = self._trainer is not None and self.trainer.state.fn == TrainerFn.FITTING
        if fitting and self.history and self.history[-1].round == self.global_step - 1:
            self.history[-1].metrics.update({k: float(v) for k, v in values.items()})

    def evaluate_clients(
        self, lightning_log: bool = True, clients: list[int] | None = None
    ) -> dict[int, dict[str, float]]:
        """Evaluate the deployed model of ``clients`` (default: every client) on its local test split.

        The training data stands in for a client without a test split. The deployed model is the
        global model after ``strategy.personalize`` and ``strategy.adapt`` (identity for
        non-personalised strategies). Logs ``z_client/<id>/<metric>`` and ``personal/<metric>``, the
        latter merged over the evaluated clients by metric state, and the spread over the participating
        clients (:func:`~fl_lightning.functional.outcomes.client_spread`) of the global model
        (``clients/global_<metric>_<stat>``, evaluated per client as well for a personalised strategy) and of
        the deployed one (``clients/personal_<metric>_<stat>``, personalised strategies), and the mean over
        the unseen clients (``clients/unseen_global_<metric>_mean``, ``data.unseen_clients``).
        """
        self.datamodule.to(self.device)  # no-op during fit; after fit or from a checkpoint, the data follows
        per, merged = self.engine.evaluate_clients(clients)
        self.client_eval = per
        self.client_eval_global = self.evaluate_global_per_client(clients) if self.personalised else per
        self._client_eval_round = self.global_step if clients is None else -1  # a sample: not final
        flat = {f"{CLIENT_PREFIX}/{cid}/{k}": v for cid, m in per.items() for k, v in m.items()}
        self._log_direct(flat, step=self.rounds_done)
        personal = {f"personal/{k}": v for k, v in merged.compute().items()}
        spread = self.client_spread_scalars()
        self._record_metrics({**personal, **spread})
        if personal and lightning_log:
            self.log_dict(personal, batch_size=1)
        elif personal:  # outside a hook where self.log is allowed (e.g. at the end of fit)
            self._log_direct(personal, step=self.rounds_done)
        self._log_direct(spread, step=self.rounds_done)
        return per

    def client_spread_scalars(self) -> dict[str, float]:
        """The spread scalars (``clients/...``) of the last client evaluation (:meth:`evaluate_clients`)."""
        metric = self._client_metric()
        if metric is None:
            return {}
        unseen, weights = self.engine.unseen, self.eval_weights()

        def part(per: dict[int, dict[str, float]], seen: bool) -> dict[int, dict[str, float]]:
            return {c: m for c, m in per.items() if (c not in unseen) == seen}

        out = spread_scalars("clients/global_", part(self.client_eval_global, True), metric, weights)
        if self.personalised:
            out.update(spread_scalars("clients/personal_", part(self.client_eval, True), metric, weights))
        if unseen:
            for name, per in (("global", self.client_eval_global), ("personal", self.client_eval)):
                if name == "personal" and not self.personalised:
                    continue
                values = spread_scalars(f"clients/unseen_{name}_", part(per, False), metric, weights)
                out.update({k: v for k, v in values.items() if k.endswith(("_mean", "_n"))})
        return out

    def _client_metric(self) -> str | None:
        """The metric the per-client spread is on: ``acc`` (``o_f1`` for multilabel tasks); None: no client
        was evaluated."""
        names = {k for m in self.client_eval.values() for k in m}
        return "acc" if "acc" in names else "o_f1" if "o_f1" in names else None

    def final_client_metrics(self) -> dict[int, dict[str, float]]:
        """Per-client metrics of the final model (evaluated now if the last evaluation is stale); with
        unseen clients also the global model on the participating clients' training data."""
        if self._client_eval_round != self.global_step:
            self.evaluate_clients(lightning_log=False)
        if self.engine.unseen and self._client_train_round != self.global_step:
            seen = [c for c in range(self.engine.num_clients) if c not in self.engine.unseen]
            self.client_eval_train = self.evaluate_global_per_client(seen, train=True)
            self._client_train_round = self.global_step
        return self.client_eval

    def teardown(self, stage: str) -> None:
        """Give the data module's training tensors back to the host, as Lightning does with the module."""
        dm = getattr(attached_trainer(self), "datamodule", None)
        if isinstance(dm, FederatedDataModule) and dm.splits is not None:
            dm.to("cpu")

    # ------------------------------------------------------------------------------ logging
    @rank_zero_only
    def _log_partition(self, dm: FederatedDataModule) -> None:
        for logger in self.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_image(
                    "partition/clients_x_classes", partition_heatmap(dm.counts), 0, dataformats="HWC"
                )
                logger.experiment.add_text("partition/counts", counts_markdown(dm.counts), 0)
                if dm.client_transform is not None:
                    logger.experiment.add_text("partition/client_transform", dm.client_transform.card(), 0)

    @rank_zero_only
    def _log_clusters(self, step: int) -> None:
        """A clustered strategy's assignment after the round (:meth:`Strategy.cluster_ids`) as the
        TensorBoard text ``cluster/assignment`` at step = rounds done (:func:`cluster_text`)."""
        clusters = self.strategy.cluster_ids()
        if clusters is None:
            return
        for logger in self.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_text("cluster/assignment", cluster_text(step, clusters), step)

    # ------------------------------------------------------------------------------ checkpoint
    def fingerprint(self) -> dict[str, Any]:
        """Facts a checkpoint must share with the current config to be resumed or evaluated."""
        shapes = {k: list(v.shape) for k, v in self.client.state_dict().items()}
        system = {"model.system": type(self.system).__name__} if self.system is not None else {}
        return {
            **self.datamodule.fingerprint(),
            "model.seed": self.seed,
            "model.strategy": type(self.strategy).__name__,
            "model.client.net": shapes,
            **system,
        }

    @classmethod
    def load_from_checkpoint(  # type: ignore[override]
        cls, checkpoint_path: str | os.PathLike, strict: bool = True, **kwargs: Any
    ) -> FederatedModule:
        """The module a checkpoint of ``fit`` was written by: arguments, weights, client states and history.

        The arguments are those the checkpoint saved (``hparams``: the command line's config of ``model``, or
        the objects given from Python as their config); a checkpoint written before they were saved takes
        them from the ``config.yaml`` of its run folder. ``kwargs`` replace arguments (objects included,
        e.g. ``client=ClientModule(...)``); ``seed`` is the checkpoint's. The client states and history are
        applied once a Trainer sets the module up with its data (``validate``/``test``/``predict``), after
        the checkpoint's fingerprint is checked against that data; to continue training, give the checkpoint
        to ``fit`` as ``ckpt_path`` too, as with any Lightning module::

            model = FederatedModule.load_from_checkpoint(path)
            data = FederatedDataModule.load_from_checkpoint(path)
            federated_trainer(max_steps=20).fit(model, datamodule=data, ckpt_path=path)

        Raises:
            ConfigError: one line for a file that is not a checkpoint of ``fit``, a class the checkpoint names
                that is not imported, or a network that its saved arguments do not rebuild (a class that does
                not keep its constructor arguments): then pass ``client=``.
        """
        checkpoint = load_checkpoint_file(checkpoint_path, "cpu")
        fl = checkpoint.get("fl_lightning")
        if fl is None:
            raise ConfigError(
                f"ckpt_path: {checkpoint_path} has no fl_lightning state; FederatedModule did not write it"
            )
        key = cls.CHECKPOINT_HYPER_PARAMS_KEY
        module = rebuild(
            cls, checkpoint, checkpoint_path, key, "model", kwargs, upgrade=upgrade_model_section
        )
        saved_net = fl.get("net")
        if saved_net is not None and "client" not in kwargs and saved_net != repr(module.client.net):
            net = type(module.client.net).__name__
            raise ConfigError(
                f"ckpt_path: model.client.net: the {net} rebuilt from {checkpoint_path} differs from the one "
                f"saved ({net} does not keep every constructor argument); pass the network as for the run: "
                f"load_from_checkpoint(path, client=ClientModule({net}(...), ...))"
            )
        module.on_load_checkpoint(checkpoint)
        module.load_state_dict(checkpoint["state_dict"], strict=strict)
        return module

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["fl_lightning"] = {
            "fingerprint": self.fingerprint(),
            "hparams": hyperparameters(self),
            "client_state": self.store.state_dict(),
            "history": [r.to_dict() for r in self.history],
            "net": repr(self.client.net),  # what load_from_checkpoint must rebuild
        }
        schedule = self.engine.schedule_state()
        if schedule is not None:  # the simulated clock, an asynchronous schedule's clients in flight
            checkpoint["fl_lightning"]["schedule"] = schedule

    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> Any:
        """``nn.Module.load_state_dict``, where a buffer a strategy sizes in its setup (empty until then:
        IFCA's and CFL's cluster state) takes the saved shape first.

        A module that never set up a run loads a trained one's weights this way: ``load_from_checkpoint``,
        and the main process of Lightning's spawn and fork launchers (``trainer.strategy=ddp_spawn`` or
        ``ddp_fork``), which receives rank 0's weights after ``fit``.
        """
        for name, buffer in list(self.named_buffers()):
            saved = state_dict.get(name)
            if buffer.numel() == 0 and isinstance(saved, Tensor) and saved.shape != buffer.shape:
                owner_name, _, attr = name.rpartition(".")
                owner = self.get_submodule(owner_name)
                persistent = attr not in owner._non_persistent_buffers_set
                sized = torch.empty(saved.shape, dtype=saved.dtype, device=buffer.device)
                owner.register_buffer(attr, sized, persistent=persistent)
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        fl = checkpoint.get("fl_lightning")
        if fl is None:
            raise ConfigError(
                "ckpt_path: the checkpoint has no fl_lightning state; it was not written by FederatedModule"
            )
        if attached_trainer(self) is None:  # load_from_checkpoint: applied when a Trainer sets the module up
            self._loaded_state = {"fl_lightning": fl, "global_step": checkpoint.get("global_step", 0)}
            return
        check_resume(self, checkpoint, self.fingerprint())
        self.store.load_state_dict(fl["client_state"])
        restored = [RoundRecord.from_dict(r) for r in fl["history"]]  # older checkpoints: flat dicts
        self.history[:] = [dataclasses.replace(r, this_run=False) for r in restored]
        self.engine.load_schedule_state(fl.get("schedule"))
        self.engine.check_resume()
        self._checkpoint_rounds = int(checkpoint.get("global_step", 0))


class _LightningServerStep(ServerStep):
    """The server optimizer's step through Lightning's optimizer, so ``trainer.global_step`` counts rounds.

    With 16-bit mixed precision Lightning steps through its gradient scaler, which unscales the gradient
    first: the pseudo-gradient (not scaled) is pre-scaled so unscaling restores it. A skipped round still
    takes a step (the round counts): with every gradient None, torch's optimizers leave weights and state
    alone; the scaler refuses a step without gradients, so there the step is taken with zero gradients and
    the weights and optimizer state are put back afterwards.
    """

    def __init__(self, module: FederatedModule) -> None:
        super().__init__(module.optimizers())
        self.scaler = getattr(module.trainer.precision_plugin, "scaler", None)

    def step(self) -> None:
        if self.scaler is not None:
            scale = self.scaler.get_scale()
            for group in self.optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.mul_(scale)
        self.optimizer.step()

    def skip(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is None:
            self.optimizer.step()
            return
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        saved = [p.detach().clone() for p in params]
        state = copy.deepcopy(self.optimizer.optimizer.state_dict())
        for p in params:
            p.grad = torch.zeros_like(p)
        self.optimizer.step()
        with torch.no_grad():
            torch._foreach_copy_(params, saved)  # multi-tensor copy; no public foreach API (torch 2.x)
        self.optimizer.optimizer.load_state_dict(state)
        self.optimizer.zero_grad(set_to_none=True)


class _CallbackListener(RoundListener):
    """The engine's round events as the federated callback hooks (``on_round_start``, ``on_client_end``)."""

    def __init__(self, module: FederatedModule) -> None:
        self.module = module

    def round_start(self, round: int, clients: list[int]) -> None:
        self.module._call_federated("on_round_start", round, clients)

    def client_end(self, round: int, index: int, total: int, result: ClientResult | None) -> None:
        self.module._call_federated("on_client_end", round, index, total, result)


#: Trainer arguments a federated round cannot honour (:func:`check_trainer_options` refuses them), with the
#: config field that does their job.
REFUSED_TRAINER_ARGS: dict[str, str] = {
    "gradient_clip_val": "model.grad_clip_norm",
    "gradient_clip_algorithm": "model.grad_clip_norm",
    "accumulate_grad_batches": "model.local_steps",
    "max_epochs": "trainer.max_steps",
}


def check_trainer_options(trainer: Any) -> None:
    """Refuse Trainer options that the federated module (manual optimisation) cannot honour.

    A plain ``lightning.Trainer`` (not :func:`~fl_lightning.lightning.trainer.federated_trainer`'s) that
    validates per epoch is refused too: it would validate once, after the last round, silently. One made
    to validate per round (``val_check_interval=1, check_val_every_n_epoch=None``, the tests' bare
    Trainers) or not at all (``limit_val_batches=0``) is taken as chosen.

    A round is one Trainer step that runs every sampled client's local optimizer itself, so the
    Trainer's gradient clipping and accumulation would never touch a client's gradients, and one
    epoch holds all rounds, so ``max_epochs`` cannot count them. Each error names the equivalent.
    """
    if trainer.gradient_clip_val is not None and trainer.gradient_clip_val > 0:
        raise ConfigError(
            f"trainer.gradient_clip_val={trainer.gradient_clip_val} does not reach the clients' local steps; "
            "set model.grad_clip_norm (clips every local step's gradient norm) instead"
        )
    if trainer.gradient_clip_algorithm is not None:
        raise ConfigError(
            f"trainer.gradient_clip_algorithm={trainer.gradient_clip_algorithm.value!r} does not reach the "
            "clients' local steps; model.grad_clip_norm clips every local step's gradient by norm"
        )
    if trainer.accumulate_grad_batches != 1:
        raise ConfigError(
            f"trainer.accumulate_grad_batches={trainer.accumulate_grad_batches} does not apply to federated "
            "rounds; set model.local_steps (local steps per round) or data.batch_size instead"
        )
    per_epoch = trainer.check_val_every_n_epoch is not None and not isinstance(
        trainer.val_check_interval, int
    )
    if per_epoch and trainer.limit_val_batches != 0 and not isinstance(trainer, FederatedTrainer):
        raise ConfigError(
            f"a lightning.Trainer(check_val_every_n_epoch={trainer.check_val_every_n_epoch}) validates a "
            "FederatedModule once, after the last round (one epoch holds every round), and writes no "
            "last.ckpt or summary.json; build it with fl_lightning.federated_trainer(max_steps=...) "
            "(any Trainer argument passes through)"
        )
    max_epochs = trainer.fit_loop.max_epochs
    if trainer.max_steps > 0 and max_epochs not in (None, -1, 1):
        raise ConfigError(
            f"trainer.max_epochs={max_epochs}: one epoch holds all rounds; set trainer.max_steps (the number "
            "of rounds) and model.local_epochs (local passes per round) instead"
        )


def gather_metrics(metrics: TaskMetrics) -> TaskMetrics:
    """``metrics`` merged by state over all processes (itself outside a process group); the states travel
    as plain tensors (:meth:`TaskMetrics.state_tensors`), not as pickled modules."""
    if not is_distributed():
        return metrics
    merged = metrics.clone()
    for part in all_gather_objects(metrics.state_tensors()):
        merged.merge(TaskMetrics.from_state_tensors(metrics.task, metrics.num_classes, part))
    return merged
