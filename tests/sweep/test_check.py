"""``--check``: the rows run again and compared with a stored table."""

from __future__ import annotations

import csv
import shutil
import tempfile

import pytest
from sweep_helpers import (
    write_csv,
    write_sweep,
)

from fl_lightning.sweep import (
    main,
    run_sweep,
)

pytest_plugins = ["sweep_helpers"]  # its fixtures (a plugin: not autouse, it would apply to every test)
pytestmark = pytest.mark.usefixtures("in_tmp_with_fake_resolver")  # each test in its own folder


def test_check_reruns_the_rows_and_compares_them_with_the_stored_table(
    tmp_path, fake_fit, capsys, monkeypatch
):
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # --check's fresh folders
    content = {
        "base": "base.yaml",
        "seeds": [0, 1],
        "rows": [{"name": "a"}, {"name": "b", "args": ["--model.acc=0.7"]}],
    }
    path = write_sweep(tmp_path, content)
    assert run_sweep([str(path)]) == 0
    shutil.copy(tmp_path / "lightning_logs" / "sweeps" / "s" / "results.csv", tmp_path / "s.csv")
    capsys.readouterr()
    assert run_sweep([str(path), "--check"]) == 0
    out = capsys.readouterr().out
    assert "match    a" in out and "match    b" in out and "2 of 2 rows match" in out
    assert out.count(" start   ") == 4  # re-run, not reused

    with open(tmp_path / "s.csv", newline="") as f:
        stored = list(csv.DictReader(f))
    stored[1]["final_mean"] = str(float(stored[1]["final_mean"]) + 0.3)  # a table gone stale
    write_csv(tmp_path / "s.csv", stored)
    assert run_sweep([str(path), "--check"]) == 1
    out = capsys.readouterr().out
    assert "match    a" in out and "MISMATCH b: final mean 70.50 (stored 70.80)" in out
    assert "run on" not in out  # the same machine: no excuse

    for row in stored:  # the stored table came from another CPU's kernels
        row["machine"] = "torch 9.9, cpu (AVX512 kernels), 1 thread"
    write_csv(tmp_path / "s.csv", stored)
    assert run_sweep([str(path), "--check"]) == 1
    out = capsys.readouterr().out
    assert "match    a\n" in out  # equal numbers match whatever the machine
    assert (
        "MISMATCH b: final mean 70.50 (stored 70.80); stored on torch 9.9, cpu (AVX512 kernels), 1 thread, "
        "run on torch 9.9, cpu (AVX2 kernels), 1 thread: float results differ across machines"
    ) in out

    path = write_sweep(tmp_path, {**content, "check": {"tolerance": 0.5}})
    assert run_sweep([str(path), "--check", "--rows", "b"]) == 0
    out = capsys.readouterr().out
    assert "match    b" in out and "1 of 1 rows match" in out


def test_check_matches_a_row_whose_stored_runs_failed_only_if_they_fail_again(
    tmp_path, fake_fit, capsys, monkeypatch
):
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    rows = [{"name": "a"}, {"name": "diverges", "args": ["--model.fail=nan"]}]
    path = write_sweep(tmp_path, {"base": "base.yaml", "seeds": [0, 1], "rows": rows})
    assert run_sweep([str(path)]) == 1  # a failed row
    shutil.copy(tmp_path / "lightning_logs" / "sweeps" / "s" / "results.csv", tmp_path / "s.csv")
    capsys.readouterr()
    assert run_sweep([str(path), "--check"]) == 0  # it fails again: the table is reproduced
    out = capsys.readouterr().out
    assert "match    a\n" in out and "match    diverges\n" in out and "2 of 2 rows match" in out

    path = write_sweep(tmp_path, {"base": "base.yaml", "seeds": [0, 1], "rows": [{"name": "diverges"}]})
    assert run_sweep([str(path), "--check"]) == 1  # now it trains: not the stored result
    out = capsys.readouterr().out
    assert "MISMATCH diverges: runs 2 (stored 0, 2 failed)" in out


def test_check_without_a_stored_table_is_one_line(tmp_path, capsys):
    path = write_sweep(tmp_path, {"base": "base.yaml", "rows": [{"name": "a"}]})
    with pytest.raises(SystemExit) as exit_info:
        main([str(path), "--check"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no stored table" in err and "s.csv" in err
