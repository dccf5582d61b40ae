"""VHL (Tang et al., CVPR 2022): virtual homogeneity learning with a shared virtual dataset."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fl_lightning.api import ClientContext, RunSpec, Strategy, register_strategy
from fl_lightning.errors import ConfigError, check_number
from fl_lightning.functional.representation import FeatureTap, features_of, last_linear
from fl_lightning.functional.synthetic import virtual_contrastive_loss, virtual_dataset
from fl_lightning.functional.tensor import Payload

_TAP = "vhl/tap"
#: ``ctx.scratch`` key of the last virtual batch's indices into the virtual dataset (for tests and logs).
VIRTUAL_INDEX = "vhl/index"


@register_strategy
class VHL(Strategy):
    """VHL, Tang et al., "Virtual Homogeneity Learning: Defending against Data Heterogeneity in
    Federated Learning" (CVPR 2022), Sec. 4.

    Every client holds the same **virtual dataset** ``D_v`` (``virtual_per_class`` samples per class,
    labelled in the natural label space), generated once from a fixed untrained generator fed with
    class-conditional noise and a shared seed (:func:`~fl_lightning.functional.synthetic.virtual_dataset`),
    identical on every client and in every round, and never communicated. Each local step draws a
    virtual batch ``(x_v, y_v)`` the size of the natural batch ``(x, y)`` and minimises

    .. math:: \\mathrm{CE}(f(x), y) + \\mathrm{CE}(f(x_v), y_v)
              + \\lambda\\, \\mathcal{L}_{SupCon}\\big(h(x), y;\\; h(x_v), y_v\\big)

    the natural loss, the virtual loss (the shared, homogeneous part of every client's data) and the
    feature calibration that aligns the conditional distribution of natural features ``h(x) | y`` with
    the virtual one (the paper's conditional-distribution-mismatch penalty, realised as a supervised
    contrastive loss with natural anchors and same-class virtual positives:
    :func:`~fl_lightning.functional.synthetic.virtual_contrastive_loss`). ``h`` is the input of the
    network's last linear layer. The server aggregates as FedAvg.

    **Simplifications** (stated in the recipe README): the paper's virtual data come from an untrained
    StyleGAN; here the untrained generator is one fixed random linear map followed by ``tanh``. The
    alignment is applied at every local step (the FedCOG appendix's "5 epochs of feature alignment" is
    not defined in either paper's text available to us). Multiclass tasks only.

    Args:
        lam: Weight ``lambda`` of the feature calibration (FedCOG Appendix A.2.1: 1.0).
        virtual_per_class: Virtual samples per class.
        noise_dim: Dimension of the class-conditional noise of the virtual generator.
        noise_std: Standard deviation of that noise around each class mean.
        temperature: Temperature of the contrastive calibration (SupCon's 0.07).
        seed: Seed of the virtual dataset (the same on every client; change it to draw another one).
        server_lr: Server learning rate on the pseudo-gradient.
    """

    name = "vhl"
    changes_gradients = True
    prepares_clients = True

    def __init__(
        self,
        lam: float = 1.0,
        virtual_per_class: int = 100,
        noise_dim: int = 64,
        noise_std: float = 0.5,
        temperature: float = 0.07,
        seed: int = 0,
        server_lr: float = 1.0,
    ) -> None:
        super().__init__(server_lr=server_lr)
        check_number(
            lam, "model.strategy.lam", low=0, hint="(feature calibration weight; FedCOG's baseline: 1.0)"
        )
        check_number(
            virtual_per_class, "model.strategy.virtual_per_class", low=1, hint="(virtual samples per class)"
        )
        check_number(noise_dim, "model.strategy.noise_dim", low=1, hint="(virtual generator noise dimension)")
        check_number(noise_std, "model.strategy.noise_std", low=0, hint="(spread of each virtual class)")
        check_number(temperature, "model.strategy.temperature", low=0, low_open=True, hint="(SupCon: 0.07)")
        self.lam = lam
        self.virtual_per_class = int(virtual_per_class)
        self.noise_dim = int(noise_dim)
        self.noise_std = noise_std
        self.temperature = temperature
        self.seed = int(seed)
        self._virtual: dict[tuple[Any, ...], tuple[Tensor, Tensor]] = {}

    def virtual_data(self, input_shape: tuple[int, ...], num_classes: int) -> tuple[Tensor, Tensor]:
        """The virtual dataset ``(x_v, y_v)`` on the CPU (deterministic in the seed; cached)."""
        key = (tuple(input_shape), num_classes)
        if key not in self._virtual:
            self._virtual[key] = virtual_dataset(
                num_classes, self.virtual_per_class, input_shape, self.seed, self.noise_dim, self.noise_std
            )
        return self._virtual[key]

    def check(self, model: nn.Module, spec: RunSpec) -> None:
        super().check(model, spec)
        if spec.task.multilabel:
            raise ConfigError(
                "model.strategy=VHL supports multiclass data only (its virtual data has one label per "
                "sample); choose another strategy for multilabel data"
            )

    def on_client_start(self, module: nn.Module, ctx: ClientContext) -> None:
        super().on_client_start(module, ctx)
        if self.lam != 0:
            FeatureTap(module, ctx.scratch, _TAP)

    def local_loss(self, module: nn.Module, ctx: ClientContext, batch: Any, outputs: Tensor) -> Tensor | None:
        """``CE(f(x_v), y_v) + lam * SupCon(h(x), y; h(x_v), y_v)`` on a fresh virtual batch."""
        x, y = batch[0], batch[1]
        tap: FeatureTap | None = ctx.scratch.get(_TAP)
        z = tap.features_for(outputs) if tap is not None and outputs is not None else None
        if z is None and self.lam != 0:
            z, _ = features_of(module, x)
        xv_all, yv_all = self.virtual_data(tuple(x.shape[1:]), last_linear(module).out_features)
        idx = torch.randint(len(yv_all), (int(x.shape[0]),))  # the client's stream (seeded by the loop)
        ctx.scratch[VIRTUAL_INDEX] = idx
        xv, yv = xv_all[idx].to(x.device, x.dtype), yv_all[idx].to(y.device)
        zv, logits_v = features_of(module, xv)
        loss = F.cross_entropy(logits_v.float(), yv)
        if self.lam != 0:
            loss = loss + self.lam * virtual_contrastive_loss(z.float(), y, zv.float(), yv, self.temperature)
        return loss

    def upload(self, module: nn.Module, ctx: ClientContext) -> Payload:
        FeatureTap.release(ctx.scratch, _TAP)
        return super().upload(module, ctx)

    def extra_repr(self) -> str:
        return (
            f"lam={self.lam}, virtual_per_class={self.virtual_per_class}, temperature={self.temperature}, "
            f"seed={self.seed}, server_lr={self.server_lr}"
        )
