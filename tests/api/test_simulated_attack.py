"""fl_lightning.api.attack: the one simulated attack: its check, its factor, what a malicious client sends."""

import pytest
import torch

from fl_lightning.api import SimulatedAttack
from fl_lightning.errors import ConfigError
from fl_lightning.functional.robust import malicious_clients


def test_a_malicious_client_sends_the_flipped_or_scaled_update_of_its_weights_only():
    sent = {"weights": {"w": torch.tensor([1.0, 2.0])}, "controls": {"c": torch.tensor([5.0])}}
    upload = {"weights": {"w": torch.tensor([2.0, 0.0])}, "controls": {"c": torch.tensor([7.0])}}
    # Delta = (1, -2); sign_flip, s=3: w^t - 3 Delta = (-2, 8); scale, s=3: w^t + 3 Delta = (4, -4)
    for attack, expected in [
        (SimulatedAttack("sign_flip", scale=3.0), [-2.0, 8.0]),
        (SimulatedAttack("scale", scale=3.0), [4.0, -4.0]),
        (SimulatedAttack("sign_flip"), [0.0, 4.0]),
    ]:
        out = attack.apply(upload, sent)
        assert torch.equal(out["weights"]["w"], torch.tensor(expected)), attack
        assert out["controls"] is upload["controls"]  # other groups are sent as they are
    no_weights = {"controls": {"c": torch.tensor([7.0])}}
    assert SimulatedAttack("scale", scale=3.0).apply(no_weights, sent) is no_weights


def test_the_factor_is_minus_scale_for_sign_flip_and_scale_for_scale():
    assert SimulatedAttack("sign_flip", scale=4.0).factor == -4.0
    assert SimulatedAttack("scale", scale=4.0).factor == 4.0


def test_the_attackers_are_a_fixed_draw_from_the_run_seed():
    attack = SimulatedAttack(fraction=0.3)
    bad = attack.malicious(10, seed=0)
    assert len(bad) == 3 and bad == attack.malicious(10, seed=0) == malicious_clients(10, 0.3, 0)
    assert len({attack.malicious(10, seed=s) for s in range(6)}) > 1  # another seed, other clients
    assert SimulatedAttack(fraction=0.0).malicious(10, 0) == frozenset()
    assert SimulatedAttack(fraction=1.0).malicious(10, 0) == frozenset(range(10))


@pytest.mark.parametrize(
    ("attack", "message"),
    [
        (SimulatedAttack("noise"), "<field>.kind='noise' must be 'sign_flip' or 'scale'"),  # type: ignore[arg-type]
        (SimulatedAttack(fraction=1.5), "<field>.fraction=1.5"),
        (SimulatedAttack(fraction=-0.1), "<field>.fraction=-0.1"),
        (SimulatedAttack(scale=0.0), "<field>.scale=0.0"),
        (SimulatedAttack(scale=float("nan")), "<field>.scale=nan"),
    ],
)
def test_one_check_names_the_field_of_either_spelling(attack, message):
    for field in ("model.attack", "model.strategy"):
        with pytest.raises(ConfigError) as err:
            attack.check(field)
        assert str(err.value).startswith(message.replace("<field>", field)) and "\n" not in str(err.value)
    SimulatedAttack("scale", 1.0, 10.0).check()  # the bounds are allowed
