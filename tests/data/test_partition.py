"""Tests of the partitioners in fl_lightning.data.partition."""

from __future__ import annotations

import numpy as np
import pytest

from fl_lightning.data.partition import (
    IID,
    PARTITIONERS,
    Dirichlet,
    DirichletWithReplacement,
    LabelQuantity,
    MixedSkew,
    NaturalUsers,
    Partitioner,
    Pathological,
    PathologicalWithReplacement,
    QuantitySkew,
    check_num_clients,
    dirichlet_partition,
    dirichlet_with_replacement,
    get_partitioner,
    iid_partition,
    label_quantity_partition,
    list_partitioners,
    mixed_class_assignment,
    mixed_partition,
    natural_user_partition,
    partition_counts,
    pathological_partition,
    pathological_with_replacement,
    quantity_skew_partition,
    refill_partition,
)
from fl_lightning.errors import ConfigError


def balanced_labels(num_classes: int, per_class: int, seed: int = 0) -> np.ndarray:
    """``per_class`` samples of each class, in a random order."""
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(num_classes), per_class))


def assert_well_formed(parts: list[np.ndarray], num_clients: int, num_samples: int) -> None:
    assert len(parts) == num_clients
    for p in parts:
        assert p.dtype == np.int64
        assert np.all(np.diff(p) >= 0), "each client's indices are sorted"
        if len(p):
            assert p.min() >= 0 and p.max() < num_samples


def assert_exact_cover(parts: list[np.ndarray], num_samples: int) -> None:
    """Every index 0..N-1 appears exactly once over all clients."""
    allidx = np.concatenate(parts)
    assert len(allidx) == num_samples
    np.testing.assert_array_equal(np.sort(allidx), np.arange(num_samples))


# ----------------------------------------------------------------------------------------------- iid
def test_iid_sizes_differ_by_at_most_one_and_cover_once():
    parts = iid_partition(103, 10, np.random.default_rng(0))
    assert_well_formed(parts, 10, 103)
    assert_exact_cover(parts, 103)
    sizes = sorted(len(p) for p in parts)
    assert sizes == [10] * 7 + [11] * 3


def test_iid_is_shuffled_and_deterministic():
    a = iid_partition(100, 4, np.random.default_rng(1))
    b = iid_partition(100, 4, np.random.default_rng(1))
    for pa, pb in zip(a, b):
        np.testing.assert_array_equal(pa, pb)
    assert not np.array_equal(a[0], np.arange(25)), "not the contiguous unshuffled split"


def test_iid_class_ignores_labels_values():
    parts = IID()(np.zeros(30, dtype=np.int64), 3, np.random.default_rng(0))
    assert [len(p) for p in parts] == [10, 10, 10]


# ----------------------------------------------------------------------------------------- dirichlet
def test_dirichlet_covers_every_index_exactly_once_and_respects_min_size():
    y = balanced_labels(10, 100)
    parts = dirichlet_partition(y, 10, 0.5, np.random.default_rng(0), min_size=50)
    assert_well_formed(parts, 10, len(y))
    assert_exact_cover(parts, len(y))
    assert min(len(p) for p in parts) >= 50


def test_dirichlet_is_deterministic_for_a_seed():
    y = balanced_labels(10, 100)
    a = dirichlet_partition(y, 8, 0.3, np.random.default_rng(7))
    b = dirichlet_partition(y, 8, 0.3, np.random.default_rng(7))
    c = dirichlet_partition(y, 8, 0.3, np.random.default_rng(8))
    assert all(np.array_equal(pa, pb) for pa, pb in zip(a, b))
    assert not all(np.array_equal(pa, pc) for pa, pc in zip(a, c))


@pytest.mark.parametrize("alpha", [0.05, 1.0, 1000.0])
def test_dirichlet_class_shares_have_the_dirichlet_variance(alpha):
    """Each class's client shares are one Dir(alpha * 1_m) draw, so a share has the variance of a
    Beta(alpha, (m - 1) alpha) variable, (m - 1) / (m^2 (m alpha + 1)): the smaller alpha, the more each
    class concentrates on few clients (0.06 at alpha 0.05, ~0 at alpha 1000: nearly IID)."""
    m = 10
    y = balanced_labels(100, 2000)  # 100 classes: 100 draws of the shares; 2000 samples: cuts ~exact
    parts = dirichlet_partition(y, m, alpha, np.random.default_rng(0), min_size=0)
    counts = partition_counts(y, parts, 100)  # [client, class]
    shares = counts / counts.sum(axis=0, keepdims=True)
    variance = float(((shares - 1 / m) ** 2).mean())  # the mean share is 1/m exactly
    assert variance == pytest.approx((m - 1) / (m * m * (m * alpha + 1)), rel=0.15)


def test_dirichlet_class_matches_function():
    y = balanced_labels(5, 40)
    part = Dirichlet(alpha=0.7, min_size=3)
    a = part(y, 4, np.random.default_rng(3))
    b = dirichlet_partition(y, 4, 0.7, np.random.default_rng(3), min_size=3)
    assert all(np.array_equal(pa, pb) for pa, pb in zip(a, b))
    assert repr(part) == "Dirichlet(alpha=0.7, min_size=3)"


def test_dirichlet_min_size_impossible_is_reported_immediately():
    y = balanced_labels(10, 20)  # 200 samples
    with pytest.raises(ConfigError, match=r"data\.partition\.min_size=30"):
        dirichlet_partition(y, 10, 0.5, np.random.default_rng(0), min_size=30)


def test_dirichlet_min_size_unmet_by_the_runaway_guard():
    y = balanced_labels(10, 20)  # 200 samples, 10 clients: min_size=19 needs an almost even split
    with pytest.raises(
        ConfigError, match=r"^data\.partition\.min_size=19 was met by none of 5 draws.*run-away guard"
    ):
        dirichlet_partition(y, 10, 0.05, np.random.default_rng(0), min_size=19, max_draws=5)


@pytest.mark.parametrize("alpha", [0.0, -1.0, float("nan"), float("inf")])
def test_dirichlet_alpha_must_be_positive(alpha):
    with pytest.raises(ConfigError, match=r"data\.partition\.alpha"):
        Dirichlet(alpha=alpha)
    with pytest.raises(ConfigError, match=r"data\.partition\.alpha"):
        DirichletWithReplacement(alpha=alpha)
    with pytest.raises(ConfigError, match=r"data\.partition\.alpha"):
        dirichlet_partition(balanced_labels(2, 10), 2, alpha, np.random.default_rng(0), min_size=0)


def test_alpha_error_message_is_one_line_and_says_how_to_fix():
    with pytest.raises(ConfigError) as info:
        Dirichlet(alpha=-1.0)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith("data.partition.alpha=-1.0 must be > 0")
    assert "0.1" in msg


def test_dirichlet_min_size_must_be_non_negative():
    with pytest.raises(ConfigError, match=r"data\.partition\.min_size"):
        Dirichlet(min_size=-1)


# -------------------------------------------------------------------------------------- pathological
def test_pathological_exact_classes_per_client_and_exact_cover():
    y = balanced_labels(10, 50)
    parts = pathological_partition(y, 20, 2, np.random.default_rng(0))
    assert_well_formed(parts, 20, len(y))
    assert_exact_cover(parts, len(y))
    holders = np.zeros(10, dtype=int)
    for p in parts:
        classes = np.unique(y[p])
        assert len(classes) == 2
        holders[classes] += 1
    # 20 clients x 2 classes over 10 classes: every class is held by exactly 4 clients, so each of
    # them gets a quarter (12 or 13) of the class's 50 samples.
    np.testing.assert_array_equal(holders, 4)
    counts = partition_counts(y, parts, 10)
    assert set(np.unique(counts[counts > 0]).tolist()) <= {12, 13}


def test_pathological_uneven_holders_differ_by_at_most_one():
    y = balanced_labels(10, 30)
    parts = pathological_partition(y, 7, 3, np.random.default_rng(1))  # 21 slots over 10 classes
    assert_exact_cover(parts, len(y))
    counts = partition_counts(y, parts, 10)
    holders = (counts > 0).sum(axis=0)
    assert holders.min() >= 2 and holders.max() <= 3
    assert ((counts > 0).sum(axis=1) == 3).all()


def test_pathological_class_with_all_classes_is_a_class_stratified_split():
    y = balanced_labels(4, 10)
    parts = Pathological(classes_per_client=4)(y, 2, np.random.default_rng(0))
    np.testing.assert_array_equal(partition_counts(y, parts, 4), np.full((2, 4), 5))


@pytest.mark.parametrize("c", [0, -2, 11])
def test_pathological_classes_per_client_out_of_range(c):
    y = balanced_labels(10, 5)
    with pytest.raises(ConfigError, match=r"data\.partition\.classes_per_client"):
        pathological_partition(y, 5, c, np.random.default_rng(0))
    with pytest.raises(ConfigError, match=r"data\.partition\.classes_per_client"):
        pathological_with_replacement(y, 5, c, np.random.default_rng(0))


def test_pathological_classes_validated_in_init():
    with pytest.raises(ConfigError, match=r"data\.partition\.classes_per_client"):
        Pathological(classes_per_client=0)
    with pytest.raises(ConfigError, match=r"data\.partition\.classes_per_client"):
        PathologicalWithReplacement(classes_per_client=0)
    with pytest.raises(ConfigError, match=r"data\.partition\.classes_per_client=11 exceeds the 10 classes"):
        Pathological(classes_per_client=11)(balanced_labels(10, 5), 5, np.random.default_rng(0))


def test_pathological_too_few_samples_per_class():
    y = balanced_labels(2, 3)  # each class has 3 samples but would be held by 5 clients
    with pytest.raises(ConfigError, match=r"data\.partition\.classes_per_client"):
        pathological_partition(y, 5, 2, np.random.default_rng(0))


# ------------------------------------------------------------------------------------------- refill
# ---------------------------------------------------------------------------- label quantity (#C=k)
def assert_classes_split_evenly(y: np.ndarray, parts: list[np.ndarray], num_classes: int) -> None:
    """Each class's samples are split among its holders with sizes differing by at most one."""
    counts = partition_counts(y, parts, num_classes)
    for k in range(num_classes):
        held = counts[:, k][counts[:, k] > 0]
        if len(held):
            assert held.sum() == (y == k).sum() and held.max() - held.min() <= 1


def test_label_quantity_as_niid_bench_ten_parties_two_classes():
    """NIID-Bench's noniid-#label2 with 10 parties: party i holds class i and one random other class; a
    class has as many holders as drew it (not two each, as Pathological's round-robin gives), so there are
    more than five distinct class pairs and the clients' sizes differ."""
    y = balanced_labels(10, 60)
    holder_counts = []
    for seed in range(20):
        parts = label_quantity_partition(y, 10, 2, np.random.default_rng(seed))
        assert_well_formed(parts, 10, len(y))
        assert_exact_cover(parts, len(y))  # with 10 clients every class is drawn (client i draws class i)
        counts = partition_counts(y, parts, 10)
        held = [frozenset(np.flatnonzero(row).tolist()) for row in counts]
        assert all(len(h) == 2 and i in h for i, h in enumerate(held))
        assert len(set(held)) > 5
        holders = (counts > 0).sum(axis=0)
        assert holders.min() < holders.max()  # unequal numbers of holders
        assert len({len(p) for p in parts}) > 1  # unequal client sizes
        assert_classes_split_evenly(y, parts, 10)
        holder_counts.append(holders)
    # Class j's holders: client j plus each other client drawing it with probability 1/9, i.e.
    # 1 + Binomial(9, 1/9): mean 2, variance 8/9 (round-robin would give variance 0).
    holder_counts = np.concatenate(holder_counts)
    assert holder_counts.mean() == 2.0
    assert holder_counts.var() == pytest.approx(8 / 9, rel=0.25)


def test_label_quantity_is_seeded_and_the_class_matches_the_function():
    y = balanced_labels(10, 30)
    a = label_quantity_partition(y, 10, 3, np.random.default_rng(5))
    b = LabelQuantity(classes_per_client=3)(y, 10, np.random.default_rng(5))
    c = label_quantity_partition(y, 10, 3, np.random.default_rng(6))
    assert all(np.array_equal(x, z) for x, z in zip(a, b))
    assert not all(np.array_equal(x, z) for x, z in zip(a, c))
    part = get_partitioner("label_quantity", classes_per_client=3)
    assert isinstance(part, LabelQuantity) and repr(part) == "LabelQuantity(classes_per_client=3)"
    counts = partition_counts(y, a, 10)
    assert ((counts > 0).sum(axis=1) == 3).all() and all(counts[i, i] > 0 for i in range(10))


def test_label_quantity_one_class_and_every_class():
    y = balanced_labels(10, 41)
    # k = 1: client i holds class i mod 10 alone; 20 clients: every class split between two clients
    parts = label_quantity_partition(y, 20, 1, np.random.default_rng(0))
    counts = partition_counts(y, parts, 10)
    assert all(np.flatnonzero(counts[i]).tolist() == [i % 10] for i in range(20))
    assert_exact_cover(parts, len(y))
    assert_classes_split_evenly(y, parts, 10)
    # k = K: every client holds every class, a class-stratified split
    parts = label_quantity_partition(y, 4, 10, np.random.default_rng(0))
    counts = partition_counts(y, parts, 10)
    assert (counts > 0).all() and counts.max() - counts.min() <= 1
    assert_exact_cover(parts, len(y))


def test_label_quantity_class_nobody_drew_is_unused():
    y = balanced_labels(10, 20)
    parts = label_quantity_partition(y, 3, 1, np.random.default_rng(0))  # classes 0, 1, 2 only
    counts = partition_counts(y, parts, 10)
    assert counts[:, 3:].sum() == 0 and counts[[0, 1, 2], [0, 1, 2]].tolist() == [20, 20, 20]
    assert sum(len(p) for p in parts) == 60


@pytest.mark.parametrize("k", [0, 11, -1, 2.5, True])
def test_label_quantity_bad_classes_per_client_is_one_line(k):
    y = balanced_labels(10, 20)
    with pytest.raises(ConfigError, match=r"^data\.partition\.classes_per_client=") as err:
        label_quantity_partition(y, 10, k, np.random.default_rng(0))
    assert "\n" not in str(err.value)
    if k != 11:  # the upper bound needs the data's classes
        with pytest.raises(ConfigError, match=r"^data\.partition\.classes_per_client="):
            LabelQuantity(classes_per_client=k)


def test_label_quantity_too_few_samples_for_the_holders():
    y = np.array([0] * 50 + [1] * 2)  # class 1 has two samples; with 4 clients and k = 2 it has 4 holders
    with pytest.raises(ConfigError, match=r"classes_per_client=2 .* class 1 to 4 clients .* only 2 samples"):
        label_quantity_partition(y, 4, 2, np.random.default_rng(0))


def test_refill_sizes_equal_with_remainder_on_client_zero():
    y = np.arange(103) % 4
    prior = np.full((10, 4), 0.25)
    parts = refill_partition(y, 10, prior, np.random.default_rng(0))
    assert_well_formed(parts, 10, 103)
    assert [len(p) for p in parts] == [13] + [10] * 9
    assert sum(len(p) for p in parts) == 103


def test_refill_one_hot_priors_give_each_client_its_whole_class():
    """Demand never exceeds a class's size, so no refill happens and nothing is duplicated."""
    y = balanced_labels(4, 100)
    parts = refill_partition(y, 4, np.eye(4), np.random.default_rng(0))
    for i, p in enumerate(parts):
        np.testing.assert_array_equal(p, np.flatnonzero(y == i))


def test_refill_zero_prior_classes_never_appear_and_labels_within_support():
    y = balanced_labels(5, 40)
    rng = np.random.default_rng(0)
    prior = np.zeros((8, 5))
    for i in range(8):
        prior[i, [i % 5, (i + 2) % 5]] = [0.3, 0.7]
    prior[:, 4] = 0.0  # class 4 has no mass anywhere
    prior /= prior.sum(axis=1, keepdims=True)
    parts = refill_partition(y, 8, prior, rng)
    counts = partition_counts(y, parts, 5)
    assert counts[:, 4].sum() == 0
    for i, p in enumerate(parts):
        assert set(np.unique(y[p]).tolist()) <= set(np.flatnonzero(prior[i] > 0).tolist())


def test_refill_must_duplicate_when_a_small_class_is_in_demand():
    """Class 0 has 2 samples, class 1 has 100, and every client only wants class 0."""
    y = np.array([0, 0] + [1] * 100)
    prior = np.tile([1.0, 0.0], (2, 1))
    parts = refill_partition(y, 2, prior, np.random.default_rng(0))
    assert [len(p) for p in parts] == [51, 51]
    for p in parts:
        assert set(p.tolist()) <= {0, 1}  # only the 2 samples of class 0, repeated
    # Both clients hold both samples (duplicates across clients) and repeats within a client are kept.
    assert set(parts[0].tolist()) & set(parts[1].tolist())
    per_class = partition_counts(y, parts, 2).sum(axis=0)
    np.testing.assert_array_equal(per_class, [102, 0])  # unequal per-class totals


def test_refill_rejects_mass_on_empty_classes_and_bad_shapes():
    y = np.array([0, 0, 2, 2])
    with pytest.raises(ValueError, match="without samples"):
        refill_partition(y, 2, np.array([[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]]), np.random.default_rng(0))
    with pytest.raises(ValueError, match="shape"):
        refill_partition(y, 2, np.ones((3, 3)) / 3, np.random.default_rng(0))


def test_dirichlet_with_replacement_cifar_scale():
    """50,000 CIFAR-like labels over 100 clients at alpha=0.1 (the FedSMOO setting).

    Each client's labels are 500 draws from its prior p ~ Dir(alpha * 1_C), so the mean over clients of
    sum_k phat_k^2 estimates E[sum_k p_k^2] + (1 - E[sum_k p_k^2]) / 500, E[sum_k p_k^2] = (alpha + 1) /
    (C alpha + 1) = 0.55 (0.1 for IID clients, 1 for one class each).
    """
    y = balanced_labels(10, 5000)
    parts = dirichlet_with_replacement(y, 100, 0.1, np.random.default_rng(0))
    assert_well_formed(parts, 100, len(y))
    assert all(len(p) == 500 for p in parts)
    counts = partition_counts(y, parts, 10)
    concentration = float(((counts / 500) ** 2).sum(axis=1).mean())
    expected = 1.1 / 2.0
    assert concentration == pytest.approx(expected + (1 - expected) / 500, abs=0.05)
    per_class = counts.sum(axis=0)
    assert per_class.sum() == 50_000
    assert per_class.std() > 200, "per-class totals over the federation are unequal"
    # Sampling with replacement: some sample is held by more than one client.
    assert len(np.unique(np.concatenate(parts))) < 50_000


def test_dirichlet_with_replacement_class_is_deterministic():
    y = balanced_labels(10, 50)
    part = DirichletWithReplacement(alpha=0.3)
    a = part(y, 10, np.random.default_rng(5))
    b = part(y, 10, np.random.default_rng(5))
    assert all(np.array_equal(pa, pb) for pa, pb in zip(a, b))
    assert repr(part) == "DirichletWithReplacement(alpha=0.3)"


def test_pathological_with_replacement_labels_within_c_classes():
    y = balanced_labels(10, 100)
    parts = PathologicalWithReplacement(classes_per_client=3)(y, 20, np.random.default_rng(0))
    assert_well_formed(parts, 20, len(y))
    assert all(len(p) == 50 for p in parts)
    for p in parts:
        assert 1 <= len(np.unique(y[p])) <= 3


def test_pathological_with_replacement_single_class():
    y = balanced_labels(3, 30)
    parts = pathological_with_replacement(y, 9, 1, np.random.default_rng(2))
    assert all(len(np.unique(y[p])) == 1 for p in parts)


# ------------------------------------------------------------------------------------------- counts
def test_partition_counts_multiclass_by_hand():
    y = np.array([0, 1, 1, 2, 2, 2])
    parts = [np.array([0, 1]), np.array([2, 3, 3]), np.array([], dtype=np.int64)]
    np.testing.assert_array_equal(partition_counts(y, parts, 4), [[1, 1, 0, 0], [0, 1, 2, 0], [0, 0, 0, 0]])


def test_partition_counts_multilabel_counts_occurrences():
    y = np.array([[1, 0, 1], [1, 1, 0], [0, 0, 1]])
    counts = partition_counts(y, [np.array([0, 1]), np.array([2])], 3)
    assert counts.dtype == np.int64
    np.testing.assert_array_equal(counts, [[2, 1, 1], [0, 0, 1]])


def test_partition_counts_sum_to_client_sizes():
    y = balanced_labels(6, 30)
    parts = dirichlet_partition(y, 5, 0.5, np.random.default_rng(0), min_size=1)
    counts = partition_counts(y, parts, 6)
    np.testing.assert_array_equal(counts.sum(axis=1), [len(p) for p in parts])
    np.testing.assert_array_equal(counts.sum(axis=0), np.bincount(y))


# --------------------------------------------------------------------------------- errors, registry
def test_check_num_clients_messages():
    with pytest.raises(
        ConfigError, match=r"data\.num_clients=5000 exceeds the 1437 training samples of 'digits'"
    ):
        check_num_clients(1437, 5000, dataset="digits")
    with pytest.raises(ConfigError, match=r"data\.num_clients=0"):
        check_num_clients(10, 0)
    check_num_clients(10, 10)


@pytest.mark.parametrize(
    "name", ["iid", "dirichlet", "pathological", "label_quantity", "dirichlet_with_replacement"]
)
def test_partitioners_reject_more_clients_than_samples(name):
    y = balanced_labels(2, 5)
    with pytest.raises(ConfigError, match=r"data\.num_clients=11 exceeds the 10 training samples"):
        get_partitioner(name)(y, 11, np.random.default_rng(0))


def test_registry_and_get_partitioner():
    assert list_partitioners() == sorted(
        [
            "iid",
            "dirichlet",
            "pathological",
            "label_quantity",
            "dirichlet_with_replacement",
            "pathological_with_replacement",
            "quantity_skew",
            "mixed_skew",
            "natural_users",
        ]
    )
    for name, cls in PARTITIONERS.items():
        assert issubclass(cls, Partitioner) and cls.name == name
    part = get_partitioner("dirichlet", alpha=0.1, min_size=2)
    assert isinstance(part, Dirichlet) and part.alpha == 0.1 and part.min_size == 2
    assert repr(get_partitioner("pathological", classes_per_client=3)) == "Pathological(classes_per_client=3)"
    assert repr(get_partitioner("iid")) == "IID()"


def test_unknown_partitioner_name_lists_choices():
    with pytest.raises(ConfigError, match=r"data\.partition='shards' is unknown; choose one of .*dirichlet"):
        get_partitioner("shards")
    with pytest.raises(ConfigError, match=r"data\.partition"):
        get_partitioner("dirichlet", beta=1.0)


# ------------------------------------------------------------------------------------ quantity skew
def test_quantity_skew_covers_once_with_iid_labels_and_at_least_min_size():
    y = balanced_labels(10, 600)
    parts = quantity_skew_partition(len(y), 10, 0.5, np.random.default_rng(0), min_size=10)
    assert_well_formed(parts, 10, len(y))
    assert_exact_cover(parts, len(y))
    sizes = np.array([len(p) for p in parts])
    assert sizes.min() >= 10 and sizes.max() > 3 * sizes.min()  # Dir(0.5): very unequal amounts
    counts = partition_counts(y, parts, 10)
    big = int(np.argmax(sizes))  # labels stay IID: the largest client's class shares are near 1/10
    assert np.abs(counts[big] / sizes[big] - 0.1).max() < 0.05


def test_quantity_skew_sizes_are_dirichlet_shares():
    """The mean share of a client over many draws is 1/m; a larger alpha gives more equal sizes."""
    n, m = 10_000, 5
    shares = {a: [] for a in (0.5, 50.0)}
    for seed in range(200):
        for a in shares:
            parts = quantity_skew_partition(n, m, a, np.random.default_rng(seed), min_size=1)
            shares[a].append([len(p) / n for p in parts])
    mean = np.mean(shares[0.5], axis=0)
    assert np.allclose(mean, 1 / m, atol=0.04)  # about 4 standard errors
    # Var of a Dir(alpha * 1_m) share: (1/m)(1 - 1/m) / (m alpha + 1)
    for a, s in shares.items():
        expected = (1 / m) * (1 - 1 / m) / (m * a + 1)
        assert np.var(np.asarray(s)[:, 0]) == pytest.approx(expected, rel=0.35)


def test_quantity_skew_is_seeded_and_checks_its_arguments():
    a = quantity_skew_partition(500, 5, 0.3, np.random.default_rng(4))
    b = QuantitySkew(alpha=0.3)(np.zeros(500), 5, np.random.default_rng(4))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    with pytest.raises(ConfigError, match=r"^data\.partition\.min_size=0 must be an integer >= 1"):
        QuantitySkew(min_size=0)
    with pytest.raises(ConfigError, match=r"data\.partition\.min_size=10 is impossible"):
        quantity_skew_partition(50, 6, 0.5, np.random.default_rng(0))
    with pytest.raises(ConfigError, match=r"data\.partition\.alpha"):
        QuantitySkew(alpha=0)


def sequential_quantity_skew(n, m, alpha, rng, min_size):
    """NIID-Bench's redraw loop written plainly, one Dirichlet draw at a time (integer sizes checked)."""
    perm = rng.permutation(n)
    draws = 0
    while True:
        q = rng.dirichlet(np.full(m, alpha))
        draws += 1
        edges = np.concatenate(([0], (np.cumsum(q) * n).astype(np.int64)))
        edges[-1] = n
        edges = np.maximum.accumulate(edges)
        if np.diff(edges).min() >= min_size:
            return [np.sort(perm[edges[i] : edges[i + 1]]) for i in range(m)], draws


@pytest.mark.parametrize("n", [60_000, 6_000])
def test_quantity_skew_at_beta_0_1_reaches_min_size_for_every_seed(n):
    """NIID-Bench's iid-diff-quantity at beta = 0.1, 10 parties: every seed succeeds (no cap on the redraws;
    ~200 draws at 60,000 samples, thousands at 6,000), every client has 10 samples or more, and 10 itself is
    reached: the check accepts exactly min_size (a check accepting 9, or demanding 11, fails here)."""
    smallest = []
    for seed in range(220):
        parts = quantity_skew_partition(n, 10, 0.1, np.random.default_rng(seed), min_size=10)
        sizes = [len(p) for p in parts]
        assert sum(sizes) == n
        smallest.append(min(sizes))
    assert min(smallest) == 10, sorted(smallest)[:5]
    via_class = QuantitySkew(alpha=0.1, min_size=10)(np.zeros(n), 10, np.random.default_rng(0))
    assert min(len(p) for p in via_class) == smallest[0]


def test_quantity_skew_redraws_exactly_as_the_sequential_loop():
    """The batched redraws accept the same draw as the one-at-a-time loop for the same seed, so the
    partition (and the distribution of the sizes) is NIID-Bench's redraw-until-valid; some seeds need
    hundreds of redraws (batches up to the largest size)."""
    draws = []
    for seed in range(25):
        ref, k = sequential_quantity_skew(60_000, 10, 0.1, np.random.default_rng(seed), 10)
        got = quantity_skew_partition(60_000, 10, 0.1, np.random.default_rng(seed), min_size=10)
        assert all(np.array_equal(a, b) for a, b in zip(ref, got)), seed
        draws.append(k)
    assert max(draws) > 1 + 2 + 4 + 8 + 16 + 32 + 64 + 128 + 256


def test_dirichlet_redraws_exactly_as_the_sequential_loop():
    """As NIID-Bench's noniid-labeldir loop: all classes' shares redrawn until every client has min_size;
    the batched redraws accept the same draw (the same class counts per client) as one draw at a time."""
    y = balanced_labels(10, 100)
    draws = []
    for seed in range(6):
        rng = np.random.default_rng(seed)
        k = 0
        while True:  # the plain loop: one Dir(alpha 1_m) row per class, per draw
            k += 1
            counts = np.zeros((10, 10), dtype=np.int64)  # [client, class]
            for c in range(10):
                edges = np.concatenate(
                    ([0], (np.cumsum(rng.dirichlet(np.full(10, 0.3))) * 100).astype(np.int64))
                )
                edges[-1] = 100
                counts[:, c] = np.diff(np.maximum.accumulate(edges))
            if counts.sum(axis=1).min() >= 70:
                break
        draws.append(k)
        parts = dirichlet_partition(y, 10, 0.3, np.random.default_rng(seed), min_size=70)
        assert_exact_cover(parts, len(y))
        np.testing.assert_array_equal(partition_counts(y, parts, 10), counts)
    assert max(draws) > 255  # past the batches of 1, 2, ..., 128


def test_min_size_impossible_is_one_line():
    for call in (
        lambda: quantity_skew_partition(99, 10, 0.1, np.random.default_rng(0), min_size=10),
        lambda: dirichlet_partition(balanced_labels(3, 33), 10, 0.1, np.random.default_rng(0), min_size=10),
        lambda: mixed_partition(balanced_labels(3, 33), 10, 0.1, np.random.default_rng(0), min_size=10),
    ):
        with pytest.raises(
            ConfigError, match=r"^data\.partition\.min_size=10 is impossible: 10 clients"
        ) as err:
            call()
        assert "\n" not in str(err.value) and "use data.partition.min_size <= 9" in str(err.value)


def test_mixed_partition_redraws_until_every_client_has_min_size():
    y = balanced_labels(10, 100)
    smallest = [
        min(len(p) for p in mixed_partition(y, 10, 0.3, np.random.default_rng(seed), min_size=60))
        for seed in range(30)
    ]
    assert min(smallest) >= 60 and min(smallest) <= 62
    with pytest.raises(ConfigError, match=r"^data\.partition\.min_size=100 was met by none of 50 draws"):
        mixed_partition(y, 10, 0.3, np.random.default_rng(0), min_size=100, max_draws=50)


# --------------------------------------------------------------------------------------------- mixed
def test_mixed_assignment_as_niid_bench_ten_parties_ten_classes():
    classes = np.arange(10)
    for seed in range(5):
        held = mixed_class_assignment(10, classes, 2, np.random.default_rng(seed))
        assert [h[0] for h in held] == list(range(10))  # party i holds class i first
        assert all(len(set(h)) == 2 for h in held)
        holders = np.bincount([k for h in held for k in h], minlength=10)
        assert holders.tolist() == [2] * 10  # every class has exactly two holders


def test_mixed_partition_label_and_quantity_skew():
    y = balanced_labels(10, 300)
    parts = mixed_partition(y, 10, 0.5, np.random.default_rng(1), classes_per_client=2, min_size=10)
    assert_well_formed(parts, 10, len(y))
    assert_exact_cover(parts, len(y))  # every class is held, every sample assigned once
    counts = partition_counts(y, parts, 10)
    assert ((counts > 0).sum(axis=1) <= 2).all()
    assert all(counts[i, i] >= 0 for i in range(10)) and min(len(p) for p in parts) >= 10
    sizes = [len(p) for p in parts]
    assert max(sizes) > 1.5 * min(sizes)
    again = MixedSkew(alpha=0.5)(y, 10, np.random.default_rng(1))
    assert all(np.array_equal(x, z) for x, z in zip(parts, again))


def test_mixed_partition_with_more_clients_than_classes():
    y = balanced_labels(4, 200)
    parts = mixed_partition(y, 10, 1.0, np.random.default_rng(0), classes_per_client=2, min_size=5)
    counts = partition_counts(y, parts, 4)
    assert ((counts > 0).sum(axis=1) <= 2).all() and min(len(p) for p in parts) >= 5
    with pytest.raises(ConfigError, match="classes_per_client"):
        MixedSkew(classes_per_client=0)


# ------------------------------------------------------------------------------------ natural users
def test_natural_users_one_client_per_user_or_a_seeded_sample():
    owners = np.array([2, 0, 0, 1, 2, 2, 1])
    parts, users = natural_user_partition(owners, 3, 3, np.random.default_rng(0))
    assert users.tolist() == [0, 1, 2] and [p.tolist() for p in parts] == [[1, 2], [3, 6], [0, 4, 5]]
    two, chosen = NaturalUsers().split_users(owners, 3, 2, np.random.default_rng(0), "x")
    assert len(two) == 2 and all(owners[p].tolist() == [u] * len(p) for p, u in zip(two, chosen))
    with pytest.raises(
        ConfigError,
        match=r"^data\.num_clients=4 disagrees with the 3 users of 'x'.*"
        r"set data\.num_clients=3",
    ):
        natural_user_partition(owners, 3, 4, np.random.default_rng(0), "x")
    # a user without samples (all held out for validation) is not a client
    parts, users = natural_user_partition(np.array([0, 0, 2]), 3, 2, np.random.default_rng(0))
    assert users.tolist() == [0, 2]


def test_natural_users_without_a_file_is_not_a_plain_partition():
    with pytest.raises(ConfigError, match="NaturalUsers"):
        NaturalUsers()(np.zeros(4), 2, np.random.default_rng(0))
