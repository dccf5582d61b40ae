"""fl_lightning.functional.clustering: IFCA's estimate, CFL's criteria and bi-partition, against hand values
and scikit-learn."""

import math

import pytest
import torch
from sklearn.cluster import AgglomerativeClustering
from sklearn.metrics import adjusted_rand_score

from fl_lightning.functional.clustering import (
    adjusted_rand,
    bipartition,
    flatten_state,
    lowest_loss,
    pairwise_cosine,
    should_split,
    unflatten_state,
    update_norms,
)


def test_lowest_loss_is_the_first_argmin():
    assert lowest_loss(torch.tensor([0.9, 0.3, 0.5])) == 1
    assert lowest_loss(torch.tensor([0.4, 0.2, 0.2])) == 1  # ties: the first


def test_update_norms_by_hand():
    updates = torch.tensor([[3.0, 0.0], [0.0, 4.0], [-3.0, 0.0]])
    weights = torch.tensor([1.0, 2.0, 1.0])
    mean_norm, max_norm = update_norms(updates, weights)
    # weighted mean: (3 + 0 - 3, 0 + 8 + 0) / 4 = (0, 2)
    assert mean_norm == pytest.approx(2.0) and max_norm == pytest.approx(4.0)


@pytest.mark.parametrize(
    ("mean", "top", "size", "split"),
    [(0.1, 2.0, 3, True), (0.5, 2.0, 3, False), (0.1, 0.9, 3, False), (0.1, 2.0, 2, False)],
)
def test_split_criterion(mean, top, size, split):
    """Split when mean < eps_1 and max > eps_2 and the cluster has more than two clients."""
    assert should_split(mean, top, eps_1=0.4, eps_2=1.0, size=size) is split


def test_pairwise_cosine_by_hand():
    updates = torch.tensor([[1.0, 0.0], [1.0, 1.0], [-2.0, 0.0]])
    s = pairwise_cosine(updates)
    expected = torch.tensor(
        [
            [1.0, 1 / math.sqrt(2), -1.0],
            [1 / math.sqrt(2), 1.0, -1 / math.sqrt(2)],
            [-1.0, -1 / math.sqrt(2), 1.0],
        ]
    )
    torch.testing.assert_close(s, expected)


def test_two_opposing_directions_split_into_their_groups():
    """Updates around +d for clients 0, 2, 3 and around -d for clients 1, 4, 5: the bi-partition of their
    cosine similarities is exactly the two groups."""
    g = torch.Generator().manual_seed(0)
    d = torch.randn(50, generator=g)
    signs = torch.tensor([1.0, -1.0, 1.0, 1.0, -1.0, -1.0])
    updates = signs[:, None] * d + 0.3 * torch.randn(6, 50, generator=g)
    assert bipartition(pairwise_cosine(updates)) == ([0, 2, 3], [1, 4, 5])


@pytest.mark.parametrize("seed", range(5))
def test_bipartition_is_complete_linkage_as_scikit_learn(seed):
    """The authors' code: AgglomerativeClustering(linkage="complete") on the distance -alpha."""
    g = torch.Generator().manual_seed(seed)
    updates = torch.randn(9, 6, generator=g)
    s = pairwise_cosine(updates).double()
    ours = bipartition(s)
    ref = AgglomerativeClustering(n_clusters=2, metric="precomputed", linkage="complete").fit(
        (1 - s).numpy()  # -alpha shifted to be non-negative: the same merges
    )
    labels = [0 if i in ours[0] else 1 for i in range(9)]
    assert adjusted_rand_score(ref.labels_, labels) == 1.0
    assert sorted(ours[0] + ours[1]) == list(range(9)) and 0 in ours[0]


def test_adjusted_rand_is_scikit_learns_and_ignores_labels():
    assert adjusted_rand([0, 0, 1, 1], [1, 1, 0, 0]) == 1.0
    assert adjusted_rand([0, 0, 1, 1, 2], [0, 1, 1, 1, 2]) == pytest.approx(
        adjusted_rand_score([0, 0, 1, 1, 2], [0, 1, 1, 1, 2])
    )


def test_flatten_round_trips():
    state = {
        "a": torch.arange(6.0).view(2, 3),
        "b": torch.tensor([7.0]),
        "c": torch.ones(2, dtype=torch.float64),
    }
    layout = [(n, t.shape) for n, t in state.items()]
    flat = flatten_state(state, layout, torch.float32)
    assert flat.tolist() == [0, 1, 2, 3, 4, 5, 7, 1, 1]
    back = unflatten_state(flat, layout, like=state)
    assert all(torch.equal(back[n], state[n]) and back[n].dtype == state[n].dtype for n in state)
