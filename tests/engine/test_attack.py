"""fl_lightning.engine.attack: the run's one simulated attack (``model.attack`` or the ``Attack`` plug-in),
drawn from the run seed, applied by the engine at one point of the round to any strategy."""

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from fl_lightning.api import StrategyWrapper
from fl_lightning.data import IID
from fl_lightning.engine.attack import SimulatedAttack, as_attack, declared_attacks, run_attack
from fl_lightning.errors import ConfigError
from fl_lightning.functional.robust import malicious_clients
from fl_lightning.strategies import Attack, FedAvg, FedProx, Median

from conftest import global_weights, make_data, make_engine, make_module, make_trainer


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


def test_the_run_attack_is_model_attack_or_the_plug_in_nested_anywhere():
    attack = SimulatedAttack("scale", 0.4, 3.0)
    assert run_attack(None, FedAvg()) is None
    assert run_attack(attack, Median(FedAvg())) == ("model.attack", attack)
    nested = Median(Attack(FedProx(mu=0.1), fraction=0.4, kind="scale", scale=3.0))
    assert declared_attacks(nested) == [("Attack", attack)]
    assert run_attack(None, nested) == ("model.strategy (Attack)", attack)


@pytest.mark.parametrize(
    ("configured", "strategy"),
    [
        (SimulatedAttack(), lambda: Attack(FedAvg())),
        (None, lambda: Attack(Attack(FedAvg()))),
    ],
)
def test_two_attacks_in_one_run_are_one_line(configured, strategy):
    with pytest.raises(ConfigError, match="both simulate an attack; keep one") as err:
        make_engine(strategy(), num_clients=5, attack=configured)
    assert "\n" not in str(err.value)


class Halve(StrategyWrapper):
    """A client-side plug-in after the base: it sends half its update (``w^t + Delta_k / 2``)."""

    def process_upload(self, upload, ctx):
        upload = self.base.process_upload(upload, ctx)
        sent = ctx.message["weights"]
        return {**upload, "weights": {n: (t + sent[n]) / 2 for n, t in upload["weights"].items()}}


def _engine_weights(strategy, attack=None, rounds=2):
    engine = make_engine(strategy, num_clients=5, attack=attack)
    for r in range(rounds):
        engine.run_round(r)
    return {k: v.detach().clone() for k, v in engine.model.state_dict().items()}


def test_the_attack_replaces_the_upload_after_the_whole_process_upload_chain_however_it_is_nested():
    """One place in the round: the plug-in inside Halve attacks what Halve sent, as model.attack does."""
    attack = {"kind": "sign_flip", "fraction": 0.4, "scale": 4.0}
    top = _engine_weights(Halve(FedAvg()), as_attack(attack))
    nested = _engine_weights(Halve(Attack(FedAvg(), **attack)))
    assert _same(top, nested)
    assert not _same(top, _engine_weights(Halve(FedAvg())))
