"""FedAvg (McMahan et al., 2017)."""

from __future__ import annotations

from fl_lightning.api import Strategy, register_strategy


@register_strategy
class FedAvg(Strategy):
    """Federated averaging, McMahan et al. (2017), Alg. 1, in the FedOpt form (Reddi et al., 2021).

    Each sampled client ``k`` starts from ``w^t`` and runs local SGD on its data; the server sets

    .. math:: w^{t+1} = w^t - \\eta_s \\Big(w^t - \\sum_{k \\in S_t} \\tfrac{n_k}{n_S} w_k^{t}\\Big)

    which with the default server learning rate ``eta_s = 1`` is the weighted average of the
    clients' models. All behaviour is the :class:`Strategy` default.

    Args:
        server_lr: Server learning rate ``eta_s`` on the pseudo-gradient.
    """

    name = "fedavg"
    vectorizable = True
