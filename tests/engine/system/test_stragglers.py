"""FedProx's stragglers (Li et al., MLSys 2020, Sec. 5.2) as the preset plans them."""

import pytest

from fl_lightning.engine.system import RoundPolicy, Setup, Stragglers
from fl_lightning.errors import ConfigError

E = 20


def bound(fraction, policy, epochs=E, steps=None, seed=0, n=30, **more):
    s = Stragglers(fraction=fraction)
    spe = tuple(1 + c % 4 for c in range(n))  # steps per epoch differ by client
    full = tuple((steps if steps is not None else epochs * k) for k in spe)
    setup = Setup(n, seed, 10, full, spe, None if steps is not None else epochs, steps, 4000, 4000)
    s.bind(setup, RoundPolicy(policy=policy, **more))
    return s, spe


@pytest.mark.parametrize(("fraction", "count"), [(0.0, 0), (0.5, 5), (0.9, 9)])
def test_each_round_a_fraction_of_the_selected_devices_are_stragglers(fraction, count):
    partial, spe = bound(fraction, "partial")
    drop, _ = bound(fraction, "drop")
    selected = [1, 4, 6, 9, 12, 15, 18, 22, 25, 29]
    seen = set()
    for r in range(30):
        p, d = partial.plan(r, selected, 10), drop.plan(r, selected, 10)
        assert len(p.partial) == count and p.partial == d.late  # the same stragglers for both methods
        assert d.trained == sorted(set(selected) - set(d.late))  # FedAvg drops them
        assert p.trained == selected  # FedProx keeps their partial work
        for c in p.partial:
            epochs, rest = divmod(p.steps[c], spe[c])
            assert rest == 0 and 1 <= epochs < E  # a uniformly random number of epochs in [1, E)
            seen.add(epochs)
        for c in set(selected) - set(p.partial):
            assert p.steps[c] == E * spe[c] and d.steps[c] == E * spe[c]
        assert p.duration_s == d.duration_s == max(p.finish_s.values())  # the round's window either way
    if count:
        assert seen == set(range(1, E))
        assert (
            partial.plan(3, selected, 10).partial != partial.plan(4, selected, 10).partial
        )  # drawn per round


def test_with_local_steps_a_straggler_runs_steps_in_one_to_k():
    s, _ = bound(0.9, "partial", steps=8)
    plan = s.plan(0, list(range(10)), 10)
    assert all(1 <= plan.steps[c] < 8 for c in plan.partial) and len(plan.partial) == 9


def test_one_epoch_leaves_no_partial_work():
    with pytest.raises(
        ConfigError, match=r"model\.local_epochs=1 leaves empty; set model\.local_epochs >= 2"
    ):
        bound(0.5, "partial", epochs=1)
    bound(0.0, "partial", epochs=1)  # no stragglers: fine


@pytest.mark.parametrize(("kw", "field"), [({"fraction": 1.2}, "fraction"), ({"speed": -1.0}, "speed")])
def test_bad_values(kw, field):
    with pytest.raises(ConfigError, match=rf"^model\.system\.{field}="):
        Stragglers(**kw)


@pytest.mark.parametrize(
    ("more", "field"), [({"deadline_s": 5.0}, "deadline_s"), ({"over_selection": 0.5}, "over_selection")]
)
def test_a_deadline_or_over_selection_cannot_act_on_the_papers_rounds(more, field):
    with pytest.raises(ConfigError) as info:
        bound(0.5, "drop", **more)
    text = str(info.value)
    assert text.startswith(f"model.round_policy.{field}=") and "model.system=Stragglers" in text
    assert "\n" not in text
    s, _ = bound(0.5, "partial", target_accuracy=0.5, max_sim_time_s=10.0)  # the run's goals apply
    assert s.round_policy.max_sim_time_s == 10.0
