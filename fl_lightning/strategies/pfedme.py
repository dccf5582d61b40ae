"""pFedMe (Dinh et al., NeurIPS 2020): personalised FL with Moreau envelopes."""

from __future__ import annotations

from fl_lightning.api import register_strategy
from fl_lightning.strategies.mixins.moreau import MoreauEnvelope


@register_strategy
class PFedMe(MoreauEnvelope):
    """pFedMe, Dinh, Tran & Nguyen, "Personalized Federated Learning with Moreau Envelopes", Alg. 1.

    Client ``k`` solves ``min_w F_k(w) = min_theta f_k(theta) + lam/2 ||theta - w||^2`` (eqs. 2-3). In
    each of its ``R`` local rounds (``model.local_steps``) it draws a mini-batch ``B``, runs ``K``
    (``personal_steps``) gradient steps on ``f_k(theta; B) + lam/2 ||theta - w_k||^2`` with lr
    ``personal_lr`` to get ``theta~_k`` (eq. 7), then

    .. math:: w_k \\leftarrow w_k - \\eta \\lambda (w_k - \\tilde\\theta_k)

    (line 8; ``eta`` = ``model.client.init_args.lr``, decayed by ``model.lr_decay``). At the start of a
    round ``w_k = theta_k = w_t``. The server mixes ``w_{t+1} = (1 - beta) w_t + beta sum_k (n_k/n) w_k``
    (line 11, weights by training-set size as in the reference code). The personalised model of a
    client is its ``theta~_k`` (``personal/*`` metrics on its local test split). One model each way per
    round, like FedAvg.

    With a CP-factored model the update is the gradient step on ``lam/2 ||theta~ - [[A]]||^2`` instead,
    which for dense layers is the formula above.

    Args:
        lam: ``lambda`` (the paper: 15 on MNIST; TDPFed's comparison: 12 / 14).
        personal_lr: Personalised learning rate (the paper: 0.1 on MNIST).
        personal_steps: ``K``, steps on ``theta`` per local round (5).
        personal_momentum: 0 is the paper's plain gradient step; > 0 uses Nesterov momentum.
        beta: Server mixing coefficient ``beta`` (1 or 2 in the paper).
    """

    name = "pfedme"
