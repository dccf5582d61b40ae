"""fl_lightning.data.fedprox_synthetic: FedProx's Synthetic(alpha, beta) generator (Sec. 5.1 and its code)."""

from __future__ import annotations

import numpy as np
import pytest

from fl_lightning.data import FederatedDataModule, FedProxSynthetic, NaturalUsers, load_dataset
from fl_lightning.data.fedprox_synthetic import fedprox_synthetic, generate_devices
from fl_lightning.errors import ConfigError


def test_thirty_devices_of_sixty_dims_ten_classes_with_power_law_sizes():
    splits = fedprox_synthetic(FedProxSynthetic(alpha=1, beta=1, seed=3))
    assert splits.num_classes == 10 and splits.train_x.shape[1] == 60 and len(splits.users) == 30
    assert splits.users[0] == "f_00000" and splits.vocab_size is None
    sizes = np.bincount(splits.train_users, minlength=30) + np.bincount(splits.test_users, minlength=30)
    expected = np.random.default_rng(3).lognormal(4, 2, 30).astype(int) + 50  # the generator's first draw
    assert sizes.tolist() == expected.tolist()
    train = np.bincount(splits.train_users, minlength=30)
    assert train.tolist() == (0.9 * expected).astype(int).tolist()  # each device's own 90/10 split


def test_labels_are_the_argmax_of_each_devices_model_and_inputs_have_the_diagonal_covariance():
    rng = np.random.default_rng(0)
    xs, ys = generate_devices(1.0, 1.0, False, rng, num_devices=30)
    big = int(np.argmax([len(y) for y in ys]))
    var = xs[big].var(axis=0)
    assert len(ys[big]) > 800
    np.testing.assert_allclose(var, np.arange(1, 61) ** -1.2, rtol=0.25)  # Sigma_jj = j^-1.2
    # replaying the code's draws: sizes, u, B, every v_k, then W_0, b_0 ~ N(u_0, 1) and x ~ N(v_0, Sigma)
    rng = np.random.default_rng(0)
    sizes = rng.lognormal(4, 2, 30).astype(int) + 50
    u, big_b = rng.normal(0, 1.0, 30), rng.normal(0, 1.0, 30)
    v = [rng.normal(big_b[k], 1, 60) for k in range(30)]
    w, b = rng.normal(u[0], 1, (60, 10)), rng.normal(u[0], 1, 10)
    x = rng.multivariate_normal(v[0], np.diag(np.arange(1, 61) ** -1.2), sizes[0])
    np.testing.assert_allclose(xs[0], x)
    np.testing.assert_array_equal(ys[0], np.argmax(x @ w + b, axis=1))  # argmax of softmax(W^T x + b)


def test_beta_spreads_the_devices_inputs_and_iid_shares_one_model():
    def spread(beta: float) -> float:
        xs, _ = generate_devices(0.0, beta, False, np.random.default_rng(1))
        return float(np.std([x.mean() for x in xs]))

    assert spread(10.0) > 3 * spread(0.0)
    xs, ys = generate_devices(5.0, 5.0, True, np.random.default_rng(2))
    x, y = np.concatenate(xs), np.concatenate(ys)
    assert abs(x.mean()) < 0.05  # IID: v_k = 0 for every device
    # one shared (W, b): a single multinomial logistic regression separates every device's labels well
    from sklearn.linear_model import LogisticRegression

    acc = LogisticRegression(max_iter=2000).fit(x, y).score(x, y)
    assert acc > 0.9


def test_natural_users_one_client_per_device_with_its_own_test_data():
    dm = FederatedDataModule("fedprox_synthetic", partition=NaturalUsers())
    dm.setup()
    assert dm.num_clients == 30 and len(dm.clients) == 30
    for c in dm.clients[:3]:
        assert (dm.splits.test_users[c.test_idx.numpy()] == c.client_id).all()
        assert (dm.splits.train_users[c.train_idx.numpy()] == c.client_id).all()
    assert dm.fingerprint()["data.fedprox_synthetic"] is not None


def test_seeded_and_options_checked():
    a = load_dataset(FedProxSynthetic(alpha=0.5, beta=0.5, seed=7))
    b = load_dataset(FedProxSynthetic(alpha=0.5, beta=0.5, seed=7))
    assert a.train_x.equal(b.train_x) and a.test_y.equal(b.test_y)
    with pytest.raises(ConfigError, match=r"^data\.dataset\.alpha=-1 must be >= 0"):
        fedprox_synthetic(FedProxSynthetic(alpha=-1))
    with pytest.raises(ConfigError, match=r"^data\.dataset\.num_devices=0 must be an integer >= 1"):
        fedprox_synthetic(FedProxSynthetic(num_devices=0))
