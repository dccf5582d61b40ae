"""The distribution of a metric over clients against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from fl_lightning.functional.outcomes import SPREAD_KEYS, client_spread, generalization_gaps, percentile


@pytest.mark.parametrize("n", [1, 2, 7, 10, 23])
def test_client_spread_matches_numpy(n: int) -> None:
    rng = np.random.default_rng(n)
    v = rng.uniform(size=n)
    w = rng.integers(1, 50, size=n).astype(float)
    s = client_spread(v.tolist(), w.tolist())
    assert list(s) == list(SPREAD_KEYS)
    k = max(1, int(np.ceil(0.1 * n)))
    order = np.sort(v)
    expected = {
        "n": n,
        "mean": v.mean(),
        "weighted_mean": np.average(v, weights=w),
        "std": v.std(),
        "min": v.min(),
        "max": v.max(),
        "bottom10": order[:k].mean(),
        "top10": order[-k:].mean(),
        "p10": np.percentile(v, 10),
        "p50": np.percentile(v, 50),
        "p90": np.percentile(v, 90),
    }
    for key, value in expected.items():
        assert s[key] == pytest.approx(value, abs=1e-12), key


def test_bottom_decile_of_twenty_is_the_two_worst() -> None:
    v = [0.1, 0.2] + [0.9] * 18
    s = client_spread(v)
    assert s["bottom10"] == pytest.approx(0.15)
    assert s["weighted_mean"] == pytest.approx(s["mean"])  # no weights: uniform


def test_percentile_and_errors() -> None:
    assert percentile([0.0, 1.0], 25) == pytest.approx(0.25)
    with pytest.raises(ValueError):
        client_spread([])
    with pytest.raises(ValueError):
        client_spread([1.0, 2.0], [1.0])


def test_generalization_gaps() -> None:
    gaps = generalization_gaps(0.95, 0.9, 0.8)
    assert gaps == pytest.approx({"out_of_sample_gap": 0.05, "participation_gap": 0.1})
    assert generalization_gaps(None, 0.9, None) == {}
