"""model.attack: simulated malicious clients drawn from the run seed, applied by the loop to any strategy."""

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from fl_lightning.data import IID
from fl_lightning.engine.attack import SimulatedAttack, as_attack
from fl_lightning.errors import ConfigError
from fl_lightning.functional.robust import malicious_clients
from fl_lightning.strategies import Attack, FedAvg, Median

from conftest import global_weights, make_data, make_engine, make_module, make_trainer


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


def test_the_attackers_are_a_fixed_draw_from_the_run_seed():
    attack = SimulatedAttack(fraction=0.3)
    bad = attack.malicious(10, seed=0)
    assert len(bad) == 3 and bad == attack.malicious(10, seed=0) == malicious_clients(10, 0.3, 0)
    assert len({attack.malicious(10, seed=s) for s in range(6)}) > 1  # another seed, other clients
    assert SimulatedAttack(fraction=0.0).malicious(10, 0) == frozenset()
    assert SimulatedAttack(fraction=1.0).malicious(10, 0) == frozenset(range(10))


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"kind": "noise"}, "model.attack.kind"),
        ({"fraction": 1.5}, "model.attack.fraction"),
        ({"fraction": float("nan")}, "model.attack.fraction"),
        ({"scale": 0.0}, "model.attack.scale"),
        ({"scale": float("inf")}, "model.attack.scale"),
        ({"fraction": 0.2, "ratio": 1}, "model.attack: unknown option"),
        ("sign_flip", "model.attack="),
    ],
)
def test_bad_attack_values_are_one_line_config_errors(value, field):
    with pytest.raises(ConfigError, match=field) as err:
        make_module(attack=value)
    assert "\n" not in str(err.value)


def test_a_dict_from_python_is_an_attack():
    assert as_attack({"kind": "scale", "fraction": 0.5, "scale": 2.0}) == SimulatedAttack("scale", 0.5, 2.0)
    assert as_attack(None) is None


def _run(tmp_path, rounds=2, seed=0, **kw):
    module = make_module(local_steps=3, seed=seed, **kw)
    make_trainer(tmp_path, rounds=rounds).fit(module, datamodule=make_data(num_clients=5, partition=IID()))
    return global_weights(module)


def _same(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("seed", [0, 3])  # attackers {1, 4} and {0, 2}
def test_model_attack_is_the_attack_plug_in_without_nesting_both_seeded_by_the_run(tmp_path, seed):
    """One implementation: model.attack on FedAvg gives the weights of Attack(FedAvg()) for each run seed."""
    attack = {"kind": "sign_flip", "fraction": 0.4, "scale": 4.0}
    top = _run(tmp_path / "a", seed=seed, attack=attack)
    nested = _run(tmp_path / "b", seed=seed, strategy=Attack(FedAvg(), **attack))
    clean = _run(tmp_path / "c", seed=seed)
    assert _same(top, nested)
    assert not _same(top, clean)
    assert _same(_run(tmp_path / "d", seed=seed, attack={"fraction": 0}), clean)


def test_the_engine_attacks_with_the_run_seed():
    attack = as_attack({"fraction": 0.4})
    for seed in (0, 3):
        engine = make_engine(num_clients=5, seed=seed, attack=attack)
        assert engine.malicious() == malicious_clients(5, 0.4, seed)
    assert make_engine(num_clients=5, seed=0, attack=attack).malicious() != engine.malicious()


def test_resume_with_an_attack_is_exact(tmp_path):
    attack = {"kind": "scale", "fraction": 0.4, "scale": 3.0}
    data = {"num_clients": 5, "partition": IID()}
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpts", save_top_k=-1, filename="{step}")
    full = make_module(strategy=Median(), attack=attack, local_steps=2)
    make_trainer(tmp_path, rounds=3, callbacks=[ckpt], enable_checkpointing=True).fit(
        full, datamodule=make_data(**data)
    )
    resumed = make_module(strategy=Median(), attack=attack, local_steps=2)
    make_trainer(tmp_path / "b", rounds=3).fit(
        resumed, datamodule=make_data(**data), ckpt_path=tmp_path / "ckpts" / "step=1.ckpt"
    )
    a, b = global_weights(full), global_weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
