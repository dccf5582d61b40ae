"""The README holds: its commands run, its examples work, its Layout is the tree.

Every command line of the "Setup" and "Quickstart" blocks runs as written (at tiny sizes): the commands
are read from README.md, so a reader copying them in order into a fresh checkout gets working commands,
with the run folders (``version_0-fedavg-dirichlet``, ``version_1-fedavg-dirichlet``, ...) they name. The
"From Python" example runs as written, in an empty folder, its resume by ``load_from_checkpoint``
continuing the same run folder. The "Writing a strategy" example runs.
The "Layout" block names every module of the package and every top-level folder, and nothing else.
"""

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from fl_lightning.__main__ import main
from fl_lightning.runs import read_summary
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
    assert (runs / "version_0-fedavg-dirichlet" / "summary.json").exists()  # the Setup's run
    recipe = runs / "version_1-fedavg-dirichlet"  # the Quickstart's recipe run, evaluated and resumed
    assert sorted(p.name for p in runs.glob("version_*")) == [
        "version_0-fedavg-dirichlet",
        recipe.name,
        "version_2-fedprox-dirichlet",
        "version_3-my-run",
    ]
    assert "val_fraction: 0.1" in (recipe / "config.yaml").read_text()
    assert {"validate", "test", "predict"} <= {p.name for p in recipe.iterdir()}
    rows = (recipe / "predict" / "predictions.csv").read_text().splitlines()
    assert rows[0].startswith("index,prediction,score_0,") and len(rows) == 1 + 360


#: A name in the Layout block: a module (``cli.py``) or a folder (``api/``).
LAYOUT_NAME = re.compile(r"^\.?[\w]+(\.py|/)$")


def layout_paths(text: str | None = None) -> set[str]:
    """The paths the README's Layout block names, rebuilt from its indentation.

    A line is ``<indent><names>  <description>``: names separated by single spaces, the description after
    two or more. A folder (``api/``) opens a level for the deeper-indented lines below it, and names its
    ``__init__.py``; a line whose first word is not a name continues the description above it.
    """
    text = README.read_text() if text is None else text
    body = text.split("\n## Layout", 1)[1].split("```", 2)[1]
    paths: set[str] = set()
    stack: list[tuple[int, str]] = []  # (indent, folder path with a trailing "/")
    for line in body.splitlines()[1:]:
        indent = len(line) - len(line.lstrip(" "))
        names = re.split(r" {2,}", line.strip(), maxsplit=1)[0].split(" ")
        if not names[0] or not all(LAYOUT_NAME.match(n) for n in names):
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1] if stack else ""
        for name in names:
            paths.add(parent + name)
            if name.endswith("/"):
                stack.append((indent, parent + name))
    return paths


def package_paths(paths: set[str]) -> set[str]:
    """The ``fl_lightning`` modules ``paths`` names: its files, and each folder's ``__init__.py``."""
    inside = {p for p in paths if p.startswith("fl_lightning/")}
    return {p + "__init__.py" if p.endswith("/") else p for p in inside}


def test_the_layout_names_every_module_of_the_package_and_nothing_else():
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "fl_lightning").rglob("*.py")}
    named = package_paths(layout_paths())
    assert sorted(modules - named) == [], "modules missing from the README's Layout block"
    assert sorted(named - modules) == [], "names in the README's Layout block that do not exist"


def test_the_layout_names_the_repository_top_level_folders():
    named = {p for p in layout_paths() if p.count("/") == 1 and p.endswith("/")}
    assert sorted(p for p in named if not (ROOT / p).is_dir()) == []
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout: the tracked folders are unknown")
    folders = {f.split("/", 1)[0] + "/" for f in tracked.stdout.splitlines() if "/" in f}
    assert folders == named


def test_the_layout_parser_follows_indentation():
    block = "\n## Layout\n\n```\npkg/    the package\n  a.py b.py  two\n  sub/  a folder\n    c.py\n"
    block += "        continued description\n  d.py\ntop/\n```\n"
    assert layout_paths(block) == {
        "pkg/",
        "pkg/a.py",
        "pkg/b.py",
        "pkg/sub/",
        "pkg/sub/c.py",
        "pkg/d.py",
        "top/",
    }


def readme_python(section: str) -> str:
    """The first ```python block of ``## <section>``."""
    body = README.read_text().split(f"\n## {section}", 1)[1]
    return body.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_example_strategy_runs_against_the_api(monkeypatch):
    import torch
    from torch import nn

    import fl_lightning.api.strategy as strategy_module
    from fl_lightning.api import ClientContext, RunSpec, Strategy, Task
    from fl_lightning.errors import ConfigError

    monkeypatch.setattr(strategy_module, "STRATEGIES", {})  # the example registers into a scratch registry
    namespace: dict = {}
    exec(compile(readme_python("Writing a strategy"), "README.md", "exec"), namespace)
    (cls,) = strategy_module.STRATEGIES.values()
    assert issubclass(cls, Strategy)
    net = nn.Linear(3, 2)
    weights = {n: p.detach() + 1.0 for n, p in net.named_parameters()}  # every entry 1 away: 1/2 * 8
    prox = cls(mu=0.5)
    ctx = ClientContext(0, 0, {"weights": weights}, {}, num_samples=10, num_steps=1, lr=0.1)
    assert torch.isclose(prox.local_loss(net, ctx, None, None), torch.tensor(0.5 * 4.0))
    spec = RunSpec(task=Task("multiclass"), num_classes=2, num_clients=4, input_shape=(3,))
    cls().check(net, spec)
    with pytest.raises(ConfigError):
        cls().check(net, RunSpec(task=Task("multilabel"), num_classes=2, num_clients=4, input_shape=(3,)))


def _checkout_status() -> str | None:
    """``git status --porcelain`` of the checkout (None outside a git checkout)."""
    status = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True)
    return status.stdout if status.returncode == 0 else None


def test_the_from_python_example_runs_as_written_in_an_empty_folder(tmp_path, monkeypatch, capsys):
    code = readme_python("From Python")
    assert "federated_trainer(" in code and "ckpt_path=" in code and "read_summary(" in code
    assert "load_from_checkpoint(" in code and "console" not in code  # no hand-written build(), no console()
    assert "runtime=Runtime(" in code  # the runtime's knobs as one object (model.runtime)
    before = _checkout_status()
    monkeypatch.chdir(tmp_path)  # the folder a reader runs it in: nothing else is there
    exec(compile(code, "README.md", "exec"), {"__name__": "__main__"})
    out = capsys.readouterr().out.splitlines()
    runs = tmp_path / "lightning_logs"
    run = runs / "version_0-fedprox-dirichlet"  # labelled by the module's strategy and the data's split
    assert sorted(p.name for p in runs.iterdir()) == [run.name]  # the resume continued its folder
    summary = read_summary(run)
    assert (summary["rounds"], summary["rounds_this_run"]) == (10, 5)
    printed = [line for line in out if not line.startswith((" ", "round ", "fl_lightning summary"))]
    assert re.fullmatch(r"final 0\.\d{3}, best 0\.\d{3}", printed[0])
    best = re.fullmatch(r"best round (\d+): (.*round=\1\.ckpt)", printed[1])
    assert best and Path(best.group(2)).parent == run / "checkpoints"
    assert printed[2:] == ["rounds 10"]
    assert out.count("fl_lightning summary") == 2  # each run's summary, printed without console()
    assert (run / "checkpoints" / "last.ckpt").exists()
    assert _checkout_status() == before  # nothing written into the checkout
