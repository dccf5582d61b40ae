"""``python -m fl_lightning report`` on crafted run folders: files, page, values, and bad input."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

from fl_lightning.report import discover, report
from fl_lightning.report.figures import band_by_round, band_by_time


def _csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def craft(
    folder: Path,
    acc: list[float],
    metric: str = "acc",
    clock: bool = False,
    version: int = 0,
    label: str = "fedavg-iid",
) -> Path:
    """A finished run as ``fit`` leaves it, in ``folder/lightning_logs/version_<version>-<label>``."""
    run = folder / "lightning_logs" / f"version_{version}-{label}"
    run.mkdir(parents=True)
    summary = {"rounds": len(acc), "metric": metric, f"final_global_{metric}": acc[-1], "bytes_total": 100}
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "config.yaml").write_text("model:\n  strategy: FedAvg\n")
    rows = [
        {
            "round": i + 1,
            "sim_time_s": (1.5 * (i + 1) if clock else ""),
            "bytes_total": 10 * (i + 1),
            f"global/{metric}": a,
        }
        for i, a in enumerate(acc)
    ]
    _csv(run / "curves.csv", rows)
    clients = [
        {"client": c, "samples": 10 + c, "unseen": int(c == 3), f"global_{metric}": 0.1 * c} for c in range(4)
    ]
    _csv(run / "clients.csv", clients)
    return run


def test_a_sweep_gives_figures_a_page_and_one_line_for_a_failed_run(tmp_path):
    out = tmp_path / "sweep"
    craft(out / "fedavg" / "seed0", [0.2, 0.4])
    craft(out / "fedavg" / "seed1", [0.3, 0.6])
    craft(out / "fedbuff" / "seed0", [0.5, 0.7], clock=True)
    failed = out / "fedbuff" / "seed1"
    failed.mkdir(parents=True)
    (failed / "sweep.json").write_text(json.dumps({"returncode": 1, "error": "error: boom"}))
    (out / "results.md").write_text("# methods_x_clocks\n\n| row | seeds |\n")  # the sweep's name:
    problems = report(out, tmp_path / "rep", target=0.5)
    assert any("fedbuff seed 1: failed (error: boom)" in p for p in problems)
    assert any("left out of the simulated-time figure: fedavg" in p for p in problems)
    files = {p.name for p in (tmp_path / "rep").iterdir()}
    for name in ("curve_rounds", "curve_sim", "clients_final", "to_target"):
        assert {f"{name}.png", f"{name}.svg"} <= files, name
    page = (tmp_path / "rep" / "index.html").read_text()
    assert page.count("data:image/png;base64,") == 4 and "fedbuff" in page and "strategy: FedAvg" in page
    assert "<title>fl_lightning report: methods_x_clocks</title>" in page  # the sweep's name, not "sweep"
    assert "<h1>fl_lightning report: methods_x_clocks</h1>" in page
    col = discover(out)
    rounds, mean, std = band_by_round(col.rows["fedavg"], "global/acc")  # the curve's values: the cells'
    assert (
        rounds == [1, 2]
        and mean == pytest.approx([0.25, 0.5])
        and std == pytest.approx([0.1 / 2**0.5, 0.2 / 2**0.5])
    )
    assert band_by_time(col.rows["fedbuff"], "global/acc")[:2] == ([1.5, 3.0], [0.5, 0.7])


def test_a_run_folder_draws_its_curves_and_its_scatter(tmp_path):
    run = craft(tmp_path / "r", [0.2, 0.4])
    assert report(run, tmp_path / "rep") == []
    assert {"curve_rounds.png", "clients_scatter.svg", "index.html"} <= {
        p.name for p in (tmp_path / "rep").iterdir()
    }
    assert (
        "<h1>fl_lightning report: version_0-fedavg-iid</h1>" in (tmp_path / "rep" / "index.html").read_text()
    )


def test_a_fit_root_reports_its_newest_labelled_run_under_the_runs_name(tmp_path):
    craft(tmp_path / "r", [0.2, 0.4], version=2, label="fedavg-iid")
    craft(tmp_path / "r", [0.5, 0.7], version=10, label="fedbuff-dirichlet-devices")  # newest: 10 > 2
    craft(tmp_path / "r", [0.1, 0.2], version=9)
    col = discover(tmp_path / "r")
    assert list(col.rows) == ["version_10-fedbuff-dirichlet-devices"] and col.title == next(iter(col.rows))
    report(tmp_path / "r", tmp_path / "rep")
    page = (tmp_path / "rep" / "index.html").read_text()
    assert "<title>fl_lightning report: version_10-fedbuff-dirichlet-devices</title>" in page


def test_different_metrics_and_sim_time_without_a_clock_are_one_line_each(tmp_path):
    out = tmp_path / "sweep"
    craft(out / "a" / "seed0", [0.2, 0.4])
    craft(out / "b" / "seed0", [0.2, 0.4])
    craft(out / "c" / "seed0", [0.1, 0.3], metric="o_f1")
    problems = report(out, tmp_path / "rep", clock="sim")
    assert len(problems) == 2
    assert "different metrics" in problems[0] and "rows c are left out" in problems[0]
    assert "no run has a clock" in problems[1]
    assert (tmp_path / "rep" / "curve_rounds.png").is_file()  # drawn against rounds instead


def test_a_folder_without_runs_is_one_error_line(tmp_path, capsys, monkeypatch):
    """``python -m fl_lightning report <folder>`` as the program reads it (``sys.argv``), in-process: a new
    Python cost 12 s of CPU here for one line (``tests/test_cli.py`` starts the real program)."""
    from fl_lightning.__main__ import main as program

    monkeypatch.setattr(sys, "argv", ["python -m fl_lightning", "report", str(tmp_path)])
    with pytest.raises(SystemExit) as exit_info:
        program()
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [err.strip()] and "no finished run under" in err


def test_a_loss_curve_is_drawn_as_it_is_and_rows_filter_and_facet(tmp_path, monkeypatch):
    """--curve draws any curves.csv column (a loss unscaled, an accuracy in %), --rows keeps the matching
    rows only, --facet puts each first row segment in its own panel; a missing column is one line."""
    from fl_lightning.report import figures

    out = tmp_path / "sweep"
    for panel in ("s0", "s90"):
        for method, acc in (("fedavg", [0.2, 0.4]), ("fedprox", [0.3, 0.5])):
            run = craft(out / panel / method / "seed0", acc)
            rows = [
                {"round": i + 1, "global/acc": a, "global_train/loss": 2.0 - a} for i, a in enumerate(acc)
            ]
            _csv(run / "curves.csv", rows)
    drawn: list[tuple] = []
    real = figures.curves_figure

    def spy(rows, tag, clock, out_dir, name, title, facet=False):
        drawn.append((sorted(rows), tag, name, facet, figures.panels_of(rows, facet)))
        return real(rows, tag, clock, out_dir, name, title, facet)

    monkeypatch.setattr(figures, "curves_figure", spy)
    problems = report(
        out, tmp_path / "rep", curves=["global_train/loss", "nope/x"], rows=["s*/fed*"], facet=True
    )
    assert problems == ["--curve nope/x: no run's curves.csv has this column; not drawn"]
    loss = next(d for d in drawn if d[1] == "global_train/loss")
    assert loss[2] == "curve_global_train_loss_rounds" and loss[3] is True
    assert {p: sorted(lines) for p, lines in loss[4].items()} == {
        "s0": ["fedavg", "fedprox"],
        "s90": ["fedavg", "fedprox"],
    }
    assert (tmp_path / "rep" / "curve_global_train_loss_rounds.svg").is_file()
    assert figures.in_percent("global/acc") and not figures.in_percent("global_train/loss")
    drawn.clear()
    (out / "results.csv").write_text("row,final_mean\ns0/fedavg,1\ns90/fedavg,2\n")
    report(out, tmp_path / "rep2", rows=["s90/*"])
    page = (tmp_path / "rep2" / "index.html").read_text()
    assert (
        "<td>s90/fedavg</td>" in page and "<td>s0/fedavg</td>" not in page
    )  # the sweep's table filtered too
    assert drawn[0][0] == ["s90/fedavg", "s90/fedprox"] and drawn[0][3] is False
    with pytest.raises(FileNotFoundError, match="no row of .* matches --rows t300"):
        report(out, tmp_path / "rep3", rows=["t300/*"])
