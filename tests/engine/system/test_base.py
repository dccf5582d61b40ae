"""A synchronous round as the system model plans it: deadline (drop, partial), over-selection, dropout,
availability, and the one-line refusal of a deadline no client can meet (engine/system/base.py)."""

import pytest

from fl_lightning.engine.system import Profiles, RoundPolicy, Setup, SystemModel
from fl_lightning.errors import ConfigError
from fl_lightning.functional.system import client_seconds, transfer_seconds

MODEL_BYTES = 1_000_000  # 8 Mbit each way


class Fixed(SystemModel):
    """Devices given by the test (``**policy``: the round policy :func:`bound` gives it)."""

    def __init__(self, speeds, availability=None, dropout=None, phase=(), day_s=100.0, online=1.0, **policy):
        super().__init__()
        self.given = RoundPolicy(**policy)
        self.speeds = list(speeds)
        n = len(self.speeds)
        self.availability = availability or [1.0] * n
        self.dropout_p = dropout or [0.0] * n
        self.phase, self.day_s, self.online_fraction = tuple(phase), day_s, online

    def profiles(self, num_clients, seed):
        n = num_clients
        return Profiles(
            tuple(self.speeds),
            (8.0,) * n,
            (8.0,) * n,
            tuple(self.availability),
            tuple(self.dropout_p),
            self.phase,
            self.day_s,
            self.online_fraction,
        )


def bound(system, steps=(10, 10, 10, 10), batch=10, seed=0):
    n = len(steps)
    system.bind(
        Setup(n, seed, batch, tuple(steps), tuple(steps), 1, None, MODEL_BYTES, MODEL_BYTES), system.given
    )
    return system


def seconds(steps, speed, batch=10):
    return client_seconds(
        steps, batch, speed, transfer_seconds(MODEL_BYTES, 8.0), transfer_seconds(MODEL_BYTES, 8.0)
    )


def test_without_a_deadline_every_client_trains_its_full_work_and_the_slowest_sets_the_round():
    s = bound(Fixed([100.0, 50.0, 25.0, 10.0]))
    plan = s.plan(0, [0, 1, 2, 3], cohort=4)
    assert plan.steps == {0: 10, 1: 10, 2: 10, 3: 10} and plan.trained == [0, 1, 2, 3]
    assert plan.finish_s[3] == pytest.approx(seconds(10, 10.0)) == pytest.approx(12.0)  # 1 + 10 + 1
    assert plan.duration_s == pytest.approx(12.0) and not (plan.late or plan.partial or plan.dropped_out)


def test_a_deadline_drops_the_late_clients_and_the_round_lasts_until_it():
    s = bound(Fixed([100.0, 50.0, 25.0, 10.0], deadline_s=5.0))  # times 3, 4, 6, 12 s
    plan = s.plan(0, [0, 1, 2, 3], cohort=4)
    assert plan.steps == {0: 10, 1: 10} and plan.late == [2, 3] and plan.duration_s == 5.0


def test_partial_work_cuts_the_late_clients_steps_to_what_fits():
    s = bound(Fixed([100.0, 50.0, 25.0, 10.0, 4.0], deadline_s=5.0, policy="partial"), steps=(10,) * 5)
    plan = s.plan(0, [0, 1, 2, 3, 4], cohort=5)
    # client 2: 3 s of computation at 25 samples/s = 7.5 batches of 10 -> 7 steps; client 3: 30 samples -> 3
    # steps; client 4: 12 samples -> 1 step
    assert plan.steps == {0: 10, 1: 10, 2: 7, 3: 3, 4: 1} and plan.partial == [2, 3, 4] and not plan.late
    assert all(t <= 5.0 for t in plan.finish_s.values())
    assert plan.duration_s == pytest.approx(max(plan.finish_s.values()))
    tight = bound(Fixed([100.0, 2.0], deadline_s=3.5, policy="partial"), steps=(10, 10))
    plan = tight.plan(0, [0, 1], cohort=2)  # client 1: 1.5 s computes 3 samples: no step of 10 fits
    assert plan.steps == {0: 10} and plan.late == [1] and plan.duration_s == 3.5


def test_over_selection_keeps_the_first_k_to_finish():
    s = bound(Fixed([100.0, 10.0, 50.0, 25.0], over_selection=0.5))
    assert s.sample_count(2, online=4) == 3 and s.sample_count(3, online=4) == 4 and s.sample_count(3, 2) == 2
    plan = s.plan(0, [0, 1, 2, 3], cohort=2)
    assert plan.trained == [0, 2] and plan.discarded == [1, 3]
    assert plan.duration_s == pytest.approx(seconds(10, 50.0))  # the 2nd arrival closes the round


def test_a_dropout_fails_without_training_and_does_not_hold_the_round():
    s = bound(Fixed([100.0, 10.0, 50.0], dropout=[0.0, 1.0, 0.0]), steps=(10, 10, 10))
    plan = s.plan(3, [0, 1, 2], cohort=3)
    assert plan.dropped_out == [1] and plan.trained == [0, 2]
    assert plan.duration_s == pytest.approx(seconds(10, 50.0))
    over = bound(Fixed([100.0, 10.0, 50.0, 20.0], dropout=[0.0, 1.0, 0.0, 0.0], over_selection=0.5))
    plan = over.plan(0, [0, 1, 2, 3], cohort=3)  # over-selection makes up for the dropout
    assert plan.trained == [0, 2, 3] and plan.dropped_out == [1]


def test_availability_is_drawn_per_round_and_the_day_night_cycle_follows_the_clock():
    s = bound(Fixed([1.0] * 4, availability=[1.0, 0.0, 0.5, 0.5]))
    rounds = [s.online(r, 0.0) for r in range(400)]
    assert all(0 in o and 1 not in o for o in rounds)
    share = sum(2 in o for o in rounds) / 400
    assert 0.4 < share < 0.6 and rounds == [s.online(r, 0.0) for r in range(400)]  # seeded by (seed, round)
    c = bound(Fixed([1.0] * 4, phase=(0.0, 0.25, 0.5, 0.75), day_s=100.0, online=0.25))
    assert c.online(0, 0.0) == [0] and c.online(0, 30.0) == [3] and c.online(0, 80.0) == [1]
    assert c.next_online_s(10.0) == 10.0
    nobody = bound(Fixed([1.0] * 2, phase=(0.0, 0.0), day_s=100.0, online=0.25), steps=(10, 10))
    t = nobody.next_online_s(30.0)
    assert t == pytest.approx(100.0) and nobody.online(0, t) == [0, 1]


def test_a_deadline_no_client_can_meet_is_one_line_naming_the_fix():
    with pytest.raises(ConfigError) as info:
        bound(Fixed([100.0, 50.0], deadline_s=2.5), steps=(10, 10))
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(
        "model.round_policy.deadline_s=2.5 is shorter than every client's round"
    )
    assert "client 0, needs 3 s" in msg and "model.round_policy.policy=partial" in msg
    bound(Fixed([100.0, 50.0], deadline_s=2.5, policy="partial"), steps=(10, 10))  # one step fits: fine
    with pytest.raises(ConfigError, match=r"^model\.round_policy\.deadline_s=2 .*one local step"):
        bound(Fixed([100.0, 50.0], deadline_s=2.0, policy="partial"), steps=(10, 10))


def test_the_round_policy_is_given_with_the_run_and_is_the_default_before():
    s = Fixed([100.0, 50.0])
    assert s.round_policy == RoundPolicy()
    policy = RoundPolicy(deadline_s=5.0, policy="partial")
    s.bind(Setup(2, 0, 10, (10, 10), (10, 10), 1, None, MODEL_BYTES, MODEL_BYTES), policy)
    assert s.round_policy is policy
    s.bind(Setup(2, 0, 10, (10, 10), (10, 10), 1, None, MODEL_BYTES, MODEL_BYTES))
    assert s.round_policy == RoundPolicy()
    assert isinstance(s, SystemModel)
