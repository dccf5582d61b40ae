"""Helpers of the Flower tests: an in-process Grid (no Ray) and fl_lightning's own run of a config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from flwr.app import Context, Error, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp

from fl_lightning.cli import FederatedCLI
from fl_lightning.lightning.module import FederatedModule

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "flower" / "fedavg_digits_mlp.yaml"
SCAFFOLD = ["--model.strategy=fl_lightning.strategies.Scaffold"]


class LocalGrid:
    """A Flower ``Grid`` whose nodes are ``ClientApp`` calls in this process (one ``Context`` per node).

    A client that raises replies with an error message, as Flower's runtimes do; the nodes in
    ``fail_train`` raise on every ``train`` message (a crashing client).
    """

    def __init__(self, app: ClientApp, num_nodes: int, node_config: dict[str, Any] | None = None) -> None:
        self.app = app
        self.contexts = {
            1000 + pid: Context(
                run_id=1,
                node_id=1000 + pid,
                node_config={"partition-id": pid, "num-partitions": num_nodes, **(node_config or {})},
                state=RecordDict(),
                run_config={},
            )
            for pid in range(num_nodes)
        }
        self.sent: list[Message] = []
        self.turns: list[list[Message]] = []  # the messages of each send_and_receive
        self.fail_train: set[int] = set()

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def send_and_receive(self, messages: Any, timeout: float | None = None) -> list[Message]:
        replies = []
        messages = list(messages)
        self.turns.append(messages)
        for msg in messages:
            self.sent.append(msg)
            try:
                node = msg.metadata.dst_node_id
                if node in self.fail_train and msg.metadata.message_type == MessageType.TRAIN:
                    raise RuntimeError("the client crashed")
                replies.append(self.app(msg, self.contexts[node]))
            except Exception as err:
                replies.append(Message(Error(code=0, reason=f"{type(err).__name__}: {err}"), reply_to=msg))
        return replies


def fit_run(
    tmp_path: Path, config: Path = RECIPE, overrides: list[str] | None = None, logger: bool = False
) -> FederatedModule:
    """The module after ``python -m fl_lightning fit --config <config> <overrides>`` in ``tmp_path``."""
    quiet = [] if logger else ["--trainer.logger=false", "--trainer.enable_checkpointing=false"]
    cli = FederatedCLI(
        args=[
            "fit",
            "--config",
            str(config),
            *(overrides or []),
            f"--trainer.default_root_dir={tmp_path}",
            "--trainer.enable_progress_bar=false",
            *quiet,
        ]
    )
    return cli.model


def fit_weights(
    tmp_path: Path, config: Path = RECIPE, overrides: list[str] | None = None
) -> dict[str, torch.Tensor]:
    """The global model after ``python -m fl_lightning fit --config <config> <overrides>``."""
    module = fit_run(tmp_path, config, overrides)
    return {k: v.detach().clone() for k, v in module.client.state_dict().items()}


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)
