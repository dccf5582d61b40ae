import pytest
import torch
from torch import nn

from fl_lightning.functional.tensor import (
    accumulate,
    all_finite,
    derive_seed,
    load_tensors,
    module_device,
    payload_bytes,
    proximal_term,
    pseudo_gradient,
    shared_state,
    to_device,
)


def test_derive_seed_depends_only_on_keys():
    assert derive_seed(0, 1, 2) == derive_seed(0, 1, 2)
    assert len({derive_seed(0, r, c) for r in range(20) for c in range(20)}) == 400
    assert 0 <= derive_seed(7, 3) < 2**63


def test_payload_bytes_counts_every_tensor():
    payload = {
        "weights": {"a": torch.zeros(3, 4), "b": torch.zeros(5, dtype=torch.float64)},
        "c": {"x": torch.zeros(2)},
    }
    assert payload_bytes(payload) == 12 * 4 + 5 * 8 + 2 * 4


def test_shared_state_skips_integer_buffers():
    bn = nn.BatchNorm1d(3)
    names = set(shared_state(bn))
    assert names == {"weight", "bias", "running_mean", "running_var"}
    assert set(shared_state(bn, exclude=["bias"])) == {"weight", "running_mean", "running_var"}


def test_proximal_term_is_half_squared_distance():
    lin = nn.Linear(2, 1)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1.0, 2.0]]))
        lin.bias.fill_(3.0)
    ref = {"weight": torch.tensor([[0.0, 0.0]]), "bias": torch.tensor([1.0])}
    # 1/2 * (1 + 4 + 4) = 4.5
    assert proximal_term(lin, ref).item() == pytest.approx(4.5)
    assert proximal_term(lin, {}).item() == 0.0
    proximal_term(lin, ref).backward()
    assert torch.equal(lin.weight.grad, torch.tensor([[1.0, 2.0]]))
    # a dict of tensors (Ditto's personal model): the same value over the tensors that require grad
    tensors = {n: p.detach().clone().requires_grad_() for n, p in lin.named_parameters()}
    tensors["running_mean"] = torch.ones(1)  # a buffer: not in the term
    assert proximal_term(tensors, {**ref, "running_mean": torch.zeros(1)}).item() == pytest.approx(4.5)
    assert proximal_term({}, ref).item() == 0.0


def test_accumulate_and_pseudo_gradient():
    acc: dict[str, torch.Tensor] = {}
    accumulate(acc, {"w": torch.tensor([1.0, 2.0])}, 3.0)
    accumulate(acc, {"w": torch.tensor([3.0, 0.0])}, 1.0)
    assert torch.equal(acc["w"], torch.tensor([6.0, 6.0]))
    mean = {"w": acc["w"] / 4.0}
    g = pseudo_gradient({"w": torch.tensor([2.0, 2.0])}, mean)
    assert torch.equal(g["w"], torch.tensor([0.5, 0.5]))


def test_load_tensors_keeps_parameter_identity():
    lin = nn.Linear(2, 2)
    before = lin.weight
    load_tensors(lin, {"weight": torch.ones(2, 2)})
    assert lin.weight is before and torch.equal(lin.weight, torch.ones(2, 2))
    with pytest.raises(KeyError):
        load_tensors(lin, {"nope": torch.ones(1)})


def test_all_finite():
    assert all_finite({"w": {"a": torch.ones(2)}})
    assert not all_finite({"w": {"a": torch.tensor([1.0, float("nan")])}})
    assert not all_finite({"w": {"a": torch.tensor([float("inf")])}})


def test_to_device_moves_nested_batches_and_copies_nothing_already_there():
    x, y = torch.randn(2, 3), torch.tensor([0, 1])
    moved = to_device((x, {"y": y, "n": 3}, [y]), "cpu")
    assert isinstance(moved, tuple) and moved[0] is x and moved[1]["y"] is y and moved[2][0] is y
    assert moved[1]["n"] == 3
    meta = to_device([x, y], "meta")
    assert isinstance(meta, list) and all(t.device.type == "meta" for t in meta)


def test_module_device_reads_parameters_then_buffers():
    assert module_device(nn.Linear(2, 2).to("meta")) == torch.device("meta")
    assert module_device(nn.BatchNorm1d(2, affine=False).to("meta")) == torch.device("meta")
    assert module_device(nn.ReLU()) == torch.device("cpu")


def test_to_device_blocks_on_copies_to_the_host(monkeypatch):
    """A non-blocking GPU-to-host copy could be read by a host op before it lands."""
    calls = []
    original = torch.Tensor.to

    def spy(self, *args, **kwargs):
        calls.append(kwargs.get("non_blocking"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", spy)
    to_device((torch.ones(1),), "cpu")
    to_device([torch.ones(1)], torch.device("meta"))
    assert calls == [False, True]
