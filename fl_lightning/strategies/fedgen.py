"""FedGen (Zhu, Hong & Zhou, ICML 2021): data-free knowledge distillation through a latent generator."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from fl_lightning.api import Aggregator, ClientContext, RoundInfo, Strategy, register_strategy
from fl_lightning.errors import check_number
from fl_lightning.functional.distillation import label_counts
from fl_lightning.functional.representation import last_linear, linear_layer_names
from fl_lightning.functional.synthetic import generator_input, label_weighted_heads, train_generator
from fl_lightning.functional.tensor import Payload, derive_seed

GROUP = "fedgen"
_PRIOR = "prior"


@register_strategy
class FedGen(Strategy):
    """FedGen, Zhu, Hong & Zhou, "Data-Free Knowledge Distillation for Heterogeneous Federated
    Learning" (ICML 2021), Sec. 3 and Algorithm 1.

    The network is split into a feature extractor and its classifier ``h`` (the last ``nn.Linear``;
    the latent ``z`` is its input). The server keeps a conditional generator ``G_w(eps, y) -> z``
    (an MLP on ``[eps, one_hot(y)]``, ``eps ~ N(0, I)``) and after each round's FedAvg aggregation
    trains it for ``gen_steps`` Adam steps on (eq. 4)

    .. math:: \\min_w \\; E_{y \\sim \\hat p(y)} E_{\\epsilon} \\;
              \\mathrm{CE}\\big(\\textstyle\\sum_k a_k^y\\, h(G_w(\\epsilon, y); \\theta_k^p),\\; y\\big)

    where ``theta_k^p`` are the classifiers the round's clients uploaded (their local models' last
    layers), ``p_hat(y)`` the label prior from the label counts ``n_k^y`` the clients upload, and
    ``a_k^y = n_k^y / sum_j n_j^y`` (the official code's per-label weights; eq. 4 writes ``1/K``). The
    generator and ``p_hat`` are broadcast with the model; client ``k`` then minimises (eq. 6)

    .. math:: \\hat L_k(\\theta_k) + \\alpha \\; E_{y \\sim \\hat p(y)} E_{\\epsilon}\\;
              \\mathrm{CE}\\big(h(G_w(\\epsilon, y); \\theta_k^p), y\\big)

    with one generated batch (the size of the real batch) per local step; the generator is frozen on
    the client. Before the server has trained the generator once (round 0) nothing is sent and
    clients train as FedAvg.

    Because ``h`` is linear, the ensemble's logits for label ``y`` are those of one classifier,
    ``sum_k a_k^y theta_k^p``; the server builds it from the clients' ``n_k^y`` and heads with the
    streaming mean (:func:`~fl_lightning.functional.synthetic.label_weighted_heads`), so nothing
    per client is stored. Extra communication: the generator and ``p_hat`` down, ``C`` label counts up.

    **Simplifications** (stated in the recipe README): the generator's diversity regulariser and
    the latent-matching KD term of the official code, and the decay of ``alpha`` over rounds, are not
    implemented (the paper's eqs. 4 and 6 have neither); the generator's Adam state starts afresh
    each round. Multiclass tasks only.

    Args:
        alpha: Weight of the generated-latent term in the client loss (eq. 6: 1).
        noise_dim: Dimension of the generator's noise ``eps``.
        hidden: Width of the generator's hidden layer.
        gen_steps: Adam steps of generator training on the server per round.
        gen_batch_size: Generated latents per server step.
        gen_lr: Adam learning rate of the generator.
        seed: Seed of the generator's initialisation and of the server's draws (round-derived).
        server_lr: Server learning rate on the pseudo-gradient.
    """

    name = "fedgen"
    changes_gradients = True

    def __init__(
        self,
        alpha: float = 1.0,
        noise_dim: int = 32,
        hidden: int = 256,
        gen_steps: int = 100,
        gen_batch_size: int = 64,
        gen_lr: float = 1e-3,
        seed: int = 0,
        server_lr: float = 1.0,
    ) -> None:
        super().__init__(server_lr=server_lr)
        check_number(alpha, "model.strategy.alpha", low=0, hint="(weight of the generated term; paper: 1)")
        check_number(noise_dim, "model.strategy.noise_dim", low=1, hint="(generator noise dimension)")
        check_number(hidden, "model.strategy.hidden", low=1, hint="(generator width)")
        check_number(gen_steps, "model.strategy.gen_steps", low=0, hint="(server generator steps per round)")
        check_number(gen_batch_size, "model.strategy.gen_batch_size", low=1, hint="(latents per server step)")
        check_number(gen_lr, "model.strategy.gen_lr", low=0, low_open=True, hint="(Adam lr of the generator)")
        self.alpha = alpha
        self.noise_dim = int(noise_dim)
        self.hidden = int(hidden)
        self.gen_steps = int(gen_steps)
        self.gen_batch_size = int(gen_batch_size)
        self.gen_lr = gen_lr
        self.seed = int(seed)
        self.generator: nn.Module | None = None
        self.head = ""
        self.num_classes = 0

    # ----------------------------------------------------------------------------------- setup
    def setup(self, model: nn.Module, num_clients: int) -> None:
        super().setup(model, num_clients)
        layer = last_linear(model)
        self.head = linear_layer_names(model)[-1]
        self.num_classes, latent = layer.out_features, layer.in_features
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(self.seed, 0))
            self.generator = nn.Sequential(
                nn.Linear(self.noise_dim + self.num_classes, self.hidden),
                nn.ReLU(),
                nn.Linear(self.hidden, latent),
            ).to(layer.weight.device)
        self.register_buffer(_PRIOR, torch.zeros(self.num_classes, device=layer.weight.device))
        self.register_buffer("trained_rounds", torch.zeros((), dtype=torch.long, device=layer.weight.device))

    def message(self, model: nn.Module, client_id: int, round: int) -> Payload:
        """``w^t``, and once the generator was trained: its parameters and the label prior ``p_hat``."""
        msg = super().message(model, client_id, round)
        if self.generator is not None and int(self.trained_rounds) > 0:
            gen = {n: p.detach() for n, p in self.generator.named_parameters()}
            msg[GROUP] = {**gen, _PRIOR: getattr(self, _PRIOR)}
        return msg

    # ------------------------------------------------------------------------------ client side
    def local_loss(self, module: nn.Module, ctx: ClientContext, batch: Any, outputs: Tensor) -> Tensor | None:
        """``alpha * CE(h(z), y)`` on generated latents ``z = G(eps, y)``, ``y ~ p_hat`` (eq. 6)."""
        gen = ctx.message.get(GROUP)
        if gen is None or self.alpha == 0 or self.generator is None:
            return None
        x = batch[0]
        n, device = int(x.shape[0]), x.device
        y = torch.multinomial(gen[_PRIOR].float().cpu(), n, replacement=True).to(device)  # client's stream
        eps = torch.randn(n, self.noise_dim).to(device)
        params = {k: v for k, v in gen.items() if k != _PRIOR}
        with torch.no_grad():
            z = functional_call(self.generator, params, (generator_input(eps, y, self.num_classes),))
        head = last_linear(module)
        return self.alpha * F.cross_entropy(head(z.to(head.weight.dtype)).float(), y)

    def upload(self, module: nn.Module, ctx: ClientContext) -> Payload:
        """The local model and the client's label counts ``n_k^y`` (eq. 4's prior and weights)."""
        payload = super().upload(module, ctx)
        data = ctx.data
        if data is None:
            raise ValueError("FedGen needs the client's data in ctx.data (set by the round loop)")
        counts = label_counts(data.train_labels(), self.num_classes)
        device = next(module.parameters()).device
        return {**payload, GROUP: {"counts": counts.to(device=device, dtype=torch.float32)}}

    # ------------------------------------------------------------------------------ server side
    def aggregator(self) -> Aggregator:
        """The weights by sample count (FedAvg's); the label-weighted heads and counts summed uniformly,
        from each upload as :meth:`ensemble_sums` turns it on the server."""
        return Aggregator(weighting={GROUP: "uniform"}, receive=self.ensemble_sums)

    def ensemble_sums(self, upload: Payload) -> Payload:
        """Per client: ``n_k^y W_k`` and ``n_k^y b_k`` for every label ``y`` (the ensemble's sums)."""
        group = upload.get(GROUP)
        if group is None:
            return upload
        counts = group["counts"].float()
        weight = upload["weights"][f"{self.head}.weight"].float()
        bias = upload["weights"].get(f"{self.head}.bias")
        bias = torch.zeros(weight.shape[0], device=weight.device) if bias is None else bias.float()
        summed = {
            "counts": counts,
            "weight": counts[:, None, None] * weight[None],
            "bias": counts[:, None] * bias[None],
        }
        return {**upload, GROUP: summed}

    def on_after_server_step(self, model: nn.Module, means: Payload, info: RoundInfo) -> None:
        """Train the generator against the round's label-weighted ensemble of uploaded heads (eq. 4)."""
        group = means.get(GROUP)
        if group is None or self.generator is None or float(group["counts"].sum()) <= 0:
            return
        weights, biases = label_weighted_heads(group["counts"], group["weight"], group["bias"])
        prior = group["counts"] / group["counts"].sum()
        device = next(self.generator.parameters()).device
        rng = torch.Generator().manual_seed(derive_seed(self.seed, 1, info.round))
        with torch.enable_grad():
            train_generator(
                self.generator,
                weights.to(device),
                biases.to(device),
                prior,
                self.noise_dim,
                self.gen_steps,
                self.gen_batch_size,
                self.gen_lr,
                rng,
            )
        getattr(self, _PRIOR).copy_(prior.to(device))
        self.trained_rounds += 1

    def extra_repr(self) -> str:
        return (
            f"alpha={self.alpha}, noise_dim={self.noise_dim}, hidden={self.hidden}, "
            f"gen_steps={self.gen_steps}, gen_lr={self.gen_lr}, server_lr={self.server_lr}"
        )
