"""A Flower ``ServerApp`` that runs an fl_lightning config's rounds through :class:`FlowerStrategy`."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Result

from fl_lightning.core.local import evaluate
from fl_lightning.errors import ConfigError
from fl_lightning.flower.client_app import CONFIG_KEY
from fl_lightning.flower.federation import Federation, load_federation
from fl_lightning.flower.records import record_to_tensors
from fl_lightning.flower.strategy import FlowerStrategy

log = logging.getLogger("fl_lightning")

#: Run-config keys (``[tool.flwr.app.config]`` or ``flwr run --run-config``) the ServerApp reads.
ROUNDS_KEY, SAVE_KEY = "num-server-rounds", "save-path"

#: Called with the strategy (its ``model`` is the final global model) and Flower's ``Result``.
OnEnd = Callable[[FlowerStrategy, Result], None]


def server_app(
    config: str | Path | None = None,
    overrides: Sequence[str] = (),
    root: str | Path | None = None,
    num_rounds: int | None = None,
    evaluate_global: bool = True,
    wait_for_nodes: float = 600.0,
    on_end: OnEnd | None = None,
) -> ServerApp:
    """The Flower ``ServerApp`` of an fl_lightning config.

    It builds the run from the config (global model initialised under ``seed_everything``, strategy,
    sampling), runs ``num_rounds`` rounds of :class:`FlowerStrategy` and, with a run-config
    ``save-path``, saves the final global model's ``state_dict`` there (``torch.save``).

    Args:
        config: The YAML of ``python -m fl_lightning fit --config``. The run config's ``config``
            (``[tool.flwr.app.config]``, ``flwr run --run-config``) takes precedence.
        overrides: Command-line style overrides applied after the file (``--trainer.max_steps=3``).
        root: Folder a relative ``config`` is relative to (a Flower app passes its own folder).
        num_rounds: Rounds to run; None: the run config's ``num-server-rounds``, else the config's
            ``trainer.max_steps``.
        evaluate_global: Evaluate the global model on the global validation/test split after every
            round (``global/*`` in Flower's result), as ``fit`` does.
        wait_for_nodes: Seconds to wait for a SuperNode of every partition.
        on_end: Called at the end with the strategy and Flower's ``Result`` (e.g. to keep the model).
    """
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        path = context.run_config.get(CONFIG_KEY, config)
        if path is None:
            raise ConfigError(
                f'flower: no fl_lightning config; set [tool.flwr.app.config] {CONFIG_KEY} = "<file>.yaml"'
            )
        fed = load_federation(str(path), overrides, root)
        rounds = num_rounds or int(context.run_config.get(ROUNDS_KEY, 0)) or fed.num_rounds
        strategy = FlowerStrategy(fed, wait_for_nodes=wait_for_nodes)
        result = strategy.start(
            grid,
            strategy.global_arrays(),
            num_rounds=rounds,
            evaluate_fn=global_evaluation(fed) if evaluate_global else None,
        )
        save = context.run_config.get(SAVE_KEY)
        if save:
            torch.save(strategy.model.state_dict(), str(save))
            log.info("final global model saved to %s", save)
        if on_end is not None:
            on_end(strategy, result)

    return app


def global_evaluation(fed: Federation) -> Callable[[int, ArrayRecord], MetricRecord | None]:
    """Flower's ``evaluate_fn``: the global model on the data's validation split (the test set if none)."""
    model = fed.module.client

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        state = record_to_tensors(arrays, fed.device)
        if any(n not in state for n in model.state_dict()):
            return None
        metrics = fed.metrics()
        saved = {n: t.clone() for n, t in model.state_dict().items()}
        model.load_state_dict(state)
        try:
            evaluate(model, fed.data.val_dataloader(), metrics)
        finally:
            model.load_state_dict(saved)
        return MetricRecord({f"global/{k}": v for k, v in metrics.compute().items()})

    return evaluate_fn
