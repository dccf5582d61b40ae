"""``python -m fl_lightning.flower --config <fit config> [overrides]``: a config through Flower's simulation.

Runs the config's ServerApp and ClientApp with ``flwr.simulation.run_simulation`` (Ray), one SuperNode
per fl_lightning client and ``--cpus-per-client`` CPUs each: the step between fl_lightning's own
simulation and a Flower deployment. Bad input (a missing file, a bad value, no Flower) is one
``error:`` line.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import warnings
from collections.abc import Iterator
from typing import Any

from fl_lightning.errors import ConfigError


@contextlib.contextmanager
def _simulation_notices_left_out() -> Iterator[None]:
    """For the simulation's duration, two notices that are not the user's to act on are not shown.

    Flower 1.42 logs that ``run_simulation`` is deprecated in favour of ``flwr run`` (the README's
    ``flwr run .``), yet it is its only Python API for a simulation; Ray warns that a future release will
    stop hiding GPUs from actors that asked for none (the SuperNodes here ask for none, and train on the
    CPU as they do today). Both are filtered here only, not at import.
    """

    def not_deprecated(record: logging.LogRecord) -> bool:
        return "The `run_simulation` function is deprecated" not in record.getMessage()

    flwr_log = logging.getLogger("flwr")
    flwr_log.addFilter(not_deprecated)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", message="Tip: In future versions of Ray, Ray will no longer", category=FutureWarning
            )
            yield
    finally:
        flwr_log.removeFilter(not_deprecated)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m fl_lightning.flower",
        description="Run an fl_lightning config as a Flower simulation (one SuperNode per client).",
    )
    parser.add_argument("--config", required=True, help="the YAML of `python -m fl_lightning fit --config`")
    parser.add_argument("--cpus-per-client", type=float, default=1.0, help="Ray CPUs per virtual SuperNode")
    parser.add_argument("--save-path", default=None, help="torch.save the final global state_dict here")
    args, overrides = parser.parse_known_args(argv)
    try:
        from fl_lightning.flower import client_app, load_federation, server_app

        fed = load_federation(args.config, overrides)
        from flwr.simulation import run_simulation

        def save(module: Any) -> None:
            if args.save_path:
                import torch

                torch.save(module.client.state_dict(), args.save_path)

        with _simulation_notices_left_out():
            run_simulation(
                server_app(args.config, overrides, on_end=save),
                client_app(args.config, overrides),
                num_supernodes=fed.num_clients,
                backend_config={"client_resources": {"num_cpus": args.cpus_per_client, "num_gpus": 0.0}},
            )
    except (ConfigError, ModuleNotFoundError) as err:
        sys.stderr.write(f"error: {err}\n")
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
