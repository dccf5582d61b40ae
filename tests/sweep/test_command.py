"""``python -m fl_lightning sweep``: its options, bad options in one line, what the package imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import fl_lightning.sweep as sweep_module
from fl_lightning.sweep import (
    main,
)

pytest_plugins = ["sweep_helpers"]  # its fixtures (a plugin: not autouse, it would apply to every test)
pytestmark = pytest.mark.usefixtures("in_tmp_with_fake_resolver")  # each test in its own folder


@pytest.mark.parametrize(
    ("text", "args", "message"),
    [
        ("rows: [\n", [], "YAML syntax error at line 2"),
        ("- a\n", [], "a sweep file is a mapping"),
        (None, [], "no such sweep file"),
        ("base: base.yaml\nrows: [{name: a}]\n", ["--rows", "b*"], "--rows b*: matches no row (rows: a)"),
        ("base: base.yaml\nrows: [{name: a}]\n", ["--jobs", "0"], "--jobs=0 must be >= 1"),
        (
            "base: base.yaml\nrows: [{name: a}]\n",
            ["--jobs", "two"],
            "sweep: argument --jobs: invalid int value",
        ),
        ("base: base.yaml\nrows: [{name: a}]\n", ["--", "--ckpt_path=x"], "--ckpt_path is set by the sweep"),
    ],
)
def test_unreadable_files_and_bad_options_are_one_line(tmp_path, capsys, text, args, message):
    (tmp_path / "base.yaml").write_text("")
    path = tmp_path / "s.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(SystemExit) as exit_info:
        main([str(path), *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err


def test_no_sweep_file_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        "error: sweep: the following arguments are required: sweep (python -m fl_lightning sweep --help)\n"
    )


def test_the_sweep_package_launches_the_cli_and_imports_nothing_of_the_engine():
    imported: set[str] = set()
    for path in Path(sweep_module.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        imported |= {
            node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
        } | {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
    outside = {m for m in imported if m.startswith("fl_lightning") and not m.startswith("fl_lightning.sweep")}
    assert outside == {
        "fl_lightning.config",  # fit's parser: what a run's arguments resolve to
        "fl_lightning.config.legacy",  # a config.yaml written with the former dataset spellings
        "fl_lightning.errors",
        "fl_lightning.lightning.checkpoint",  # the rounds a last.ckpt holds
        "fl_lightning.runs",
    }
