"""Local-only training: every client trains its own model, nothing is communicated."""

from __future__ import annotations

from torch import nn

from fl_lightning.api import Strategy, register_strategy
from fl_lightning.functional.tensor import shared_state


@register_strategy
class Local(Strategy):
    """The "Local" row of personalised-FL tables (Chen & Qiu, ICML 2025, Sec. 6.1 and Table 2).

    "Each client is trained independently without any communication": every floating-point entry of the
    model is personal (:meth:`personal_names`), so a client in a round where it is sampled continues its
    own model from where it stopped,

    .. math:: w_k \\leftarrow w_k - \\eta \\nabla F_k(w_k)

    for the round's local steps, starting from the initial model ``w^0`` in its first round; messages and
    uploads are empty (0 bytes) and the global model stays ``w^0``. The deployed model of a client is its
    own (per-client evaluation, ``personal/*``); a client never sampled deploys ``w^0``. A client trains
    only in rounds where it is sampled, so every client gets the local work it would get in a federated
    run of the same length (``model.participation: 1.0`` trains every client every round).
    """

    name = "local"

    def personal_names(self, model: nn.Module) -> set[str]:
        return set(shared_state(model))
