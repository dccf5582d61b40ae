"""The sweep file: its schema, bad files in one line, the recipes' sweep files and stored tables."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from sweep_helpers import (
    REAL_RESOLVER,
    ROOT,
    read_csv,
    write_sweep,
)

from fl_lightning.errors import ConfigError
from fl_lightning.sweep import (
    expect,
    load_sweep,
    main,
    runner,
    runs_of,
)

pytest_plugins = ["sweep_helpers"]  # its fixtures (a plugin: not autouse, it would apply to every test)
pytestmark = pytest.mark.usefixtures("in_tmp_with_fake_resolver")  # each test in its own folder


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            {"base": "base.yaml", "rows": [{"name": "a"}], "sede": [1]},
            "unknown key 'sede'; did you mean 'seeds'?",
        ),
        ({"base": "missing.yaml", "rows": [{"name": "a"}]}, "base: config file missing.yaml not found"),
        ({"rows": [{"name": "a", "config": "nope.yaml"}]}, "rows[0]: config file nope.yaml not found"),
        ({"base": "base.yaml"}, "give either grid: (named axes) or rows: (a list)"),
        ({"base": "base.yaml", "rows": [{"name": "a"}], "grid": {"m": {"x": {}}}}, "give either grid:"),
        ({"base": "base.yaml", "grid": {"m": {"x": {"conf": "a"}}}}, "grid.m.x: unknown key 'conf'; did you"),
        ({"base": "base.yaml", "grid": {"m": {"x y": {}}}}, "grid.m: 'x y' is not a folder-safe name"),
        (
            {"base": "base.yaml", "grid": {"m": {"x": {}}}, "paper": {"z": 1}},
            "paper.z: no such row in the grid",
        ),
        ({"base": "base.yaml", "grid": [{"m": {"x": {}}}, {"n": {"x": {}}}]}, "grid[1]: axes n differ"),
        ({"base": "base.yaml", "rows": [{"name": "a"}, {"name": "a"}]}, "row 'a' appears twice"),
        ({"base": "base.yaml", "rows": [{"name": "a", "args": ["--seed_everything=1"]}]}, "set by the sweep"),
        (
            {"base": "base.yaml", "args": "--x=1", "rows": [{"name": "a"}]},
            "args must be a list of fit arguments",
        ),
        ({"base": "base.yaml", "seeds": [0, 0], "rows": [{"name": "a"}]}, "seeds=[0, 0] repeats a seed"),
        ({"base": "base.yaml", "seeds": [-1], "rows": [{"name": "a"}]}, "must be a list of integers >= 0"),
        ({"base": "base.yaml", "columns": ["fnal"], "rows": [{"name": "a"}]}, "did you mean 'final'?"),
        (
            {"base": "base.yaml", "columns": ["final", "final"], "rows": [{"name": "a"}]},
            "a column is listed twice",
        ),
        ({"base": "base.yaml", "columns": ["rounds_to_target"], "rows": [{"name": "a"}]}, "needs a target:"),
        ({"base": "base.yaml", "target": "high", "rows": [{"name": "a"}]}, "target='high' must be a number"),
        ({"base": "base.yaml", "jobs": 0, "rows": [{"name": "a"}]}, "jobs=0 must be an integer >= 1"),
        ({"base": "base.yaml", "check": {"tol": 1}, "rows": [{"name": "a"}]}, "check: unknown key 'tol'"),
        ({"base": "base.yaml", "root": "nowhere", "rows": [{"name": "a"}]}, "is not a folder"),
    ],
)
def test_a_bad_sweep_file_is_one_line_naming_the_key(tmp_path, capsys, content, message):
    path = write_sweep(tmp_path, content)
    with pytest.raises(SystemExit) as exit_info:
        main([str(path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: ") and err.count("\n") == 1, err
    assert message in err
    assert not (tmp_path / "lightning_logs").exists()


def test_grid_blocks_paper_values_and_paths_relative_to_root(tmp_path):
    (tmp_path / "configs").mkdir()
    for name in ("c10.yaml", "c100.yaml", "a.yaml", "b.yaml"):
        (tmp_path / "configs" / name).write_text("")
    path = tmp_path / "recipes" / "x" / "s_cpu.yaml"
    path.parent.mkdir(parents=True)
    methods = {"a": {"config": "configs/a.yaml"}, "b": {"config": "configs/b.yaml", "args": ["--model.x=1"]}}
    path.write_text(
        yaml.safe_dump(
            {
                "root": "../..",
                "grid": [
                    {"data": {"c10": {"config": "configs/c10.yaml"}}, "method": methods},
                    {"data": {"c100": {"config": "configs/c100.yaml"}}, "method": {"a": None}},
                ],
                "paper": {"c10": {"a": 1.5, "b": {"final": 2, "best": 3}}},
            }
        )
    )
    sweep = load_sweep(path)
    assert sweep.root == tmp_path and sweep.name == "s_cpu"
    assert sweep.out == tmp_path / "lightning_logs" / "sweeps" / "s_cpu"
    assert sweep.check_table == path.with_suffix(".csv")
    assert sweep.axes == ("data", "method")
    assert [(r.name, r.configs, r.args, r.paper) for r in sweep.rows] == [
        ("c10/a", ("configs/c10.yaml", "configs/a.yaml"), (), {"": 1.5}),
        ("c10/b", ("configs/c10.yaml", "configs/b.yaml"), ("--model.x=1",), {"final": 2, "best": 3}),
        ("c100/a", ("configs/c100.yaml",), (), {}),
    ]


RECIPE_SWEEPS = sorted(p for p in (ROOT / "recipes").glob("*/*.yaml") if p.parent.name != "flower")


@pytest.mark.parametrize("path", RECIPE_SWEEPS, ids=[str(p.relative_to(ROOT)) for p in RECIPE_SWEEPS])
def test_every_recipe_sweep_file_loads_and_pins_threads_or_runs_one_at_a_time(path):
    sweep = load_sweep(path)  # config files exist, keys and columns are known
    assert sweep.root == ROOT and sweep.rows
    assert sweep.out == Path.cwd() / "lightning_logs" / "sweeps" / sweep.name  # where the user starts it
    # CPU tables: one thread per run, reproducible (--check) whatever the machine; full size: one at a time
    assert sweep.threads == 1 or (sweep.jobs == 1 and not path.stem.endswith("_cpu"))


@pytest.mark.slow
@pytest.mark.parametrize("path", RECIPE_SWEEPS, ids=[str(p.relative_to(ROOT)) for p in RECIPE_SWEEPS])
def test_every_recipe_sweep_row_resolves_with_fits_parser(path, monkeypatch):
    """Every run of every recipe sweep parses as fit parses it (nothing is built: no pretrained download)."""
    monkeypatch.setattr(runner, "resolver", REAL_RESOLVER)
    sweep = load_sweep(path)
    runs = expect(sweep, runs_of(sweep), [], build=False)
    assert all(r.expected is not None and r.expected.max_steps >= 1 for r in runs)


STORED_TABLES = sorted(p for p in RECIPE_SWEEPS if p.with_suffix(".csv").is_file())


@pytest.mark.parametrize("path", STORED_TABLES, ids=[str(p.relative_to(ROOT)) for p in STORED_TABLES])
def test_every_stored_recipe_table_fits_its_sweep_file_for_check(path):
    """A recipe's ``<sweep>.csv`` (what ``--check`` compares with): its rows are rows of the sweep file, over
    all of the file's seeds, with every checked column and the machine the runs computed on."""
    sweep = load_sweep(path)
    stored = read_csv(sweep.check_table)
    assert stored and set(stored) <= {r.name for r in sweep.rows}
    checked = sweep.check_columns or [c.key for c in sweep.columns if c.checked]
    for name, row in stored.items():
        runs = int(row["seeds"]) + int(row["failed"])  # a reproducible divergence counts as failed
        assert (runs, row["missing"]) == (len(sweep.seeds), "0"), name
        if int(row["seeds"]):  # a row whose every run diverged has no values, only its failures
            # final/best always have values; a summary column may not (no noise: no epsilon)
            assert all(row.get(f"{key}_mean") for key in checked if key in ("final", "best")), name
            assert all(f"{key}_mean" in row for key in checked), name
        assert row["machine"].startswith("torch "), name


def test_the_readme_example_sweep_file_loads(tmp_path):
    text = (ROOT / "README.md").read_text()
    block = text[text.index("```yaml\nname: methods_x_splits") + len("```yaml\n") :]
    content = yaml.safe_load(block[: block.index("```")])
    (tmp_path / "configs").mkdir()
    shutil.copy(ROOT / "configs" / "fedavg_digits.yaml", tmp_path / "configs")
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(content))
    sweep = load_sweep(tmp_path / "s.yaml")
    assert [r.name for r in sweep.rows] == [
        "fedavg/dir0.1",
        "fedavg/path2",
        "fedprox/dir0.1",
        "fedprox/path2",
    ]
    assert sweep.rows[0].paper == {"": 76.0} and sweep.target == (None, 0.9)


def test_load_sweep_errors_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such sweep file"):
        load_sweep(tmp_path / "none.yaml")
