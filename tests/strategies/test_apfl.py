"""APFL: the global model is FedAvg's; the local model and its mixing weight follow Alg. 1."""

import pytest
import torch
from drift_helpers import assert_resume_is_identical, least_squares_module, single_client
from personal_helpers import personal_model

from fl_lightning.cli import main
from fl_lightning.engine.local import LocalConfig, train_client
from fl_lightning.errors import ConfigError
from fl_lightning.strategies import APFL, FedAvg
from fl_lightning.strategies.apfl import ALPHA, LOCAL

from conftest import global_weights, make_module

W = "net.weight"


def test_two_steps_by_hand():
    # f(w) = 1/2 mean_j (x_j . w - y_j)^2, full batch; w^t = 0, v_0 = (1, -1), alpha_0 = 0.3, lr 0.1, K = 2
    x = torch.tensor([[1.0, 2.0], [0.5, -1.0], [2.0, 0.0]], dtype=torch.float64)
    y = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)
    lr, alpha_lr = 0.1, 0.05
    worker = least_squares_module(2, lr=lr)
    strategy = APFL(alpha=0.3, alpha_lr=alpha_lr)
    strategy.setup(worker, 1)
    w = torch.zeros(1, 2, dtype=torch.float64)
    v = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    state = {LOCAL + W: v.clone(), ALPHA: torch.tensor(0.3, dtype=torch.float64)}
    res = train_client(
        worker, strategy, {"weights": {W: w}}, state, single_client(x, y), 0, LocalConfig(3, local_steps=2)
    )

    def grad(u):
        return ((x @ u.T).squeeze(-1) - y) @ x / len(y)

    alpha = 0.3
    for _ in range(2):  # every update from the values before the step
        g = grad(alpha * v + (1 - alpha) * w)
        new_alpha = min(max(alpha - alpha_lr * float(((v - w) * g).sum()), 0.0), 1.0)
        v, alpha, w = v - lr * alpha * g, new_alpha, w - lr * grad(w)
    torch.testing.assert_close(res.upload["weights"][W], w)
    torch.testing.assert_close(res.state[LOCAL + W], v)
    torch.testing.assert_close(float(res.state[ALPHA]), alpha)
    assert alpha != 0.3


def test_fixed_alpha_stays_and_the_deployed_model_is_the_mixture(fit):
    module = make_module(APFL(alpha=0.25, adaptive=False))
    fit(module, rounds=2)
    glob = global_weights(module)
    state = module.store.get(0)
    assert float(state[ALPHA]) == 0.25
    deployed = personal_model(module, 0)
    for n in glob:
        torch.testing.assert_close(deployed[n], 0.25 * state[LOCAL + n] + 0.75 * glob[n])


def test_global_model_is_bit_identical_to_fedavg(fit):
    plain, apfl = make_module(FedAvg()), make_module(APFL())
    fit(plain, rounds=2)
    fit(apfl, rounds=2)
    a, b = global_weights(plain), global_weights(apfl)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("alpha", [-0.1, 1.5, float("nan")])
def test_alpha_out_of_range_is_one_line_naming_the_field(alpha):
    with pytest.raises(ConfigError, match=r"^model\.strategy\.alpha=.* must be .*in \[0, 1\]") as err:
        APFL(alpha=alpha)
    assert "\n" not in str(err.value)


def test_a_resumed_run_is_bit_identical(tmp_path):
    assert_resume_is_identical(tmp_path, lambda: make_module(APFL()))


def _cli_error(tmp_path, capsys, *args):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--trainer.max_steps=1", f"--trainer.default_root_dir={tmp_path}", *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_the_cli_takes_its_arguments_and_refuses_alpha_out_of_range_in_one_line(tmp_path, capsys):
    line = _cli_error(tmp_path, capsys, "--model.strategy=APFL", "--model.strategy.alpha=1.5")
    assert line.startswith("error: model.strategy.alpha=1.5 must be in [0, 1]")
