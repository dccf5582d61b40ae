"""FedCOG's math: JS disagreement, complementary labels, KD loss and weights, input-only generation."""

import math

import pytest
import torch
from torch import nn

from fl_lightning.functional.distillation import (
    complementary_counts,
    disagreement_loss,
    generate,
    js_divergence,
    kd_loss,
    kd_weights,
    largest_remainder,
    log_distribution,
    target_labels,
)
from fl_lightning.functional.representation import frozen

LN2 = math.log(2.0)
D = torch.tensor([500, 0, 400, 200, 400])  # the paper's worked example (Appendix A.1.1)


def _probs(seed: int, n: int = 64, c: int = 7) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (3 * torch.randn(n, c, generator=g)).softmax(dim=1)


def test_js_is_symmetric_bounded_and_zero_only_for_equal_inputs():
    p, q = _probs(0), _probs(1)
    js = js_divergence(p, q)
    torch.testing.assert_close(js, js_divergence(q, p), rtol=0, atol=1e-7)
    assert (js > 0).all() and (js <= LN2 + 1e-7).all()
    assert torch.equal(js_divergence(p, p), torch.zeros(len(p)))
    one_hot = torch.eye(3)
    torch.testing.assert_close(js_divergence(one_hot[[0, 1]], one_hot[[1, 2]]), torch.full((2,), LN2))


def test_js_matches_its_definition_with_kl_to_the_midpoint():
    p, q = _probs(2), _probs(3)
    m = (p + q) / 2
    kl = lambda a, b: (a * (a.log() - b.log())).sum(dim=1)  # noqa: E731
    torch.testing.assert_close(js_divergence(p, q), 0.5 * kl(p, m) + 0.5 * kl(q, m), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("task", ["multiclass", "multilabel"])
def test_disagreement_loss_lies_in_its_range_and_is_one_for_equal_models(task):
    g = torch.Generator().manual_seed(0)
    za, zb = 4 * torch.randn(32, 5, generator=g), 4 * torch.randn(32, 5, generator=g)
    loss = disagreement_loss(za, zb, task)
    assert (loss >= 1 - LN2 - 1e-6).all() and (loss <= 1).all() and (loss < 1).all()
    assert torch.equal(disagreement_loss(za, za, task), torch.ones(32))
    torch.testing.assert_close(loss, disagreement_loss(zb, za, task))


def test_complementary_labels_of_the_paper_example():
    assert complementary_counts(D, 1000).tolist() == [0, 500, 100, 300, 100]
    counts = complementary_counts(D, 256)  # quotas [0, 128, 25.6, 76.8, 25.6]; the official floor gives 254
    assert counts.tolist() == [0, 128, 26, 77, 25] and int(counts.sum()) == 256
    labels = target_labels(counts)
    assert labels.shape == (256,) and (labels != 0).all()  # the majority class gets no targets
    assert labels.tolist() == sorted(labels.tolist())  # blocks [1...1, 2...2, ...]


def test_balanced_client_gets_uniform_targets_without_nan():
    counts = complementary_counts(torch.tensor([7, 7, 7]), 10)
    assert counts.tolist() == [4, 3, 3]
    assert target_labels(largest_remainder(torch.ones(10, dtype=torch.long), 30)).tolist() == [
        c for c in range(10) for _ in range(3)
    ]


def test_kd_weights_fixed_and_balanced():
    assert kd_weights(D, "fixed", 0.01) == (1.0, 0.01)
    w_c, w_kd = kd_weights(D, "balanced", 0.01)  # N_real = 1500, N_gen = 1000
    assert (w_c, w_kd) == pytest.approx((0.6, 0.4)) and w_c + w_kd == pytest.approx(1.0)
    assert kd_weights(torch.tensor([3, 3, 3]), "balanced", 0.01) == (1.0, 0.0)


@pytest.mark.parametrize("task", ["multiclass", "multilabel"])
def test_kd_loss_is_nonnegative_and_exactly_zero_for_equal_logits(task):
    g = torch.Generator().manual_seed(0)
    teacher, student = torch.randn(16, 6, generator=g), torch.randn(16, 6, generator=g, requires_grad=True)
    loss = kd_loss(student, log_distribution(teacher, task), task)
    assert loss > 0
    same = teacher.clone().requires_grad_(True)
    zero = kd_loss(same, log_distribution(teacher, task), task)
    assert torch.equal(zero, torch.zeros(()))
    zero.backward()  # the gradient softmax(s) - softmax(t) vanishes up to float rounding of sum(p) = 1
    torch.testing.assert_close(same.grad, torch.zeros_like(same), rtol=0, atol=1e-8)


def test_kd_loss_direction_and_temperature():
    t = torch.tensor([[2.0, 0.0, -1.0]])
    s = torch.tensor([[0.0, 1.0, 0.0]])
    p_t, p_s = t.softmax(1), s.softmax(1)
    expected = (p_t * (p_t.log() - p_s.log())).sum()  # KL(teacher || student)
    torch.testing.assert_close(kd_loss(s, log_distribution(t, "multiclass"), "multiclass"), expected)
    p_t2, p_s2 = (t / 2).softmax(1), (s / 2).softmax(1)
    expected_t2 = 4 * (p_t2 * (p_t2.log() - p_s2.log())).sum()
    got = kd_loss(s, log_distribution(t, "multiclass", 2.0), "multiclass", temperature=2.0)
    torch.testing.assert_close(got, expected_t2)


class TinyBN(nn.Module):
    """A conv net with BatchNorm (buffers) and dropout, to check that generation touches neither."""

    def __init__(self, classes: int = 4) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(0.5)
        self.fc = nn.Linear(4 * 16, classes)

    def forward(self, x):
        return self.fc(self.drop(torch.relu(self.bn(self.conv(x)))).flatten(1))


def _trained_pair() -> tuple[TinyBN, dict]:
    torch.manual_seed(0)
    net = TinyBN()
    net.train()
    for _ in range(3):  # give the BN buffers non-default values
        net(torch.randn(8, 1, 4, 4))
    other = {
        k: v + 0.3 * torch.randn_like(v) if v.is_floating_point() else v for k, v in net.state_dict().items()
    }
    return net, other


def test_generation_optimises_only_the_inputs():
    from fl_lightning.functional.representation import frozen_forward

    net, other = _trained_pair()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    targets = target_labels(complementary_counts(torch.tensor([5, 1, 0, 2]), 12))
    with frozen(net):
        out = generate(
            net, targets, (1, 4, 4), "multiclass", lambda x: frozen_forward(net, other, x), steps=5
        )
    assert net.training and all(m.training for m in net.modules())  # modes restored
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())  # params and BN buffers
    assert all(p.grad is None for p in net.parameters())
    assert out.inputs.shape == (12, 1, 4, 4) and not out.inputs.requires_grad
    assert out.teacher_logits.shape == (12, 4) and len(out.losses) == 5


def test_step_zero_is_gaussian_noise_and_steps_reduce_the_loss():
    net, _ = _trained_pair()
    targets = target_labels(torch.tensor([64, 64, 64, 64]))
    torch.manual_seed(1)
    with frozen(net):
        noise = generate(net, targets, (1, 4, 4), "multiclass", steps=0)
    assert abs(float(noise.inputs.mean())) < 0.05 and abs(float(noise.inputs.std()) - 1) < 0.05
    torch.manual_seed(1)
    with frozen(net):
        out = generate(net, targets, (1, 4, 4), "multiclass", steps=60, lr=0.05)
    assert out.losses[-1] < 0.5 * out.losses[0]
    assert (out.teacher_logits.argmax(1) == targets).float().mean() > 0.9


def test_disagreement_is_constant_when_the_local_model_equals_the_global_model():
    net, _ = _trained_pair()
    same = {k: v.clone() for k, v in net.state_dict().items()}
    targets = target_labels(torch.tensor([3, 3, 3, 3]))
    from fl_lightning.functional.representation import frozen_forward

    results = []
    for local, lam in ((lambda x: frozen_forward(net, same, x), 0.1), (None, 0.0)):
        torch.manual_seed(3)
        with frozen(net):
            results.append(generate(net, targets, (1, 4, 4), "multiclass", local, lambda_dis=lam, steps=10))
    torch.testing.assert_close(results[0].inputs, results[1].inputs, rtol=0, atol=1e-6)


def test_disagreement_raises_the_js_between_global_and_local_model():
    from fl_lightning.functional.representation import frozen_forward

    net, other = _trained_pair()
    targets = target_labels(torch.tensor([16, 16, 16, 16]))
    js = []
    for lam in (0.0, 1.0):
        torch.manual_seed(4)
        with frozen(net):
            out = generate(
                net,
                targets,
                (1, 4, 4),
                "multiclass",
                lambda x: frozen_forward(net, other, x),
                lambda_dis=lam,
                steps=40,
                lr=0.05,
            )
            local = frozen_forward(net, other, out.inputs)
        js.append(float((1 - disagreement_loss(out.teacher_logits, local, "multiclass")).mean()))
    assert js[1] > js[0]


def test_chunked_generation_equals_full_batch():
    net, _ = _trained_pair()
    targets = target_labels(torch.tensor([5, 5, 5, 5]))
    outs = []
    for bs in (None, 6):
        torch.manual_seed(5)
        with frozen(net):
            outs.append(generate(net, targets, (1, 4, 4), "multiclass", steps=5, batch_size=bs))
    torch.testing.assert_close(outs[0].inputs, outs[1].inputs, rtol=1e-5, atol=1e-6)


def test_multilabel_generation_makes_the_global_model_predict_the_target_label():
    net, _ = _trained_pair()
    targets = target_labels(complementary_counts(torch.tensor([9, 0, 4, 1]), 64))  # per-label positive counts
    assert int((targets == 0).sum()) == 0
    torch.manual_seed(6)
    with frozen(net):
        out = generate(net, targets, (1, 4, 4), "multilabel", steps=200, lr=0.1)
    assert out.losses[-1] < 0.5 * out.losses[0]
    on = out.teacher_logits.sigmoid() > 0.5
    assert on[torch.arange(64), targets].float().mean() > 0.9  # the target label is predicted present
