"""Multinomial logistic regression (FedProx's and LEAF's ``mclr``/``log_reg`` for Synthetic and Sent140)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from fl_lightning.errors import ConfigError
from fl_lightning.models.registry import register_model


@register_model("logistic_regression")
class LogisticRegression(nn.Module):
    """``logits = W x + b``: multinomial logistic regression (softmax over the classes in the loss).

    On float inputs ``x`` is flattened (``input_dim`` features: 60 for Synthetic, 784 for FEMNIST). On token
    inputs (integer ids, e.g. LEAF's Sent140 words) it is the same model on the bag of words: ``W x`` with
    ``x`` the count of each id is the sum over the tokens of ``W``'s column for the token, computed as an
    embedding lookup summed over the sequence (``vocab_size`` ids). FedProx's ``mclr``
    (``flearn/models/synthetic/mclr.py``) adds an L2 penalty of 0.001: set ``model.client.weight_decay``.

    Args:
        input_dim: Features of a float input (flattened); None: the data's.
        num_outputs: Logits (the classes); None: the data's classes. (Not ``num_classes``: that name is
            carried over from the default network when ``--model.client.net`` switches classes.)
        vocab_size: Token ids of a token input; None: the data's when its inputs are tokens.
    """

    def __init__(
        self, input_dim: int | None = None, num_outputs: int | None = None, vocab_size: int | None = None
    ) -> None:
        super().__init__()
        for name, value in (
            ("input_dim", input_dim),
            ("num_outputs", num_outputs),
            ("vocab_size", vocab_size),
        ):
            if value is not None and (isinstance(value, bool) or value < 1):
                raise ConfigError(
                    f"model.client.net.{name}={value!r} must be an integer >= 1 (or null: the data's)"
                )
        if input_dim is not None and vocab_size is not None:
            raise ConfigError(
                "model.client.net: set input_dim (float inputs) or vocab_size (token inputs), not both"
            )
        self.input_dim, self.num_outputs, self.vocab_size = input_dim, num_outputs, vocab_size
        self.linear: nn.Linear | None = None
        self.embed: nn.Embedding | None = None
        self.bias: nn.Parameter | None = None
        self._build()

    def _build(self) -> None:
        if self.num_outputs is None or (self.input_dim is None and self.vocab_size is None):
            return
        if self.vocab_size is not None:
            self.embed = nn.Embedding(self.vocab_size, self.num_outputs)
            nn.init.zeros_(self.embed.weight)
            self.bias = nn.Parameter(torch.zeros(self.num_outputs))
        else:
            self.linear = nn.Linear(self.input_dim, self.num_outputs)

    def fit_data(self, input_shape: tuple[int, ...], num_classes: int, vocab_size: int | None) -> None:
        """Take the unset sizes from the data (see :mod:`fl_lightning.models.sizing`)."""
        if self.linear is not None or self.embed is not None:
            return
        if self.num_outputs is None:
            self.num_outputs = num_classes
        if self.input_dim is None and self.vocab_size is None:
            if vocab_size is not None:
                self.vocab_size = vocab_size
            else:
                self.input_dim = math.prod(input_shape)
        self._build()

    def forward(self, x: Tensor) -> Tensor:
        if self.embed is not None:
            assert self.bias is not None
            return self.embed(x.long()).sum(dim=-2) + self.bias
        if self.linear is None:
            raise RuntimeError("LogisticRegression has no sizes yet: give them or call fit_data")
        return self.linear(x.flatten(1).to(self.linear.weight.dtype))
