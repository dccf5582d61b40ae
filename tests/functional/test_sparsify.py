"""Random-subset transmission: index draws, densify, and the per-entry average over senders, by hand."""

import torch

from fl_lightning.functional.sparsify import densify, flatten, indicator, random_indices, received_average


def test_random_indices_are_distinct_sorted_seeded_and_sized_by_the_ratio():
    a = random_indices(1000, 2.0, seed=7)
    assert a.numel() == 500 and torch.equal(a, a.unique()) and a.min() >= 0 and a.max() < 1000
    assert torch.equal(a, random_indices(1000, 2.0, seed=7))
    assert not torch.equal(a, random_indices(1000, 2.0, seed=8))
    assert random_indices(1000, 1.5, seed=7).numel() == 667
    assert torch.equal(random_indices(10, 1.0, seed=3), torch.arange(10))
    assert random_indices(3, 100.0, seed=3).numel() == 1  # at least one entry


def test_densify_writes_the_values_at_the_indices_and_keeps_the_fill():
    fill = torch.arange(6.0)
    out = densify(torch.tensor([10.0, 20.0]), torch.tensor([1, 4]), fill)
    assert torch.equal(out, torch.tensor([0.0, 10.0, 2.0, 3.0, 20.0, 5.0]))
    assert torch.equal(fill, torch.arange(6.0))  # a copy
    assert torch.equal(indicator(torch.tensor([1, 4]), 6), torch.tensor([0.0, 1, 0, 0, 1, 0]))


def test_received_average_is_the_mean_over_the_senders_of_each_entry():
    # client a (weight 3) sent entries 0, 1; client b (weight 1) sent entries 1, 2; nobody sent entry 3
    wa, wb = torch.tensor([1.0, 2.0, 0.0, 0.0]), torch.tensor([0.0, 6.0, 8.0, 0.0])
    ma, mb = torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.tensor([0.0, 1.0, 1.0, 0.0])
    masked, mask = (3 * wa + wb) / 4, (3 * ma + mb) / 4
    current = torch.tensor([-1.0, -1.0, -1.0, -9.0])
    out = received_average(masked, mask, current)
    assert torch.allclose(out, torch.tensor([1.0, (3 * 2 + 6) / 4, 8.0, -9.0]))


def test_flatten_concatenates_in_key_order():
    flat = flatten({"b": torch.ones(2, 2), "a": torch.zeros(3)})
    assert torch.equal(flat, torch.tensor([1.0, 1, 1, 1, 0, 0, 0]))
