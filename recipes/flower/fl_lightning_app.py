"""The Flower app of an fl_lightning config: ``flwr run .`` in this folder runs these two objects.

``config`` in ``[tool.flwr.app.config]`` of pyproject.toml (or ``flwr run . --run-config
'config="other.yaml"'``) names the fl_lightning YAML, relative to this folder. Every SuperNode needs
fl_lightning[flwr] installed and a ``partition-id`` and ``num-partitions`` in its node config: it hosts the
clients whose id is its partition id modulo the number of partitions (one client per node when there are
as many nodes as clients).
"""

from pathlib import Path

from fl_lightning.flower import client_app, server_app

HERE = Path(__file__).resolve().parent
CONFIG = "fedavg_digits_mlp.yaml"

serverapp = server_app(CONFIG, root=HERE)
clientapp = client_app(CONFIG, root=HERE)
