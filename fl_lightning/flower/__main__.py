"""``python -m fl_lightning.flower``: a config through Flower's simulation, and the tools of a deployment.

- ``python -m fl_lightning.flower --config <fit config> [overrides]``: runs the config's ServerApp and
  ClientApp with ``flwr.simulation.run_simulation`` (Ray), one SuperNode per fl_lightning client and
  ``--cpus-per-client`` CPUs each: the step between fl_lightning's own simulation and a deployment.
- ``python -m fl_lightning.flower keys --out <folder> --nodes <n>``: a test CA, the SuperLink's TLS
  certificate and the SuperNodes' authentication keys (:mod:`fl_lightning.flower.keys`).
- ``python -m fl_lightning.flower clientapp [--runtime-api-address 127.0.0.1:9094]``: the ClientApp
  process kept running beside a SuperNode started with ``--isolation process``
  (:mod:`fl_lightning.flower.runner`).
- ``python -m fl_lightning.flower node-data --config <fit config> --out <folder>``: each client's data of
  the config's split as the files of a node (``<folder>/client-<id>/data.npz``), to try a federation of
  nodes that bring their own data (:mod:`fl_lightning.data.local_files`).

Bad input (a missing file, a bad value, no Flower) is one ``error:`` line and exit status 2.
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

COMMANDS = ("keys", "clientapp", "node-data")


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


def simulate(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m fl_lightning.flower",
        description="Run an fl_lightning config as a Flower simulation (one SuperNode per client). "
        f"Other commands: {', '.join(COMMANDS)} (python -m fl_lightning.flower <command> --help).",
    )
    parser.add_argument("--config", required=True, help="the YAML of `python -m fl_lightning fit --config`")
    parser.add_argument("--cpus-per-client", type=float, default=1.0, help="Ray CPUs per virtual SuperNode")
    parser.add_argument("--save-path", default=None, help="torch.save the final global state_dict here")
    args, overrides = parser.parse_known_args(argv)
    from fl_lightning.flower import client_app, server_app
    from fl_lightning.flower.federation import cached_run

    data = cached_run(args.config, overrides).datamodule  # the number of clients, without the data when set
    if data.num_clients is None:  # one client per user of a natural per-user dataset: known once read
        data.setup("fit")
    from flwr.simulation import run_simulation

    def save(module: Any) -> None:
        if args.save_path:
            import torch

            torch.save(module.client.state_dict(), args.save_path)

    with _simulation_notices_left_out():
        run_simulation(
            server_app(args.config, overrides, on_end=save),
            client_app(args.config, overrides),
            num_supernodes=int(data.num_clients),
            backend_config={"client_resources": {"num_cpus": args.cpus_per_client, "num_gpus": 0.0}},
        )


def keys(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m fl_lightning.flower keys",
        description="Write test credentials for a local secure federation: a CA (ca.pem), the SuperLink's "
        "TLS certificate and key (superlink.pem, superlink.key) and one authentication key pair per "
        "SuperNode (node-<i>.key, node-<i>.pub). For testing only: in production use your organisation's "
        "CA and let each site make its own node key pair.",
    )
    parser.add_argument("--out", required=True, help="the folder to write the files to")
    parser.add_argument("--nodes", type=int, required=True, help="how many SuperNode key pairs")
    parser.add_argument(
        "--host",
        action="append",
        default=[],
        help="another name or IP address the SuperLink is reached by (besides 127.0.0.1 and localhost); "
        "repeat for several",
    )
    parser.add_argument("--days", type=int, default=365, help="validity of the certificates (days)")
    parser.add_argument("--force", action="store_true", help="replace files that exist in --out")
    args = parser.parse_args(argv)
    from fl_lightning.flower.keys import make_keys

    made = make_keys(args.out, args.nodes, args.host, args.days, args.force)
    out = made.ca.parent
    sys.stdout.write(
        f"wrote to {out}/ (for testing: see README.md, 'Deployment with Flower'):\n"
        f"  {made.ca.name}: the test CA; give it to every SuperNode (--root-certificates) and to flwr "
        "(root-certificates)\n"
        f"  {made.cert.name}, {made.key.name}: the SuperLink's certificate and private key\n"
        f"  node-<i>.key: node i's private key (--auth-supernode-private-key), node-<i>.pub: its public "
        f"key (flwr supernode register), i = 0..{args.nodes - 1}\n"
    )


def clientapp(argv: list[str]) -> None:
    from fl_lightning.flower.runner import DEFAULT_RUNTIME_API

    parser = argparse.ArgumentParser(
        prog="python -m fl_lightning.flower clientapp",
        description="Run a SuperNode's ClientApps in this process, kept running between messages: start "
        "it beside `flower-supernode --isolation process` (instead of Flower's flower-superexec, which "
        "starts a flwr-clientapp process per message).",
    )
    parser.add_argument(
        "--runtime-api-address",
        default=DEFAULT_RUNTIME_API,
        help=f"the SuperNode's Runtime API (flower-supernode --port; default {DEFAULT_RUNTIME_API})",
    )
    parser.add_argument(
        "--root-certificates",
        default=None,
        help="CA certificate of a Runtime API served with TLS (flower-supernode --ssl-certfile); without "
        "it, plain HTTP on this machine only",
    )
    parser.add_argument(
        "--insecure", action="store_true", help="plain HTTP to a Runtime API on another machine"
    )
    parser.add_argument("--verbose", action="store_true", help="also log each task")
    args = parser.parse_args(argv)
    from fl_lightning.flower.runner import ClientAppRunner

    runner = ClientAppRunner(args.runtime_api_address, args.root_certificates, args.insecure)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log = logging.getLogger("fl_lightning")
    log.addHandler(handler)
    log.setLevel(logging.INFO if args.verbose else logging.WARNING)
    with contextlib.suppress(KeyboardInterrupt):
        runner.serve()


def node_data(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m fl_lightning.flower node-data",
        description="Write each client's data of a config's split as a node's files "
        "(<out>/client-<id>/data.npz: x, y, x_test, y_test), to try a federation whose nodes bring their "
        "own data (flower-supernode --node-config 'partition-id=<id> data-dir=\"<out>/client-<id>\"').",
    )
    parser.add_argument("--config", required=True, help="the YAML of `python -m fl_lightning fit --config`")
    parser.add_argument("--out", required=True, help="the folder to write client-<id>/data.npz to")
    args, overrides = parser.parse_known_args(argv)
    from fl_lightning.flower.federation import export_node_data

    written = export_node_data(args.config, args.out, overrides)
    sys.stdout.write(f"wrote {len(written)} clients' files: {written[0]} ... {written[-1]}\n")


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = {"keys": keys, "clientapp": clientapp, "node-data": node_data}.get(argv[0] if argv else "")
    try:
        if command is None:
            simulate(argv)
        else:
            command(argv[1:])
    except (ConfigError, ModuleNotFoundError) as err:
        sys.stderr.write(f"error: {err}\n")
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
