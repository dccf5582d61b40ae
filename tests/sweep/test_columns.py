"""The columns: what each reads of a finished run (its summary.json, its TensorBoard scalars)."""

from __future__ import annotations

import pytest
from sweep_helpers import craft_run, summary

from fl_lightning.errors import ConfigError
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


def test_clock_columns_read_curves_csv(tmp_path):
    """``acc@sim=..``/``acc@bytes=..``: the last evaluation within the budget; ``sim_to@..``/``bytes_to@..``:
    the clock when global/acc first reached the target."""
    from fl_lightning.sweep.columns import clock_column

    (tmp_path / "curves.csv").write_text(
        "round,sim_time_s,bytes_total,global/acc,personal/acc\n1,10,1000000,0.5,0.6\n2,20,2000000,0.7,\n"
        "3,30,3000000,0.9,0.95\n"
    )
    d = RunData(tmp_path, summary(0.9, 0.9), None)

    def read(spec: str) -> float | None:
        column = clock_column(spec, "columns[0]")
        assert column is not None and column.key == spec
        return column.read(d)

    assert read("acc@sim=25s") == pytest.approx(70.0)
    assert read("acc@sim=0.5min") == pytest.approx(90.0)
    assert read("acc@sim=5s") is None  # nothing evaluated yet
    assert read("acc@bytes=2MB") == pytest.approx(70.0)
    assert read("personal/acc@round=2") == pytest.approx(60.0)  # its last evaluation by round 2
    assert read("sim_to@0.7") == 20.0 and read("round_to@0.95") is None
    assert read("bytes_to@0.9") == pytest.approx(3e6 / 2**20)
    assert clock_column("final", "columns[0]") is None
    with pytest.raises(ConfigError, match="unit 'parsecs'"):
        clock_column("acc@sim=3parsecs", "columns[0]")
    assert RunData(tmp_path / "none", summary(0.9, 0.9), None).curves is None


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("client_p10", 20.0),
        ("client_worst", 10.0),
        ("client_global_bottom10", 5.0),
        ("best_test", 95.0),
        ("last_k_mean", 88.0),
        ("participation_gap", 3.0),
        ("unseen", 70.0),
        ("best_val", None),
    ],
)
def test_the_per_client_and_named_round_columns(tmp_path, key, value):
    s = summary(0.9, 0.95) | {
        "client_acc": {"n": 4, "mean": 0.5, "min": 0.1, "p10": 0.2},
        "client_global_acc": {"n": 4, "mean": 0.4, "min": 0.05, "bottom10": 0.05},
        "best_test_global_acc": 0.95,
        "last_k_mean_global_acc": 0.88,
        "participation_gap": 0.03,
        "unseen_global_acc": 0.7,
    }
    got = COLUMNS[key].read(RunData(tmp_path, s, None))
    assert got == (None if value is None else pytest.approx(value))


def test_the_spread_columns_answer_to_the_metrics_spelling():
    from fl_lightning.sweep.columns import spec_alias

    assert spec_alias("client_acc_p10") == "client_p10"
    assert spec_alias("client_global_o_f1_worst") == "client_global_worst"
    assert spec_alias("client_acc_nonsense") == "client_acc_nonsense"
    assert spec_alias("final") == "final"
