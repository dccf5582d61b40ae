"""LEAF's character LSTM for next-character prediction (Shakespeare)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from fl_lightning.errors import ConfigError
from fl_lightning.models.registry import register_model


def lstm_unrolled(lstm: nn.LSTM, x: Tensor) -> Tensor:
    """The last layer's outputs ``[B, T, H]`` of a batch-first, unidirectional, biased ``nn.LSTM`` on ``x``
    (zero initial state), computed step by step from its parameters with elementwise ops and matmuls.

    The same math as ``nn.LSTM`` (gates ``i, f, g, o`` in PyTorch's order; ``c' = f c + i g``,
    ``h' = o tanh(c')``), written so that ``torch.func.vmap`` can batch it over stacked parameters, for
    which ``aten::lstm`` has no batching rule.
    """
    out = x
    for layer in range(lstm.num_layers):
        w_ih, w_hh = getattr(lstm, f"weight_ih_l{layer}"), getattr(lstm, f"weight_hh_l{layer}")
        bias = getattr(lstm, f"bias_ih_l{layer}") + getattr(lstm, f"bias_hh_l{layer}")
        pre = torch.nn.functional.linear(out, w_ih, bias)  # [B, T, 4H]: the inputs' part of every step
        h = pre.new_zeros(pre.shape[0], lstm.hidden_size)
        c = torch.zeros_like(h)
        steps = []
        # unbind, not pre[:, t]: the backward of T selects would write T zero-filled [B, T, 4H] gradients
        for pre_t in pre.unbind(1):
            i, f, g, o = (pre_t + torch.nn.functional.linear(h, w_hh)).chunk(4, dim=-1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            steps.append(h)
        out = torch.stack(steps, dim=1)
    return out


@register_model("char_lstm")
class CharLSTM(nn.Module):
    """``embedding(vocab, 8) -> LSTM(256) -> LSTM(256) -> linear(256, classes)`` on the last step's output.

    LEAF's Shakespeare model (``models/shakespeare/stacked_lstm.py`` of TalwalkarLab/leaf: an 8-dimensional
    character embedding, two stacked LSTM layers of 256 units, logits over the 80-symbol vocabulary from the
    last position), as used by FedProx and SCAFFOLD for Shakespeare. Inputs are token ids ``[B, T]`` (any
    integer dtype); the sizes left unset follow the data (``vocab_size`` and ``num_outputs``: the
    vocabulary). ``torch.func.vmap`` (vectorised clients on a GPU) has no batching rule for the fused LSTM
    kernel; there the same recurrence runs step by step (:func:`lstm_unrolled`).

    Args:
        vocab_size: Token ids of the input; None: the data's.
        num_outputs: Logits; None: the data's classes (the vocabulary for next-character prediction).
            (Not ``num_classes``: that name is carried over from the default network when
            ``--model.client.net`` switches classes.)
        embedding_dim: Size of a character's embedding (LEAF: 8).
        hidden_size: Units of each LSTM layer (LEAF: 256).
        num_layers: Stacked LSTM layers (LEAF: 2).
    """

    def __init__(
        self,
        vocab_size: int | None = None,
        num_outputs: int | None = None,
        embedding_dim: int = 8,
        hidden_size: int = 256,
        num_layers: int = 2,
    ) -> None:
        super().__init__()
        for name, value in (
            ("vocab_size", vocab_size),
            ("num_outputs", num_outputs),
            ("embedding_dim", embedding_dim),
            ("hidden_size", hidden_size),
            ("num_layers", num_layers),
        ):
            if value is not None and (isinstance(value, bool) or value < 1):
                raise ConfigError(f"model.client.net.{name}={value!r} must be an integer >= 1")
        self.vocab_size, self.num_outputs = vocab_size, num_outputs
        self.embedding_dim, self.hidden_size, self.num_layers = embedding_dim, hidden_size, num_layers
        self.embed: nn.Embedding | None = None
        self.lstm: nn.LSTM | None = None
        self.head: nn.Linear | None = None
        self._build()

    def _build(self) -> None:
        if self.vocab_size is None or self.num_outputs is None:
            return
        self.embed = nn.Embedding(self.vocab_size, self.embedding_dim)
        self.lstm = nn.LSTM(self.embedding_dim, self.hidden_size, self.num_layers, batch_first=True)
        self.head = nn.Linear(self.hidden_size, self.num_outputs)

    def fit_data(self, input_shape: tuple[int, ...], num_classes: int, vocab_size: int | None) -> None:
        """Take the unset sizes from the data (see :mod:`fl_lightning.models.sizing`)."""
        if self.lstm is not None:
            return
        if vocab_size is None and self.vocab_size is None:
            raise ConfigError(
                f"model.client.net=CharLSTM needs token inputs (characters or words), but the data's inputs "
                f"are float tensors of shape {list(input_shape)}; use it with data.dataset=shakespeare or "
                "leaf (Shakespeare, Sent140)"
            )
        self.vocab_size = self.vocab_size or vocab_size
        self.num_outputs = self.num_outputs or num_classes
        self._build()

    def forward(self, x: Tensor) -> Tensor:
        if self.lstm is None or self.embed is None or self.head is None:
            raise RuntimeError("CharLSTM has no sizes yet: give them or call fit_data")
        e = self.embed(x.long())
        try:
            out, _ = self.lstm(e)
        except RuntimeError as err:  # under vmap: no batching rule for aten::lstm
            if "Batching rule not implemented" not in str(err):
                raise
            out = lstm_unrolled(self.lstm, e)
        return self.head(out[:, -1])
