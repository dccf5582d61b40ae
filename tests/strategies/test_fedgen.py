"""FedGen: the server's generator learns the ensemble's labels; clients add the generated-latent term."""

import pytest
import torch
import torch.nn.functional as F

from fl_lightning.api.types import ClientContext, RoundInfo
from fl_lightning.data.federated import ClientData
from fl_lightning.errors import ConfigError
from fl_lightning.functional.representation import last_linear
from fl_lightning.functional.synthetic import ensemble_logits, generator_input, label_weighted_heads
from fl_lightning.strategies import FedAvg, FedGen

from conftest import global_weights, make_data, make_module

C = 10


def _setup(**kw):
    strategy = FedGen(**kw)
    module = make_module(strategy).client  # SmallCNN, 10 classes
    strategy.setup(module, num_clients=2)
    return module, strategy


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"alpha": -1.0}, "alpha"),
        ({"gen_steps": -1}, "gen_steps"),
        ({"gen_lr": 0.0}, "gen_lr"),
        ({"gen_batch_size": 0}, "gen_batch_size"),
        ({"noise_dim": 0}, "noise_dim"),
    ],
)
def test_bad_values_are_one_line_config_errors(kw, field):
    with pytest.raises(ConfigError, match=f"model.strategy.{field}"):
        FedGen(**kw)


def test_generator_samples_are_classified_as_their_label_by_the_ensemble_after_server_training():
    module, strategy = _setup(gen_steps=300, gen_lr=1e-2)
    w_name, b_name = f"{strategy.head}.weight", f"{strategy.head}.bias"
    g = torch.Generator().manual_seed(0)
    agg = strategy.aggregator()
    counts = (torch.arange(C, dtype=torch.float32), torch.flip(torch.arange(C, dtype=torch.float32), [0]) + 1)
    for n in counts:  # two clients with different heads and label counts
        weights = {k: v.detach().clone() for k, v in module.state_dict().items()}
        weights[w_name] = torch.randn(weights[w_name].shape, generator=g)
        weights[b_name] = torch.randn(weights[b_name].shape, generator=g)
        agg.add({"weights": weights, "fedgen": {"counts": n}}, num_samples=10)
    means = agg.means()
    assert "fedgen" not in strategy.message(module, 0, 0)  # nothing to send before the first training
    strategy.on_after_server_step(module, means, RoundInfo(0, [0, 1], [0, 1], 2))
    assert int(strategy.trained_rounds) == 1
    msg = strategy.message(module, 0, 1)["fedgen"]
    torch.testing.assert_close(msg["prior"], (counts[0] + counts[1]) / (counts[0] + counts[1]).sum())
    w, b = label_weighted_heads(means["fedgen"]["counts"], means["fedgen"]["weight"], means["fedgen"]["bias"])
    y = torch.arange(C).repeat(30)
    with torch.no_grad():
        z = strategy.generator(generator_input(torch.randn(len(y), strategy.noise_dim, generator=g), y, C))
    acc = (ensemble_logits(z, y, w, b).argmax(1) == y).float().mean()
    assert acc >= 0.9


def test_client_loss_is_alpha_times_ce_of_its_head_on_generated_latents():
    module, strategy = _setup(alpha=2.0)
    strategy.trained_rounds += 1
    prior = torch.zeros(C)
    prior[:2] = 0.5
    strategy.prior.copy_(prior)
    ctx = ClientContext(0, 1, strategy.message(module, 0, 1), {}, 8, 1, 0.1)
    x = torch.randn(16, 1, 8, 8)
    torch.manual_seed(3)
    loss = strategy.local_loss(module, ctx, (x, torch.zeros(16, dtype=torch.long)), None)
    torch.manual_seed(3)
    y = torch.multinomial(prior, 16, replacement=True)
    eps = torch.randn(16, strategy.noise_dim)
    with torch.no_grad():
        z = strategy.generator(generator_input(eps, y, C))
    assert set(y.tolist()) <= {0, 1}
    torch.testing.assert_close(loss, 2.0 * F.cross_entropy(last_linear(module)(z), y))
    assert loss.requires_grad  # it trains the client's head


def test_no_term_before_the_generator_was_trained():
    module, strategy = _setup()
    ctx = ClientContext(0, 0, strategy.message(module, 0, 0), {}, 8, 1, 0.1)
    assert strategy.local_loss(module, ctx, (torch.randn(4, 1, 8, 8), torch.zeros(4).long()), None) is None


def test_upload_carries_the_label_counts():
    module, strategy = _setup()
    y = torch.tensor([0, 0, 1, 3, 3, 3])
    data = ClientData(0, torch.zeros(6, 1, 8, 8), y, torch.arange(6), torch.zeros(0, dtype=torch.long))
    ctx = ClientContext(0, 0, {"weights": {}}, {}, 6, 1, 0.1, data=data)
    counts = strategy.upload(module, ctx)["fedgen"]["counts"]
    assert counts.tolist() == [2.0, 1.0, 0.0, 3.0] + [0.0] * 6


def test_round_zero_is_fedavg_then_the_generator_trains_every_round(fit):
    a, b = make_module(FedAvg()), make_module(FedGen(gen_steps=5))
    fit(a, rounds=1)
    fit(b, rounds=1)
    wa, wb = global_weights(a), global_weights(b)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    c = make_module(FedGen(gen_steps=5))
    fit(c, rounds=2, data=make_data(num_clients=3))
    assert int(c.strategy.trained_rounds) == 2
    assert float(c.strategy.prior.sum()) == pytest.approx(1.0)
