"""The table: mean ± std per column over seeds, its columns, what it reads of a finished run."""

from __future__ import annotations

import json

import pytest
from sweep_helpers import (  # noqa: F401 (fixtures: in_tmp_with_fake_resolver, fake_fit)
    craft_run,
    fake_fit,
    in_tmp_with_fake_resolver,
    read_csv,
    summary,
    write_sweep,
)

from fl_lightning.sweep import (
    run_sweep,
)

pytest_plugins = ["sweep_helpers"]  # its fixtures (a plugin: not autouse, it would apply to every test)
pytestmark = pytest.mark.usefixtures("in_tmp_with_fake_resolver")  # each test in its own folder


def test_the_table_is_the_mean_and_sample_std_over_seeds_of_each_column(tmp_path, capsys):
    path = write_sweep(
        tmp_path,
        {
            "base": "base.yaml",
            "seeds": [0, 1, 2],
            "target": 0.8,
            "columns": ["final", "best", "client", "rounds_to_target", "mib_to_target", "wall_s", "mib"],
            "rows": [{"name": "a", "paper": 76.0}, {"name": "b", "paper": {"Dir 0.1": "n/a"}}],
        },
    )
    out = tmp_path / "lightning_logs" / "sweeps" / "s"
    craft_run(out / "a" / "seed0", summary(0.90, 0.95, 0.80, 10, "AVX2"), acc_curve=[0.5, 0.85, 0.9])
    craft_run(out / "a" / "seed1", summary(0.92, 0.95, 0.90, 20, "AVX2"), acc_curve=[0.5, 0.7, 0.7, 0.81])
    craft_run(out / "a" / "seed2", summary(0.94, 0.98, 0.85, 30, "AVX512"), acc_curve=[0.5, 0.6, 0.7])
    craft_run(out / "b" / "seed0", summary(0.50, 0.60))
    (out / "b" / "seed1").mkdir(parents=True)  # failed on an earlier start
    (out / "b" / "seed1" / "sweep.json").write_text(json.dumps({"returncode": 2, "error": "error: boom"}))
    assert run_sweep([str(path), "--report"]) == 1  # b has a failed and a missing run

    table = read_csv(out / "results.csv")
    a, b = table["a"], table["b"]
    assert float(a["final_mean"]) == pytest.approx(92.0) and float(a["final_std"]) == pytest.approx(2.0)
    assert float(a["best_mean"]) == pytest.approx(96.0) and float(a["best_std"]) == pytest.approx(3**0.5)
    assert float(a["client_mean"]) == pytest.approx(85.0) and float(a["client_std"]) == pytest.approx(5.0)
    # the target 0.8 is first reached in rounds 2 and 4; seed 2 never reaches it
    assert (a["rounds_to_target_mean"], a["rounds_to_target_n"]) == ("3.0", "2")
    assert float(a["rounds_to_target_std"]) == pytest.approx(2**0.5)
    assert float(a["mib_to_target_mean"]) == pytest.approx((2 * 1.5 + 4 * 1.5) / 2)  # MiB sent until then
    assert float(a["wall_s_mean"]) == pytest.approx(20.0) and float(a["wall_s_std"]) == pytest.approx(10.0)
    assert (a["seeds"], a["failed"], a["missing"], a["paper"]) == ("3", "0", "0", "76.0")
    assert (b["seeds"], b["failed"], b["missing"], b["final_mean"], b["final_std"]) == (
        "1",
        "1",
        "1",
        "50.0",
        "",
    )
    assert b["client_n"] == "0" and b["client_mean"] == ""
    machines = "torch 2.14.1, cpu (AVX2 kernels), 1 thread; torch 2.14.1, cpu (AVX512 kernels), 1 thread"
    assert (a["machine"], b["machine"]) == (machines, "")  # b's run did not record one

    md = (out / "results.md").read_text()
    assert md in capsys.readouterr().out  # printed as written
    head = (
        "| row | seeds | final acc (%) | best-round acc, val or test* (%) | client acc (%) | rounds to 0.8 |"
    )
    assert head in md
    assert (
        "| a | 3 | 92.00 ± 2.00 | 96.00 ± 1.73 | 85.00 ± 5.00 | 3.0 ± 1.4 (2 of 3) | 4.50 ± 2.12 (2 of 3) "
        in md
    )
    assert "| 20.0 ± 10.0 | 4.00 ± 0.00 | 76.00 | - |" in md
    assert "| b | 1 (1 failed, 1 missing) | 50.00 | 60.00 | - | - | - | 10.0 | 4.00 | - | n/a |" in md
    assert "- b seed 1: error: boom" in md
    assert f"over seeds [0, 1, 2]. Computed with {machines}.\n" in md


def test_multilabel_runs_report_o_f1_and_the_client_column_only_when_runs_have_it(tmp_path):
    path = write_sweep(tmp_path, {"base": "base.yaml", "rows": [{"name": "flair"}]})
    out = tmp_path / "lightning_logs" / "sweeps" / "s"
    s = summary(0.0, 0.0)
    del s["final_global_acc"], s["best_global_acc"]
    s.update(metric="o_f1", final_global_o_f1=0.4, best_global_o_f1=0.5)
    craft_run(out / "flair" / "seed0", s)
    assert run_sweep([str(path), "--report"]) == 0
    md = (out / "results.md").read_text()
    assert "| row | seeds | final O-F1 (%) | best-round O-F1, val or test* (%) | wall (s) | MiB |" in md
    assert "| flair | 1 | 40.00 | 50.00 | 10.0 | 4.00 |" in md


def test_custom_columns_read_a_summary_key_or_a_scalar(tmp_path):
    path = write_sweep(
        tmp_path,
        {
            "base": "base.yaml",
            "columns": [
                {"label": "eps", "summary": "privacy/epsilon", "scale": 10, "digits": 3},
                {"label": "C-F1 (%)", "scalar": "global/acc", "scale": 100, "digits": 1},
                "kib_up_per_round",
            ],
            "rows": [{"name": "dp"}],
        },
    )
    out = tmp_path / "lightning_logs" / "sweeps" / "s"
    craft_run(out / "dp" / "seed0", {**summary(0.9, 0.9), "privacy/epsilon": 2.34567}, acc_curve=[0.25, 0.5])
    assert run_sweep([str(path), "--report"]) == 0
    assert "| dp | 1 | 23.457 | 50.0 | 341.3 |" in (out / "results.md").read_text()  # 1 MiB up / 3 rounds


def test_the_table_reads_the_scalars_of_the_finished_run_only(tmp_path):
    path = write_sweep(tmp_path, {"base": "base.yaml", "target": 0.6, "rows": [{"name": "r"}]})
    folder = tmp_path / "lightning_logs" / "sweeps" / "s" / "r" / "seed0"
    # version_0: the run of another config, which reached the target at once; version_1: the sweep's run
    craft_run(folder, summary(0.9, 0.9), acc_curve=[0.7, 0.8, 0.9], model={"lr": 1}, label="r-seed0")
    craft_run(folder, summary(0.7, 0.7), acc_curve=[0.1, 0.65, 0.7], version=1, label="r-seed0")
    assert run_sweep([str(path), "--report"]) == 0
    row = read_csv(folder.parents[1] / "results.csv")["r"]
    assert (row["final_mean"], row["rounds_to_target_mean"]) == ("70.0", "2.0")


def test_the_wall_column_is_the_runs_wall_time_over_all_its_starts(tmp_path):
    path = write_sweep(tmp_path, {"base": "base.yaml", "columns": ["wall_s"], "rows": [{"name": "r"}]})
    out = tmp_path / "lightning_logs" / "sweeps" / "s"
    craft_run(out / "r" / "seed0", summary(0.9, 0.9, wall=5.0) | {"run_wall_time_s": 12.5})
    assert run_sweep([str(path), "--report"]) == 0
    assert read_csv(out / "results.csv")["r"]["wall_s_mean"] == "12.5"
