"""LG-FedAvg (Liang et al., 2020): personal representations, a shared head."""

from __future__ import annotations

from torch import nn

from fl_lightning.api import register_strategy
from fl_lightning.functional.representation import head_names
from fl_lightning.functional.tensor import shared_state
from fl_lightning.strategies.fedper import FedPer


@register_strategy
class LGFedAvg(FedPer):
    """LG-FedAvg, Liang et al., "Think Locally, Act Globally: Federated Learning with Local and Global
    Representations" (2020), Sec. 3 and Alg. 1.

    The opposite split of FedPer (whose ``head`` handling it reuses): each client keeps a local
    representation ``l_k`` (the body, never communicated) and all clients share the global layers ``g``
    on top of it. A sampled client receives
    ``g^t`` and trains ``(l_k, g)`` jointly by local SGD; the server averages the global layers only:

    .. math:: (l_k, g_k) \\leftarrow (l_k, g_k) - \\eta \\nabla F_k(l_k, g_k),
              \\qquad g^{t+1} = \\sum_k \\tfrac{n_k}{n} g_k

    Local representations start from the initial model; the deployed model of a client is
    ``(l_k, g^t)``. The paper's optional local pre-training and its auxiliary representation losses are
    not used (as in the FedRep code's ``lg`` baseline, which the filter-decomposition authors adapt).

    Args:
        head: The global layers: a count of last ``nn.Linear`` layers or module names (see
            :func:`fl_lightning.functional.representation.head_names`). The FedRep code shares the last two
            linear layers of its CIFAR CNN (``fc2``, ``fc3``): ``head: 2`` (the default 1 shares the
            classifier only).
        server_lr: Server learning rate on the pseudo-gradient of the global layers.
    """

    name = "lg_fedavg"

    def personal_names(self, model: nn.Module) -> set[str]:
        return set(shared_state(model)) - head_names(model, self.head)
