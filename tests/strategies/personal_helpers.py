"""Shared pieces of the personalised-baseline tests: what crossed the network, in both directions."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from fl_lightning.functional.tensor import Payload
from fl_lightning.strategies import Strategy


@dataclass
class Payloads:
    """Copies of every message (server to client) and upload (client to server) of a run."""

    messages: list[tuple[int, int, Payload]] = field(default_factory=list)  # (round, client, payload)
    uploads: list[tuple[int, int, Payload]] = field(default_factory=list)

    def names(self) -> set[str]:
        """Every tensor name that was sent, either way."""
        return {n for _, _, p in self.messages + self.uploads for ts in p.values() for n in ts}

    def tensors(self) -> list[Tensor]:
        return [t for _, _, p in self.messages + self.uploads for ts in p.values() for t in ts.values()]


def record_payloads(strategy: Strategy) -> Payloads:
    """Wrap ``strategy.message`` and ``strategy.upload`` so every payload is copied into the result."""
    seen = Payloads()
    message, upload = strategy.message, strategy.upload

    def copy(payload: Payload) -> Payload:
        return {g: {n: t.detach().clone() for n, t in ts.items()} for g, ts in payload.items()}

    def recorded_message(model, client_id, round):
        out = message(model, client_id, round)
        seen.messages.append((round, client_id, copy(out)))
        return out

    def recorded_upload(module, ctx):
        out = upload(module, ctx)
        seen.uploads.append((ctx.round, ctx.client_id, copy(out)))
        return out

    strategy.message = recorded_message
    strategy.upload = recorded_upload
    return seen


def personal_model(module, client_id: int) -> dict[str, Tensor]:
    """The model ``client_id`` deploys: the global model after ``strategy.personalize``."""
    worker = module.worker
    worker.load_state_dict(module.client.state_dict())
    module.strategy.personalize(worker, client_id, module.store.get(client_id))
    return {n: t.detach().clone() for n, t in worker.state_dict().items()}


def differ(a: dict[str, Tensor], b: dict[str, Tensor], names: set[str]) -> bool:
    return any(not torch.equal(a[n], b[n]) for n in names)
