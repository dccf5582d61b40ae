"""fl_lightning.models.lstm: LEAF's character LSTM, sized by the data, on every execution path."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from fl_lightning import Runtime
from fl_lightning.api.client import ClientModule
from fl_lightning.data import FederatedDataModule, NaturalUsers, Shakespeare
from fl_lightning.errors import ConfigError
from fl_lightning.lightning.module import FederatedModule
from fl_lightning.models import CharLSTM, create_model, list_models, size_to_data
from fl_lightning.models.lstm import lstm_unrolled
from fl_lightning.strategies import FedAvg

from conftest import global_weights, make_trainer


def test_leafs_sizes_follow_the_vocabulary():
    net = CharLSTM()
    assert not list(net.parameters())  # nothing to build before the data says its vocabulary
    assert size_to_data(net, (80,), 80, 80) == 1
    assert net.embed.weight.shape == (80, 8)
    lstm = 4 * 256 * (8 + 256 + 2) + 4 * 256 * (256 + 256 + 2)
    assert sum(p.numel() for p in net.parameters()) == 80 * 8 + lstm + 256 * 80 + 80
    out = net(torch.randint(0, 80, (3, 80), dtype=torch.uint8))
    assert out.shape == (3, 80)
    assert "char_lstm" in list_models() and isinstance(create_model("char_lstm", vocab_size=5), CharLSTM)


def test_explicit_sizes_are_kept_and_float_data_is_refused():
    net = CharLSTM(vocab_size=20, num_outputs=2, hidden_size=8, num_layers=1)
    net.fit_data((80,), 80, 80)
    assert net.head.out_features == 2 and net.embed.num_embeddings == 20
    with pytest.raises(ConfigError, match="CharLSTM needs token inputs"):
        CharLSTM().fit_data((1, 8, 8), 10, None)
    with pytest.raises(RuntimeError, match="no sizes yet"):
        CharLSTM()(torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(ConfigError, match=r"model\.client\.net\.hidden_size=0"):
        CharLSTM(hidden_size=0)


def test_the_unrolled_recurrence_is_torchs_lstm():
    torch.manual_seed(0)
    lstm = nn.LSTM(5, 7, 2, batch_first=True)
    x = torch.randn(3, 11, 5)
    torch.testing.assert_close(lstm_unrolled(lstm, x), lstm(x)[0], rtol=1e-5, atol=1e-6)


def test_it_vmaps_over_stacked_parameters():
    torch.manual_seed(0)
    nets = [CharLSTM(vocab_size=12, num_outputs=12, hidden_size=6) for _ in range(3)]
    params, buffers = stack_module_state(nets)
    x = torch.randint(0, 12, (3, 4, 9))

    def one(p, b, xs):
        return functional_call(nets[0], (p, b), (xs,))

    out = vmap(one)(params, buffers, x)
    ref = torch.stack([net(x[i]) for i, net in enumerate(nets)])
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


def tiny_text(tmp_path) -> FederatedDataModule:
    lines = "\n".join(f"line {i}: the quick brown fox jumps over the lazy dog." for i in range(8))
    play = tmp_path / "plays" / "comedies" / "tiny.md"
    play.parent.mkdir(parents=True)
    play.write_text(
        "# Tiny\n\n" + "\n\n".join(f"**{who}**  \n{lines}" for who in ("ANN", "BOB", "CY", "DEE"))
    )
    options = Shakespeare(root=str(tmp_path / "plays"), seq_len=12)
    return FederatedDataModule(options, partition=NaturalUsers(), batch_size=16, eval_batch_size=64)


def _module(vectorize: int = 1) -> FederatedModule:
    torch.manual_seed(0)
    client = ClientModule(CharLSTM(hidden_size=16), lr=0.5, momentum=0.0)
    runtime = Runtime(vectorize=vectorize, vectorize_cpu="batched")
    return FederatedModule(client, FedAvg(), local_steps=3, runtime=runtime)


def test_next_character_accuracy_per_client_and_global(tmp_path):
    module = _module()
    trainer = make_trainer(tmp_path, rounds=2)
    trainer.fit(module, datamodule=tiny_text(tmp_path))
    assert module.client.net.embed.num_embeddings == 80 and module.client.net.head.out_features == 80
    metrics = trainer.callback_metrics
    assert 0 <= metrics["global/acc"].item() <= 1 and "personal/acc" in metrics
    assert set(module.final_client_metrics()) == {0, 1, 2, 3}


@pytest.mark.parametrize(("precision", "atol"), [("32-true", 1e-5), ("64-true", 1e-9)])
def test_vectorised_clients_equal_one_at_a_time(tmp_path, precision, atol):
    """vmap over the stacked LSTMs (step by step: ``aten::lstm`` has no batching rule), on the CPU too."""
    weights = []
    for vectorize in (1, 4):
        module = _module(vectorize)
        make_trainer(tmp_path / str(vectorize), rounds=2, precision=precision).fit(
            module, datamodule=tiny_text(tmp_path / str(vectorize))
        )
        weights.append(global_weights(module))
        assert (module.history[-1].vectorised_clients or 0) == (4 if vectorize > 1 else 0)
    for k in weights[0]:
        torch.testing.assert_close(weights[0][k], weights[1][k], rtol=0, atol=atol)
