"""FedCOG (Ye et al., ICLR 2024): consensus-oriented generation and distillation, on top of any strategy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from fl_lightning.api import ClientContext, Strategy, StrategyWrapper, Vectorizable, register_strategy
from fl_lightning.errors import ConfigError, check_number
from fl_lightning.functional.distillation import (
    complementary_counts,
    generate,
    kd_cycle_order,
    kd_loss,
    kd_weights,
    label_counts,
    log_distribution,
    target_labels,
)
from fl_lightning.functional.representation import frozen, frozen_forward, previous_model, save_previous_model
from fl_lightning.functional.tensor import Payload
from fl_lightning.strategies.fedavg import FedAvg

_SCRATCH = "fedcog"


@dataclass
class _Distillation:
    """One client's generated set for one round, and how to draw its mini-batches."""

    inputs: Tensor
    teacher_log_probs: Tensor
    w_c: float
    w_kd: float
    generator: torch.Generator
    order: Tensor | None = None
    batch_size: int = 0

    def batch(self, step: int, batch_size: int, num_steps: int) -> tuple[Tensor, Tensor]:
        """The generated mini-batch of local step ``step`` (the same for every closure call of a step)."""
        if self.order is None:
            self.batch_size = min(batch_size, len(self.inputs))
            self.order = kd_cycle_order(len(self.inputs), num_steps, self.batch_size, self.generator)
        idx = self.order[step * self.batch_size : (step + 1) * self.batch_size].to(self.inputs.device)
        return self.inputs[idx], self.teacher_log_probs[idx]


@register_strategy
class FedCOG(StrategyWrapper):
    """FedCOG, Ye et al. (2024), Sec. 4 and Algorithm 1: a client-side plug-in for any strategy.

    From round ``start_round`` on, each participating client ``k`` of round ``t``

    1. **generates** ``N`` inputs (Sec. 4.1, eqs. 1-2): ``x ~ N(0, 1)`` in the model's input space,
       optimised with Adam for ``gen_steps`` steps, only ``x`` trainable, for
       ``mean_i CE(f(theta^t; x_i), y_i) + lambda_dis * mean_i (1 - JS(p_global(x_i), p_prev(x_i)))``
       where the targets ``y`` complement the client's label counts ``d``: ``d_hat = max(d) - d``
       (Appendix A.1.1; exactly ``N`` by largest-remainder rounding, uniform for a balanced client) and
       ``theta_k^prev`` is the client's local model at the end of the last round it trained in (the
       global model when it has none: the term is then constant);
    2. **distils** during the base method's local training (Sec. 4.2, eq. 3): each local step's loss
       becomes ``w_c * CE(real batch) + w_kd * KL(p(theta^t; x_b) || p(theta; x_b))`` plus the base
       method's own local term, on a generated mini-batch ``x_b`` whose teacher probabilities were
       cached at the end of generation. ``weighting="fixed"``: ``(w_c, w_kd) = (1, lambda_kd)``;
       ``"balanced"`` (Appendix A.2.2): ``(N_real, N_gen) / (N_real + N_gen)``, ``N_real = |d|_1``,
       ``N_gen = |d_hat|_1``.

    Everything else is the base strategy's: message, local optimizer and steps (with its gradient
    hooks), server update. The upload is the base method's, unchanged (no generated data or label
    counts leave the client: Secure-Aggregation compatible), and aggregation weights are the real
    sample counts. Models' parameters, buffers and train/eval modes are untouched by generation.

    With ``num_generated = 0`` (or ``lambda_kd = 0`` with fixed weighting, or before ``start_round``)
    nothing is generated and no extra randomness is drawn, so training is bit-identical to the base
    method. The client's final local model is kept in its state (``previous/<name>``, off the GPU) in
    every round, so that the first FedCOG round already has it (the paper switches FedCOG on after 50
    rounds of the base method; in its plug-and-play study for one round).

    The client's label counts come from ``ctx.data`` (its own training labels). Multilabel tasks (FLAIR)
    use our extension documented in :mod:`fl_lightning.functional.distillation` (the paper gives no formulas).

    Args:
        base: The strategy FedCOG is plugged into (default FedAvg).
        start_round: First round (0-based) in which clients generate and distil.
        num_generated: ``N``, generated inputs per client and round (paper: 256); 0 disables FedCOG.
        gen_steps: Adam steps of generation (paper: 100).
        gen_lr: Adam learning rate of generation (official code: 0.01, betas (0.5, 0.9)).
        gen_batch_size: Inputs per forward pass during generation (None: all ``N`` at once); the result
            is the same, only memory differs.
        lambda_dis: Weight of the disagreement loss (paper: 0.1).
        lambda_kd: Weight of the KD loss with ``weighting="fixed"`` (paper: 0.01).
        weighting: ``"fixed"`` (``1`` and ``lambda_kd``) or ``"balanced"`` (Appendix A.2.2, the official
            code's only mode).
        kd_batch_size: Generated inputs per local step (None: the size of the real mini-batch).
        temperature: Distillation temperature ``T`` (paper: none, i.e. 1).
    """

    name = "fedcog"
    changes_gradients = True
    prepares_clients = True
    #: Never: each client generates its own inputs (from its data and previous model) before its steps.
    vectorizable = Vectorizable(
        unless=lambda strategy, module: (
            "FedCOG generates each client's inputs from its own data and previous model "
            "before its local steps"
        )
    )

    def __init__(
        self,
        base: Strategy | None = None,
        start_round: int = 0,
        num_generated: int = 256,
        gen_steps: int = 100,
        gen_lr: float = 0.01,
        gen_batch_size: int | None = None,
        lambda_dis: float = 0.1,
        lambda_kd: float = 0.01,
        weighting: Literal["fixed", "balanced"] = "fixed",
        kd_batch_size: int | None = None,
        temperature: float = 1.0,
    ) -> None:
        super().__init__(FedAvg() if base is None else base)
        checks = [
            ("start_round", start_round, start_round >= 0, ">= 0 (the paper starts after 50 rounds)"),
            ("num_generated", num_generated, num_generated >= 0, ">= 0 (paper: 256; 0 disables FedCOG)"),
            ("gen_steps", gen_steps, gen_steps >= 0, ">= 0 (paper: 100)"),
            ("gen_lr", gen_lr, gen_lr > 0, "> 0 (official code: 0.01)"),
            ("gen_batch_size", gen_batch_size, gen_batch_size is None or gen_batch_size >= 1, ">= 1 or null"),
            ("lambda_dis", lambda_dis, lambda_dis >= 0, ">= 0 (paper: 0.1)"),
            ("lambda_kd", lambda_kd, lambda_kd >= 0, ">= 0 (paper: 0.01)"),
            ("weighting", weighting, weighting in ("fixed", "balanced"), "'fixed' or 'balanced'"),
            ("kd_batch_size", kd_batch_size, kd_batch_size is None or kd_batch_size >= 1, ">= 1 or null"),
            ("temperature", temperature, temperature > 0, "> 0 (paper: 1)"),
        ]
        for field_name, value, ok, allowed in checks:
            if not ok:
                raise ConfigError(f"model.strategy.{field_name}={value!r} must be {allowed}")
        for field_name, value in (("gen_lr", gen_lr), ("lambda_dis", lambda_dis), ("lambda_kd", lambda_kd)):
            check_number(value, f"model.strategy.{field_name}", low=0, low_open=field_name == "gen_lr")
        check_number(temperature, "model.strategy.temperature", low=0, low_open=True, hint="(paper: 1)")
        self.start_round = start_round
        self.num_generated = num_generated
        self.gen_steps = gen_steps
        self.gen_lr = gen_lr
        self.gen_batch_size = gen_batch_size
        self.lambda_dis = lambda_dis
        self.lambda_kd = lambda_kd
        self.kd_weighting = weighting
        self.kd_batch_size = kd_batch_size
        self.temperature = temperature

    # ------------------------------------------------------------------------------ client side
    def active(self, round: int) -> bool:
        """Whether clients generate and distil in ``round``."""
        if round < self.start_round or self.num_generated == 0:
            return False
        return not (self.kd_weighting == "fixed" and self.lambda_kd == 0)

    def on_client_start(self, module: nn.Module, ctx: ClientContext) -> None:
        """Base hook, then (in active rounds) complementary generation from the global and previous model."""
        self.base.on_client_start(module, ctx)
        if not self.active(ctx.round):
            return
        data = ctx.data
        if data is None:
            raise ValueError("FedCOG needs the client's data in ctx.data (set by the round loop)")
        task = getattr(module, "task", "multiclass")
        param = next(p for p in module.parameters() if p.is_floating_point())
        first = data.x[data.train_idx[:1].to(data.x.device)].to(param.device, param.dtype)
        with torch.no_grad(), frozen(module):
            num_classes = int(module(first).shape[-1])
        counts = label_counts(data.train_labels(), num_classes)
        w_c, w_kd = kd_weights(counts, self.kd_weighting, self.lambda_kd)
        if w_kd == 0:
            return
        targets = target_labels(complementary_counts(counts, self.num_generated))
        prev = previous_model(ctx.state)
        with frozen(module):
            gen = generate(
                module,
                targets,
                tuple(data.x.shape[1:]),
                task,
                local_forward=None if prev is None else (lambda x: frozen_forward(module, prev, x)),
                lambda_dis=self.lambda_dis,
                steps=self.gen_steps,
                lr=self.gen_lr,
                batch_size=self.gen_batch_size,
                device=param.device,
                dtype=param.dtype,
            )
        seed = int(torch.randint(0, 2**62, (1,)))  # from the client's RNG stream (seeded by the loop)
        ctx.scratch[_SCRATCH] = _Distillation(
            gen.inputs,
            log_distribution(gen.teacher_logits, task, self.temperature),
            w_c,
            w_kd,
            torch.Generator().manual_seed(seed),
        )

    def local_loss(self, module: nn.Module, ctx: ClientContext, batch: Any, outputs: Tensor) -> Tensor | None:
        """The base method's term plus ``w_kd * KD`` on a generated batch and ``(w_c - 1) * task loss``."""
        term = self.base.local_loss(module, ctx, batch, outputs)
        kd: _Distillation | None = ctx.scratch.get(_SCRATCH)
        if kd is None:
            return term
        x, y = batch
        xg, teacher = kd.batch(ctx.step, self.kd_batch_size or int(x.shape[0]), ctx.num_steps)
        task = getattr(module, "task", "multiclass")
        extra = kd.w_kd * kd_loss(module(xg).float(), teacher, task, self.temperature)
        if kd.w_c != 1.0:
            if outputs is None:  # a training_step that does not return its outputs
                outputs = module(x)
            extra = extra + (kd.w_c - 1.0) * module.task_loss(outputs, y)
        return extra if term is None else term + extra

    def upload(self, module: nn.Module, ctx: ClientContext) -> Payload:
        """The base method's upload, unchanged; the final local model is kept as ``theta_k^prev``."""
        payload = self.base.upload(module, ctx)
        save_previous_model(module, ctx.state)
        return payload

    def extra_repr(self) -> str:
        return (
            f"start_round={self.start_round}, num_generated={self.num_generated}, "
            f"gen_steps={self.gen_steps}, lambda_dis={self.lambda_dis}, lambda_kd={self.lambda_kd}, "
            f"weighting={self.kd_weighting!r}"
        )
