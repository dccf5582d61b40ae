"""The server: a LightningModule whose training step is one federated round."""

from __future__ import annotations

import copy
import itertools
import logging
from typing import Any, Literal

import torch
from jsonargparse import lazy_instance
from lightning.pytorch import LightningModule
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_only
from torch import Tensor

from fl_lightning.callbacks.base import FederatedCallback
from fl_lightning.core.attack import SimulatedAttack, as_attack
from fl_lightning.core.checkpoint import check_resume, hyperparameters
from fl_lightning.core.client import ClientModule
from fl_lightning.core.distributed import all_gather_objects, assign_clients, is_distributed
from fl_lightning.core.local import LocalConfig, evaluate
from fl_lightning.core.metrics import TaskMetrics
from fl_lightning.core.round import FederatedLoop, num_sampled, sample_clients, timed
from fl_lightning.core.state import ClientStateStore
from fl_lightning.core.types import ClientResult, RoundResult
from fl_lightning.data.datasets import is_synthetic
from fl_lightning.data.federated import FederatedDataModule
from fl_lightning.data.viz import counts_markdown, partition_heatmap
from fl_lightning.errors import ConfigError, RunError, check_number
from fl_lightning.functional.tensor import derive_seed, load_tensors, to_device
from fl_lightning.strategies.base import Strategy
from fl_lightning.strategies.fedavg import FedAvg

log = logging.getLogger("fl_lightning")

#: Prefix of the per-client scalars, ``z_client/<id>/<metric>``: TensorBoard orders tag groups by name,
#: and the ``z`` puts the many per-client cards after the run-level groups (``global``, ``personal``,
#: ``round``, ``test``, ``train``) instead of first. Plain characters, valid for every Lightning logger.
CLIENT_PREFIX = "z_client"

_EVAL_STREAM = 0xE7A  # seed stream of the clients sampled for evaluation (model.eval_fraction)
_SMALL_MODEL = 1_000_000  # parameters; below this a CPU process trains on one intra-op thread by default
_DEFAULT_CLIENT = lazy_instance(ClientModule)
_DEFAULT_STRATEGY = lazy_instance(FedAvg)


class FederatedModule(LightningModule):
    """Federated training as a LightningModule: one training step is one round.

    The global model is ``self.client`` (a :class:`~fl_lightning.core.client.ClientModule`); its
    parameters are those of the server optimizer, which the strategy provides and which is stepped
    once per round with the pseudo-gradient ``w - mean_k(w_k)`` (FedOpt framing). So
    ``trainer.max_steps`` is the number of rounds, ``trainer.global_step`` is the number of rounds
    done, validation after each round evaluates the global model on the global test set
    (``global/*``), and ModelCheckpoint, EarlyStopping and LearningRateMonitor work per round.

    Args:
        client: The client LightningModule: network, task loss, local optimizer.
        strategy: The federated algorithm (FedAvg, FedProx, ...).
        attack: Simulated malicious clients (null: none), e.g. ``{kind: sign_flip, fraction: 0.2,
            scale: 1.0}``: ``round(fraction * num_clients)`` clients, drawn from the run seed, send
            ``w^t - scale * Delta_k`` (``sign_flip``) or ``w^t + scale * Delta_k`` (``scale``) instead of
            their update ``Delta_k``. Works with any strategy; test a defence with ``model.strategy``
            Median, TrimmedMean, Krum or NormBounded.
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
            :class:`~fl_lightning.errors.RunError` that quotes the first client's error.
        seed: Seed of client sampling and of every client's RNG stream (batch order, dropout). On
            the command line it is ``seed_everything`` (linked; not a separate option).
        state_memory_mb: Memory budget of the per-client state store in MiB; states of the least
            recently trained clients beyond it are kept on disk (None: all in memory).
        state_dir: Folder for spilled client states (default: a temporary folder).
        threads_per_process: Intra-op threads of each CPU process. None sets 1 when several CPU
            processes share the machine (``--trainer.devices N`` on CPU) or when the model is small
            (fewer than 1M parameters: with two threads the zero-config run's rounds took 9x longer
            than with one while other work kept the cores busy, and were 13% shorter on an idle
            machine), and leaves torch's default otherwise. See benchmarks/scaling.py.
        compile: Compile the clients' network with ``torch.compile`` (once per run; the strategy
            hooks and the optimizer stay eager). ``true``: mode ``reduce-overhead`` on a GPU (CUDA
            graphs, for the launch-bound small-batch steps of federated clients) and ``default`` on
            CPU; or a mode name. Results equal eager training within float tolerance. With
            ``vectorize`` > 1 the vectorised group's forward (vmap over the stacked parameters) is
            compiled instead.
        vectorize: Train up to this many of a round's clients together as one batched computation
            (``torch.func.vmap`` over stacked parameters; each process its own share under DDP): the
            same results as one at a time within float tolerance, faster where a client's small-batch
            step is launch-bound (GPUs). 1 (default): one client at a time. Strategies
            or models that cannot be vectorised (see README, "Vectorised clients") train one at a time
            with a one-line notice.
        vectorize_memory_gb: Device memory budget in GiB of a vectorised group; the group size is
            ``vectorize`` or fewer clients to fit (an estimate from the model size and one forward's
            saved activations). None: 80% of the free memory of a CUDA device, no bound on the CPU.
    """

    def __init__(
        self,
        client: ClientModule = _DEFAULT_CLIENT,
        strategy: Strategy = _DEFAULT_STRATEGY,
        attack: SimulatedAttack | None = None,
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
        seed: int = 0,
        state_memory_mb: float | None = None,
        state_dir: str | None = None,
        threads_per_process: int | None = None,
        compile: bool | Literal["default", "reduce-overhead", "max-autotune"] = False,
        vectorize: int = 1,
        vectorize_memory_gb: float | None = None,
    ) -> None:
        super().__init__()
        check_number(
            participation,
            "model.participation",
            low=0,
            high=1,
            low_open=True,
            hint="e.g. 0.1 samples 10% of clients",
        )
        if local_steps is None and local_epochs < 1:
            raise ConfigError(f"model.local_epochs={local_epochs} must be >= 1 (or set model.local_steps)")
        if local_steps is not None and local_steps < 1:
            raise ConfigError(f"model.local_steps={local_steps} must be >= 1")
        check_number(
            lr_decay, "model.lr_decay", low=0, high=1, low_open=True, hint="the papers use 0.998 per round"
        )
        if grad_clip_norm is not None:
            check_number(
                grad_clip_norm, "model.grad_clip_norm", low=0, low_open=True, hint="or null: no clipping"
            )
        check_number(seed, "model.seed", low=0, hint="e.g. 0")
        if max_failed_rounds < 1:
            raise ConfigError(f"model.max_failed_rounds={max_failed_rounds} must be >= 1 (default 3)")
        if state_memory_mb is not None:
            check_number(state_memory_mb, "model.state_memory_mb", low=0, hint="or null for no limit")
        if threads_per_process is not None and threads_per_process < 1:
            raise ConfigError(f"model.threads_per_process={threads_per_process} must be >= 1 (or null)")
        if compile not in (False, True, "default", "reduce-overhead", "max-autotune"):
            raise ConfigError(
                f"model.compile={compile!r} must be true, false or a torch.compile mode "
                "(default, reduce-overhead, max-autotune)"
            )
        if isinstance(vectorize, bool) or not isinstance(vectorize, int) or vectorize < 1:
            raise ConfigError(
                f"model.vectorize={vectorize!r} must be an integer >= 1 (1: one client at a time)"
            )
        if vectorize_memory_gb is not None:
            check_number(
                vectorize_memory_gb,
                "model.vectorize_memory_gb",
                low=0,
                low_open=True,
                hint="or null: automatic",
            )
        if eval_clients_every < 0:
            raise ConfigError(f"model.eval_clients_every={eval_clients_every} must be >= 0")
        check_number(
            eval_fraction, "model.eval_fraction", low=0, high=1, low_open=True, hint="e.g. 0.1 evaluates 10%"
        )
        attack = as_attack(attack)
        # The CLI builds fresh objects from the config; from Python the defaults are shared objects,
        # so give each module its own.
        self.client = ClientModule() if client is _DEFAULT_CLIENT else client
        self.strategy = FedAvg() if strategy is _DEFAULT_STRATEGY else strategy
        self.automatic_optimization = False
        self.eval_clients_every = eval_clients_every
        self.eval_fraction = eval_fraction
        self.seed = seed
        self.max_failed_rounds = max_failed_rounds
        self.loop = FederatedLoop(
            LocalConfig(
                0,
                local_epochs,
                local_steps,
                lr_decay,
                grad_clip_norm,
                seed,
                compile,
                vectorize,
                vectorize_memory_gb,
            ),
            participation,
            clients_per_round,
            tolerate_client_failures,
            attack,
        )
        budget = None if state_memory_mb is None else int(state_memory_mb * 2**20)
        self.store = ClientStateStore(budget, state_dir)
        self.threads_per_process = threads_per_process
        self.history: list[dict[str, Any]] = []
        self.client_eval: dict[int, dict[str, float]] = {}
        self._client_eval_round = -1
        self._checkpoint_rounds = 0
        self._ready = False
        self.global_metrics: TaskMetrics | None = None
        self.client_metrics: TaskMetrics | None = None

    # ------------------------------------------------------------------------------ wiring
    @property
    def datamodule(self) -> FederatedDataModule:
        dm = getattr(self.trainer, "datamodule", None)
        if not isinstance(dm, FederatedDataModule):
            raise ConfigError("data must be a fl_lightning FederatedDataModule (set `data:` in the config)")
        return dm

    @property
    def worker(self) -> ClientModule:
        """The working copy trained for each client in turn (not part of the checkpoint)."""
        w = self.__dict__.get("_worker")
        if w is None or next(w.parameters()).device != self.device:
            w = copy.deepcopy(self.client)
            w.to(self.device)
            self.__dict__["_worker"] = w
        return w

    def configure_callbacks(self) -> list:
        """No callbacks; refuses the Trainer options a federated round cannot honour (see below).

        Lightning calls this hook before it checks its own configuration, so the error here names
        the federated equivalent instead of Lightning's "not supported for manual optimization".
        """
        if self.trainer.state.fn == TrainerFn.FITTING:
            check_trainer_options(self.trainer)
        return []

    def setup(self, stage: str) -> None:
        if self._ready:
            return
        threads = self.threads_per_process
        if threads is None and self.trainer.strategy.root_device.type == "cpu":
            small = sum(p.numel() for p in self.client.parameters()) < _SMALL_MODEL
            if self.trainer.num_devices > 1 or small:
                threads = 1
        if threads is not None:
            torch.set_num_threads(threads)
        dm = self.datamodule
        dm.setup(stage)
        self._check_model(dm)
        self.loop.config.batch_size = dm.batch_size
        self.loop.sample(dm.num_clients, 0)  # validates clients_per_round against the federation
        self.strategy.setup(self.client, dm.num_clients)
        if self.loop.attack is not None:
            log.info("model.attack: clients %s are malicious", sorted(self.loop.malicious(dm.num_clients)))
        self.global_metrics = TaskMetrics.for_task(dm.task, dm.num_classes)
        self.client_metrics = TaskMetrics.for_task(dm.task, dm.num_classes)
        self._ready = True

    def _check_model(self, dm: FederatedDataModule) -> None:
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
        return self.strategy.configure_server_optimizer(
            [p for p in self.client.parameters() if p.requires_grad]
        )

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
        if self.loop.config.vectorize > 1 and self.device.type != "cuda":
            log.info("model.vectorize: peak device memory (round/peak_memory_gb) is logged on CUDA only")
        if self.global_step == 0:
            self._log_partition(dm)

    def training_step(self, batch: Any, batch_idx: int) -> None:
        round_idx = self.global_step
        watch = timed()
        sampled = self.loop.sample(self.datamodule.num_clients, round_idx, self.strategy)
        reason = self.strategy.stop_reason(round_idx)
        if reason:  # e.g. resumed past a privacy budget: nothing has run, the checkpoint is untouched
            raise RunError(f"round {round_idx} cannot run: {reason}")
        self._call_federated("on_round_start", round_idx, sampled)

        def on_client_end(index: int, total: int, res: ClientResult | None) -> None:
            self._call_federated("on_client_end", round_idx, index, total, res)

        assigned = None
        if self.trainer.world_size > 1:
            sizes = {c: self.datamodule.clients[c].num_samples for c in sampled}
            assigned = assign_clients(sampled, sizes, self.trainer.world_size)[self.global_rank]
        res = self.loop.run_round(
            round_idx,
            self.client,
            self.worker,
            self.strategy,
            self.datamodule.clients,
            self.store,
            precision=self.trainer.precision_plugin,
            eval_metrics=self.client_metrics,
            on_client_end=on_client_end,
            sampled=sampled,
            assigned=assigned,
        )
        if res.info.aggregated:
            self._server_step(res)
        else:
            self._skip_round(round_idx, res)
        record = self._record(round_idx, res, watch())
        self.history.append(record)
        self._log_round(record, res)
        self._call_federated("on_round_end", round_idx, record)
        self._check_stop(round_idx + 1)

    def _check_stop(self, next_round: int) -> None:
        """End fit after this round if the strategy says ``next_round`` must not run (a spent budget).

        ``trainer.should_stop`` lets Lightning finish the round as usual (validation, ``last.ckpt``,
        summary) and run no further one.
        """
        if 0 <= self.trainer.max_steps <= next_round:
            return
        reason = self.strategy.stop_reason(next_round)
        if reason:
            log.warning("stopping after round %d (%d rounds done): %s", next_round - 1, next_round, reason)
            self.trainer.should_stop = True

    def _skip_round(self, round_idx: int, res: RoundResult) -> None:
        """A round in which every sampled client failed: no server update, but the round counts.

        ``trainer.global_step`` (the round index) counts server optimizer steps, so the step is taken
        with every gradient None: torch's SGD and Adam skip such parameters (weights, momentum
        buffers and step counts unchanged). With a GradScaler, whose ``step`` refuses an optimizer
        without gradients, only the step counter moves. After ``max_failed_rounds`` consecutive
        skipped rounds (counted from the history, so it survives a resume) the run stops.
        """
        failed = 1 + sum(1 for _ in itertools.takewhile(lambda r: r.get("skipped"), reversed(self.history)))
        if failed >= self.max_failed_rounds:
            raise RunError(
                f"round {round_idx}: every sampled client failed for {failed} consecutive rounds "
                f"(last error: {res.error}); see the warnings above, fix the cause or raise "
                f"model.max_failed_rounds={self.max_failed_rounds}"
            )
        log.warning(
            "round %d skipped: every sampled client failed (%s); global model unchanged (%d of "
            "model.max_failed_rounds=%d consecutive)",
            round_idx,
            res.error,
            failed,
            self.max_failed_rounds,
        )
        opt = self.optimizers()
        opt.zero_grad(set_to_none=True)
        if getattr(self.trainer.precision_plugin, "scaler", None) is None:
            opt.step()
        else:
            opt._on_before_step()
            opt._on_after_step()

    def _server_step(self, res: RoundResult) -> None:
        opt = self.optimizers()
        opt.zero_grad(set_to_none=True)
        self.strategy.server_update(self.client, res.means, res.info)
        scaler = getattr(self.trainer.precision_plugin, "scaler", None)
        if scaler is not None:  # 16-mixed: the pseudo-gradient is unscaled; pre-scale so unscale_ restores it
            for p in self.client.parameters():
                if p.grad is not None:
                    p.grad.mul_(scaler.get_scale())
        opt.step()
        self.strategy.on_after_server_step(self.client, res.means, res.info)

    def _record(self, round_idx: int, res: RoundResult, seconds: float) -> dict[str, Any]:
        lr = self.loop.config.lr_decay**round_idx * self.client.lr
        reported = dict(self.strategy.round_metrics())
        return {
            "round": round_idx,
            "clients": len(res.info.sampled),
            "failed": len(res.failed),
            "bytes_down": res.bytes_down,
            "bytes_up": res.bytes_up,
            "time_s": seconds,
            "client_lr": lr,
            "skipped": not res.info.aggregated,
            **res.train_metrics,
            **({"strategy": reported} if reported else {}),  # e.g. privacy/epsilon
            **({} if res.peak_memory_gb is None else {"peak_memory_gb": res.peak_memory_gb}),
            "this_run": True,
        }

    def _log_round(self, record: dict[str, Any], res: RoundResult) -> None:
        self.log_dict(
            {
                "round/time_s": record["time_s"],
                "round/bytes_down": float(record["bytes_down"]),
                "round/bytes_up": float(record["bytes_up"]),
                "round/clients": float(record["clients"]),
                "round/failed_clients": float(record["failed"]),
                "round/client_lr": record["client_lr"],
                **({"round/peak_memory_gb": record["peak_memory_gb"]} if "peak_memory_gb" in record else {}),
            },
            on_step=True,
            on_epoch=False,
            batch_size=1,
        )
        if record.get("strategy"):
            self.log_dict(record["strategy"], on_step=True, on_epoch=False, batch_size=1)
        train = {f"train/{k.removeprefix('train_')}": v for k, v in res.train_metrics.items()}
        if train:
            self.log_dict(train, on_step=True, on_epoch=False, batch_size=1, prog_bar=True)
        per_client = {
            f"{CLIENT_PREFIX}/{cid}/{k}": float(v)
            for cid, m in res.client_metrics.items()
            for k, v in m.items()
            if k != "num_samples"
        }
        self._log_direct(per_client, step=record["round"] + 1)
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

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = to_device(batch, self.device)
        self.global_metrics.update(self.client(x).float(), y)

    def on_validation_epoch_end(self) -> None:
        self._log_eval("global")

    def on_test_epoch_start(self) -> None:
        self.global_metrics.reset()

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.validation_step(batch, batch_idx)

    def on_test_epoch_end(self) -> None:
        self._log_eval("test")

    def predict_step(self, batch: Any, batch_idx: int) -> dict[str, Tensor]:
        """The global model on a batch of inputs: ``outputs`` (logits) and ``predictions``.

        Predictions are the arg-max class (multiclass) or the labels with a positive logit, i.e.
        probability above 0.5 (multilabel). ``python -m fl_lightning predict --ckpt_path ...`` runs
        it over the global test inputs (:meth:`FederatedDataModule.predict_dataloader`); add a
        ``BasePredictionWriter`` callback to save the results.
        """
        x = batch[0] if isinstance(batch, (list, tuple)) else batch
        outputs = self.client(x)
        preds = outputs.argmax(dim=-1) if self.client.task == "multiclass" else (outputs > 0).long()
        return {"outputs": outputs, "predictions": preds}

    def _log_eval(self, prefix: str) -> None:
        values = {f"{prefix}/{k}": v for k, v in gather_metrics(self.global_metrics).compute().items()}
        if values:
            self.log_dict(values, prog_bar=prefix == "global", batch_size=1)
            if self.trainer.state.fn == TrainerFn.FITTING:
                self._log_step()
            else:  # a logged `step` would print in validate/test's results table: set Lightning's counter
                self.trainer.fit_loop.epoch_loop._batches_that_stepped = self.rounds_done
        if self.history and prefix == "global" and self.history[-1]["round"] == self.global_step - 1:
            self.history[-1].update(values)
        rounds_done = self.rounds_done
        due = self.eval_clients_every > 0 and rounds_done % self.eval_clients_every == 0
        # trainer.training is False during fit's own validation: test the entry point instead
        if self.trainer.state.fn != TrainerFn.FITTING:
            self.evaluate_clients()
        elif due:
            self.evaluate_clients(clients=self.eval_sample(rounds_done))

    @torch.inference_mode(False)  # strategy.adapt may train (FineTune); validate/test run in inference mode
    @torch.no_grad()
    def evaluate_clients(
        self, lightning_log: bool = True, clients: list[int] | None = None
    ) -> dict[int, dict[str, float]]:
        """Evaluate the deployed model of ``clients`` (default: every client) on its local test split.

        The training data stands in for a client without a test split. The deployed model is the
        global model after ``strategy.personalize`` and ``strategy.adapt`` (identity for
        non-personalised strategies). Logs ``z_client/<id>/<metric>`` and ``personal/<metric>``, the
        latter merged over the evaluated clients by metric state.
        """
        dm = self.datamodule
        dm.to(self.device)  # no-op during fit; after fit or from a checkpoint, the data follows the module
        worker = self.worker
        merged = self.client_metrics.clone()
        per: dict[int, dict[str, float]] = {}
        world, rank = self.trainer.world_size, self.global_rank
        chosen = dm.clients if clients is None else [dm.clients[c] for c in clients]
        for data in chosen[rank::world]:  # each process evaluates its share of the clients
            load_tensors(worker, {k: v for k, v in self.client.state_dict().items() if v.is_floating_point()})
            state = {k: v.to(self.device) for k, v in self.store.get(data.client_id).items()}
            self.strategy.personalize(worker, data.client_id, state)
            self.strategy.adapt(worker, data, state, dm.batch_size)
            metrics = self.client_metrics.clone()
            evaluate(worker, data.eval_batches(dm.eval_batch_size), metrics, self.trainer.precision_plugin)
            per[data.client_id] = metrics.compute()
            merged.merge(metrics)
        per = dict(sorted(kv for part in all_gather_objects(per) for kv in part.items()))
        self.client_eval = per
        self._client_eval_round = self.global_step if clients is None else -1  # a sample: not final
        flat = {f"{CLIENT_PREFIX}/{cid}/{k}": v for cid, m in per.items() for k, v in m.items()}
        self._log_direct(flat, step=self.rounds_done)
        personal = {f"personal/{k}": v for k, v in gather_metrics(merged).compute().items()}
        if personal and lightning_log:
            self.log_dict(personal, batch_size=1)
        elif personal:  # outside a hook where self.log is allowed (e.g. at the end of fit)
            self._log_direct(personal, step=self.rounds_done)
        return per

    def eval_sample(self, round: int) -> list[int] | None:
        """The clients evaluated during fit after ``round`` rounds (None: all, ``eval_fraction=1``)."""
        if self.eval_fraction >= 1:
            return None
        m = self.datamodule.num_clients
        count = num_sampled(m, self.eval_fraction, None)
        return sample_clients(m, count, derive_seed(self.seed, _EVAL_STREAM), round)

    def final_client_metrics(self) -> dict[int, dict[str, float]]:
        """Per-client metrics of the final model (evaluated now if the last evaluation is stale)."""
        if self._client_eval_round != self.global_step:
            self.evaluate_clients(lightning_log=False)
        return self.client_eval

    def teardown(self, stage: str) -> None:
        """Give the data module's training tensors back to the host, as Lightning does with the module."""
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
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

    # ------------------------------------------------------------------------------ checkpoint
    def fingerprint(self) -> dict[str, Any]:
        """Facts a checkpoint must share with the current config to be resumed or evaluated."""
        shapes = {k: list(v.shape) for k, v in self.client.state_dict().items()}
        return {
            **self.datamodule.fingerprint(),
            "model.seed": self.seed,
            "model.strategy": type(self.strategy).__name__,
            "model.client.net": shapes,
        }

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["fl_lightning"] = {
            "fingerprint": self.fingerprint(),
            "hparams": hyperparameters(self),
            "client_state": self.store.state_dict(),
            "history": self.history,
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        fl = checkpoint.get("fl_lightning")
        if fl is None:
            raise ConfigError(
                "ckpt_path: the checkpoint has no fl_lightning state; it was not written by FederatedModule"
            )
        check_resume(self, checkpoint, self.fingerprint())
        self.store.load_state_dict(fl["client_state"])
        self.history = [dict(r, this_run=False) for r in fl["history"]]
        self._checkpoint_rounds = int(checkpoint.get("global_step", 0))


def check_trainer_options(trainer: Any) -> None:
    """Refuse Trainer options that the federated module (manual optimisation) cannot honour.

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
    max_epochs = trainer.fit_loop.max_epochs
    if trainer.max_steps > 0 and max_epochs not in (None, -1, 1):
        raise ConfigError(
            f"trainer.max_epochs={max_epochs}: one epoch holds all rounds; set trainer.max_steps (the number "
            "of rounds) and model.local_epochs (local passes per round) instead"
        )


def gather_metrics(metrics: TaskMetrics) -> TaskMetrics:
    """``metrics`` merged by state over all processes (itself outside a process group)."""
    if not is_distributed():
        return metrics
    merged = metrics.clone()
    for part in all_gather_objects(copy.deepcopy(metrics).cpu()):
        merged.merge(part)
    return merged
