"""A Flower ``ServerApp`` that fits an fl_lightning config with its clients on Flower's SuperNodes.

The ServerApp builds the run exactly as ``python -m fl_lightning fit --config <config>`` does (Trainer,
``FederatedModule``, data, callbacks, logger) and fits it; the only difference is where the clients' local
work runs: :class:`~fl_lightning.flower.executor.FlowerExecutor` sends it through the ServerApp's grid.
So every policy of a round (sampling, attack, failure tolerance, ``max_failed_rounds``, a DP budget's
stop, resume with ``ckpt_path``) is the engine's, and the run writes the same
``lightning_logs/version_N-<label>`` (TensorBoard tags, ``checkpoints/last.ckpt``, ``summary.json``) as
``fit``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fl_lightning.errors import ConfigError, RunError
from fl_lightning.flower.client_app import CONFIG_KEY
from fl_lightning.flower.executor import FlowerExecutor
from fl_lightning.flower.federation import load_run
from fl_lightning.lightning.console import console
from fl_lightning.lightning.module import FederatedModule

log = logging.getLogger("fl_lightning")

#: Run-config keys (``[tool.flwr.app.config]`` or ``flwr run --run-config``) the ServerApp reads:
#: rounds (else the config's ``trainer.max_steps``), where to save the final global model, a checkpoint
#: to resume from, the folder of the run's ``lightning_logs`` (``trainer.default_root_dir``; else the
#: ServerApp's working folder), the seconds a round's exchange waits for its replies (0: no limit).
ROUNDS_KEY, SAVE_KEY, CKPT_KEY, ROOT_KEY = "num-server-rounds", "save-path", "ckpt-path", "root-dir"
TIMEOUT_KEY = "round-timeout"
#: Seconds a round's training (or an evaluation) waits for a node's reply when the run config says nothing.
DEFAULT_TIMEOUT = 300.0

#: Called with the fitted module (its ``client`` is the final global model, ``history`` the rounds).
OnEnd = Callable[[FederatedModule], None]


def fit_on_grid(
    grid: Grid,
    config: str | Path,
    overrides: Sequence[str] = (),
    root: str | Path | None = None,
    num_rounds: int | None = None,
    ckpt_path: str | None = None,
    wait_for_nodes: float = 600.0,
    timeout: float | None = None,
) -> FederatedModule:
    """Fit the run of ``config`` (+ ``overrides``) with its clients' work on ``grid``'s nodes.

    Args:
        grid: The ServerApp's grid.
        config: The YAML of ``python -m fl_lightning fit --config``.
        overrides: Command-line style overrides (``--trainer.max_steps=3``,
            ``--trainer.default_root_dir=...``).
        root: Folder a relative ``config`` is relative to.
        num_rounds: Rounds to run (None: the config's ``trainer.max_steps``).
        ckpt_path: Resume from this checkpoint of an earlier run of the same config.
        wait_for_nodes: Seconds to wait for a SuperNode of every partition.
        timeout: Seconds a round's training (or an evaluation) waits for the nodes' replies; a client
            without a reply by then failed in that round (None: no limit; a node whose process died fails
            once Flower's SuperLink misses its heartbeats).

    Returns:
        The fitted module.
    """
    extra = [f"--trainer.max_steps={num_rounds}"] if num_rounds else []
    with console():
        run = load_run(config, [*overrides, *extra], root)
        module = run.model
        tolerate = module.engine.config.tolerate_client_failures
        executor = FlowerExecutor(
            grid, wait_for_nodes=wait_for_nodes, timeout=timeout, tolerate_failures=tolerate
        )
        module.use_executor(executor)
        data = run.datamodule
        data.setup("fit")
        executor.discover(data.num_clients)  # before fit: which clients bring their own data
        if any(executor.node_data.values()):
            # the config's split is not what the clients train on: no partition picture of it
            module._log_partition = lambda dm: None  # type: ignore[method-assign]
        run.trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
    return module


def server_app(
    config: str | Path | None = None,
    overrides: Sequence[str] = (),
    root: str | Path | None = None,
    num_rounds: int | None = None,
    wait_for_nodes: float = 600.0,
    on_end: OnEnd | None = None,
) -> ServerApp:
    """The Flower ``ServerApp`` of an fl_lightning config (see :func:`fit_on_grid`).

    With a run-config ``save-path`` it saves the final global model's ``state_dict`` there
    (``torch.save``); ``ckpt-path`` resumes an earlier run's checkpoint; ``root-dir`` is where the run's
    ``lightning_logs/version_N`` goes; ``round-timeout`` is the seconds a round waits for a node's reply
    (default :data:`DEFAULT_TIMEOUT`; 0: no limit).

    Args:
        config: The YAML of ``python -m fl_lightning fit --config``. The run config's ``config``
            (``[tool.flwr.app.config]``, ``flwr run --run-config``) takes precedence.
        overrides: Command-line style overrides applied after the file (``--trainer.max_steps=3``).
        root: Folder a relative ``config`` is relative to (a Flower app passes its own folder).
        num_rounds: Rounds to run; None: the run config's ``num-server-rounds``, else the config's
            ``trainer.max_steps``.
        wait_for_nodes: Seconds to wait for a SuperNode of every partition.
        on_end: Called at the end with the fitted module (e.g. to keep the model).
    """
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        path = context.run_config.get(CONFIG_KEY, config)
        try:
            if path is None:
                raise ConfigError(
                    f'flower: no fl_lightning config; set [tool.flwr.app.config] {CONFIG_KEY} = "<file>.yaml"'
                )
            rounds = num_rounds or int(context.run_config.get(ROUNDS_KEY, 0)) or None
            ckpt = context.run_config.get(CKPT_KEY) or None
            where = context.run_config.get(ROOT_KEY)
            extra = [f"--trainer.default_root_dir={where}"] if where else []
            limit = float(context.run_config.get(TIMEOUT_KEY, DEFAULT_TIMEOUT))
            module = fit_on_grid(
                grid, str(path), [*overrides, *extra], root, rounds, ckpt, wait_for_nodes, limit or None
            )
        except (ConfigError, RunError) as err:
            log.error("error: %s", err)
            raise
        save = context.run_config.get(SAVE_KEY)
        if save:
            torch.save(module.client.state_dict(), str(save))
            log.info("final global model saved to %s", save)
        if on_end is not None:
            on_end(module)

    return app
