"""The columns: what each reads of a finished run (its summary.json, its TensorBoard scalars)."""

from __future__ import annotations

import pytest
from sweep_helpers import craft_run, summary

from fl_lightning.sweep import COLUMNS, RunData

pytest_plugins = ["sweep_helpers"]  # its fixtures (a plugin: not autouse, it would apply to every test)
pytestmark = pytest.mark.usefixtures("in_tmp_with_fake_resolver")  # each test in its own folder


def test_the_target_is_reached_at_the_first_round_at_or_above_it(tmp_path):
    run = craft_run(tmp_path / "seed0", summary(0.8, 0.8), acc_curve=[0.5, 0.75, 0.8])
    reached = RunData(run, summary(0.8, 0.8), (None, 0.75)).target_reached()
    assert reached == (2, 2 * (2**20 + 2**19))  # round 2 equals the target: reached; bytes until then
    assert RunData(run, summary(0.8, 0.8), (None, 0.81)).target_reached() is None
    assert RunData(run, summary(0.8, 0.8), ("round/bytes_up", 2**19)).target_reached()[0] == 1  # any tag


@pytest.mark.parametrize(
    ("key", "value"),
    [("final", 90.0), ("best", 95.0), ("client", 85.0), ("rounds", 3.0), ("mib", 4.0), ("wall_s", 12.5)],
)
def test_summary_columns_read_their_summary_key_in_the_printed_unit(tmp_path, key, value):
    s = summary(0.9, 0.95, 0.85, wall=10.0) | {"run_wall_time_s": 12.5}
    assert COLUMNS[key].read(RunData(tmp_path, s, None)) == pytest.approx(value)


def test_the_wall_column_of_a_summary_written_before_run_wall_time_is_its_last_start(tmp_path):
    assert COLUMNS["wall_s"].read(RunData(tmp_path, summary(0.9, 0.9, wall=7.0), None)) == 7.0


def test_the_simulated_time_columns(tmp_path):
    """``sim_s`` reads summary.json's ``sim_time_s``; ``sim_s_to_target`` reads ``sim/time_s`` at the first
    round whose global accuracy reached the target."""
    from torch.utils.tensorboard import SummaryWriter

    run = craft_run(tmp_path / "seed0", summary(0.8, 0.8) | {"sim_time_s": 42.5}, acc_curve=[0.5, 0.75, 0.8])
    writer = SummaryWriter(str(run))
    for step, clock in enumerate([10.0, 25.0, 42.5], 1):
        writer.add_scalar("sim/time_s", clock, step)
    writer.close()
    data = RunData(run, summary(0.8, 0.8) | {"sim_time_s": 42.5}, (None, 0.75))
    assert COLUMNS["sim_s"].read(data) == 42.5 and data.target_step() == 2
    assert COLUMNS["sim_s_to_target"].read(data) == 25.0
    assert COLUMNS["sim_s_to_target"].read(RunData(run, summary(0.8, 0.8), (None, 0.9))) is None
    assert COLUMNS["sim_s"].read(RunData(run, summary(0.8, 0.8), None)) is None  # no simulated clock
    assert COLUMNS["sim_s"].checked and COLUMNS["sim_s_to_target"].checked  # deterministic: --check compares
