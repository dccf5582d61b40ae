"""Every command line of the README's "Setup" and "Quickstart" blocks runs as written (at tiny sizes).

The commands are read from README.md, so the test follows the README: a reader copying them in order
into a fresh checkout gets working commands, with the run folders (``version_0``, ``version_1``, ...)
they name.
"""

import re
import shlex
from pathlib import Path

import pytest

from fl_lightning.cli import main
from fl_lightning.sweep import load_sweep

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

#: Appended to every training command: tiny federation, no progress bars.
TINY = ["--data.num_clients=4", "--model.local_epochs=1", "--trainer.enable_progress_bar=false"]


def readme_commands(section: str) -> list[str]:
    """The command lines of the code blocks (4-space indented) of ``## <section>``, continuations joined."""
    text = README.read_text()
    start = text.index(f"\n## {section}")
    following = re.search(r"\n#{1,6} ", text[start + 1 :])
    body = text[start : start + 1 + following.start()] if following else text[start:]
    commands, current = [], ""
    for line in body.splitlines():
        if not line.startswith("    "):
            continue
        current += line[4:].rstrip()
        if current.endswith("\\"):
            current = current[:-1].rstrip() + " "
            continue
        commands.append(current)
        current = ""
    return commands


def tiny(args: list[str]) -> list[str]:
    """A ``fit`` command at tiny sizes: 2 rounds, or 3 where it sets its own (to extend a 2-round run); a
    ``sweep`` of its first row and seed 0, one round."""
    if args[0] == "sweep":
        first = load_sweep(args[1]).rows[0].name
        return [*args, "--rows", first, "--seeds", "0", "--", "--trainer.max_steps=1"]
    if args[0] != "fit" or "--help" in args or "--print_config" in args:
        return args
    rounds = [i for i, a in enumerate(args) if a.startswith("--trainer.max_steps")]
    out = list(args)
    for i in rounds:
        if out[i] == "--trainer.max_steps":
            out[i + 1] = "3"
        else:
            out[i] = "--trainer.max_steps=3"
    return [*out, *TINY, *([] if rounds else ["--trainer.max_steps=2"])]


def run(command: str, cwd: Path) -> None:
    """Run one README command line (``a && b`` runs both); ``pip`` and ``pytest`` are not run here."""
    for part in command.split("&&"):
        argv = shlex.split(part, comments=True)
        if not argv or argv[0] == "pip" or argv[:3] == ["python", "-m", "pytest"]:
            continue  # installing is the test environment's job; the suite does not run itself
        if argv[0] == "tensorboard":
            logdir = argv[argv.index("--logdir") + 1]
            assert (cwd / logdir).is_dir(), f"{command}: {logdir} does not exist"
            continue
        assert argv[:3] == ["python", "-m", "fl_lightning"], (
            f"a README command this test does not know: {part}"
        )
        try:
            main(tiny(argv[3:]))
        except SystemExit as exit_info:  # --help, --print_config
            assert exit_info.code in (0, None), f"{command}: exit status {exit_info.code}"


def test_the_readme_blocks_hold_the_commands_this_test_runs():
    setup, quickstart = readme_commands("Setup"), readme_commands("Quickstart")
    assert "pip install -e . && python -m fl_lightning fit" in setup
    assert any(c.startswith("python -m fl_lightning predict --ckpt_path") for c in quickstart)
    assert quickstart[-1] == "tensorboard --logdir lightning_logs"


@pytest.mark.slow
def test_every_setup_and_quickstart_command_runs(tmp_path, monkeypatch):
    for folder in ("configs", "recipes"):  # the README runs from the repository root
        (tmp_path / folder).symlink_to(ROOT / folder)
    monkeypatch.chdir(tmp_path)
    for command in readme_commands("Setup") + readme_commands("Quickstart"):
        run(command, tmp_path)
    runs = tmp_path / "lightning_logs"
    assert (runs / "version_0" / "summary.json").exists()  # the Setup's run
    recipe = runs / "version_1"  # the Quickstart's recipe run, evaluated by validate/test/predict
    assert "val_fraction: 0.1" in (recipe / "config.yaml").read_text()
    assert {"validate", "test", "predict"} <= {p.name for p in recipe.iterdir()}
    rows = (recipe / "predict" / "predictions.csv").read_text().splitlines()
    assert rows[0].startswith("index,prediction,score_0,") and len(rows) == 1 + 360
