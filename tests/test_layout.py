"""The package's import graph: layers a reader can see, enforced.

Every subpackage (or top-level module) of ``fl_lightning`` sits in one layer, and imports only its own
subpackage and lower layers — imports under ``if TYPE_CHECKING:`` and inside functions included:

   10  fl_lightning (the package root: re-exports), __main__ (the subcommands' dispatch), system (the
       system models re-exported)
    9  sweep | report
                    grids of runs over seeds (processes of the command line; its parser reads their
                    arguments) | figures from finished runs' files (neither imports the other)
    8  cli | flower the command line | the Flower adapter: ServerApp/ClientApp over the engine (optional
                    extra); neither imports the other: both build a run through config
    7  config       a run's configuration: the parser, its one-line errors, the run built from it
    6  lightning    the Lightning adapter: FederatedModule (a round is a training step), the round-as-step
                    Trainer, checkpoints, loggers, the console
    5  callbacks    Lightning callbacks with federated hooks
    4  engine | strategies
                    the round written once, its executors, client state | the algorithms
                    (neither imports the other: the engine runs any Strategy, a strategy is a Strategy)
    3  api          what strategies program against: types, buffers, aggregators, collectives, the
                    Strategy base, the Task, TaskMetrics, ClientModule
    2  data | models
                    datasets and partitions | networks (neither imports the other)
    1  functional | pure math on whole parameter groups | the constructor arguments a checkpoint saves
       hparams      (neither imports the other)
    0  errors, runs, ConfigError, RunError, check_number; reading finished run folders; the lazy class
       defaults     defaults that --print_config shows

So there is no cycle between subpackages, and a layer can be read without the ones above it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "fl_lightning"

#: Layer of each subpackage or top-level module ("" is the package root).
LAYERS: dict[str, int] = {
    "errors": 0,
    "runs": 0,
    "defaults": 0,
    "hparams": 1,
    "system": 10,
    "functional": 1,
    "data": 2,
    "models": 2,
    "api": 3,
    "engine": 4,
    "strategies": 4,
    "callbacks": 5,
    "lightning": 6,
    "config": 7,
    "cli": 8,
    "flower": 8,
    "sweep": 9,
    "report": 9,
    "": 10,
    "__main__": 10,
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(source: str, module: str) -> set[str]:
    """The ``fl_lightning`` modules ``source`` imports anywhere (``TYPE_CHECKING`` blocks and functions
    included: a type hint is a dependency a reader follows too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("fl_lightning"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import: resolve against the package of `module`
                base = module.split(".")[: -node.level]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            if name.startswith("fl_lightning"):
                # `from package import module` depends on that module (and on the package's __init__ only
                # when it names something the __init__ defines)
                modules = {f"{name}.{a.name}" for a in node.names if _is_module(f"{name}.{a.name}")}
                found.update(modules or {name})
    return found


def _is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    return {_module_name(p): imports(p.read_text(), _module_name(p)) for p in sorted(root.rglob("*.py"))}


def _subpackage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a higher layer, or of another subpackage of the same layer."""
    out = []
    for module, targets in graph.items():
        a = _subpackage(module)
        for target in sorted(targets):
            b = _subpackage(target)
            if a == b:
                continue
            if a not in LAYERS or b not in LAYERS:
                out.append(f"{module} imports {target}: add its subpackage to LAYERS")
            elif LAYERS[b] >= LAYERS[a]:
                out.append(f"{module} (layer {LAYERS[a]}) imports {target} (layer {LAYERS[b]})")
    return out


def test_the_package_imports_only_downwards():
    graph = import_graph()
    assert "fl_lightning.engine.round" in graph and "fl_lightning.api.strategy" in graph
    assert violations(graph) == []


#: Circles between files of one package still to remove, each with who removes it.
KNOWN_CIRCLES: list[list[str]] = []  # none left (issue 40)


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every circle of imports between the files of one package (any import: module level, functions,
    ``TYPE_CHECKING``), as the sorted modules of each strongly connected set; a package's ``__init__``
    belongs to its own package."""
    packages = {m for m in graph if PACKAGE.parent.joinpath(*m.split("."), "__init__.py").is_file()}

    def package(m: str) -> str:
        return m if m in packages else m.rsplit(".", 1)[0]

    edges = {
        m: sorted(t for t in ts if t != m and t in graph and package(t) == package(m))
        for m, ts in graph.items()
    }
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        order[v] = low[v] = len(order)
        stack.append(v)
        for w in edges[v]:
            if w not in order:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            part = []
            while not part or part[-1] != v:
                part.append(stack.pop())
            if len(part) > 1:
                out.append(sorted(part))

    for v in sorted(edges):
        if v not in order:
            visit(v)
    return sorted(out)


def test_no_circle_between_the_files_of_a_package():
    assert [c for c in circles(import_graph()) if c not in KNOWN_CIRCLES] == []


@pytest.mark.parametrize(
    ("graph", "found"),
    [
        ({"fl_lightning.e.a": {"fl_lightning.e.b"}, "fl_lightning.e.b": {"fl_lightning.e.a"}}, True),
        (
            {
                "fl_lightning.e.a": {"fl_lightning.e.b"},
                "fl_lightning.e.b": {"fl_lightning.e.c"},
                "fl_lightning.e.c": {"fl_lightning.e.a"},
            },
            True,
        ),
        ({"fl_lightning.e.a": {"fl_lightning.e.b"}, "fl_lightning.e.b": set()}, False),
        ({"fl_lightning.e.a": {"fl_lightning.f.b"}, "fl_lightning.f.b": {"fl_lightning.e.a"}}, False),
    ],
)
def test_the_circle_check_finds_a_circle(graph, found):
    assert bool(circles(graph)) is found


def test_a_type_checking_import_closes_a_circle_too():
    source = "if TYPE_CHECKING:\n    from fl_lightning.engine.round import Engine\n"
    graph = {
        "fl_lightning.engine.round": {"fl_lightning.engine.schedule"},
        "fl_lightning.engine.schedule": imports(source, "fl_lightning.engine.schedule"),
    }
    assert circles(graph) == [["fl_lightning.engine.round", "fl_lightning.engine.schedule"]]


def test_every_subpackage_has_a_layer():
    assert {_subpackage(m) for m in import_graph()} <= set(LAYERS)


def test_strategies_program_against_the_api_only():
    """Strategies import the api package itself (its ``__init__``), not its modules one by one."""
    for module, targets in import_graph().items():
        if _subpackage(module) == "strategies":
            assert {t for t in targets if _subpackage(t) == "api"} <= {"fl_lightning.api"}, module


@pytest.mark.parametrize(
    ("module", "source", "bad"),
    [
        ("fl_lightning.functional.x", "from fl_lightning.api.types import Payload\n", True),
        ("fl_lightning.engine.round", "from fl_lightning.strategies.fedavg import FedAvg\n", True),
        ("fl_lightning.strategies.x", "from fl_lightning.engine.round import Engine\n", True),
        (
            "fl_lightning.engine.round",
            "def f():\n    from fl_lightning.callbacks import FederatedSummary\n",
            True,
        ),
        (
            "fl_lightning.api.types",
            "if TYPE_CHECKING:\n    from fl_lightning.engine.round import Engine\n",
            True,
        ),
        ("fl_lightning.data.x", "from fl_lightning.models import SmallCNN\n", True),
        ("fl_lightning.lightning.module", "from fl_lightning.strategies.fedavg import FedAvg\n", False),
        ("fl_lightning.engine.round", "from fl_lightning.api.strategy import Strategy\n", False),
        ("fl_lightning.models.cp", "from fl_lightning.functional.cp import cp_als\n", False),
        ("fl_lightning.flower.server_app", "from fl_lightning.cli import console\n", True),
        ("fl_lightning.flower.federation", "from fl_lightning.config import build_run\n", False),
    ],
)
def test_the_check_catches_an_import_that_runs_back_up(module, source, bad):
    assert bool(violations({module: imports(source, module)})) is bad
