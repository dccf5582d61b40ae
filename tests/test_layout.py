"""The package's import graph: data flows one way (DESIGN.md, "The package inside").

``functional`` is pure math (it imports nothing of the package but itself and ``errors``); ``core`` never
imports ``strategies``, ``callbacks`` or ``cli`` at module level, except ``core/module.py`` (the top of
the spine: FedAvg is its default strategy, ``FederatedCallback`` the hooks it calls); ``data`` and
``models`` import neither ``core``, ``strategies`` nor ``callbacks``; ``strategies`` and ``callbacks``
never import ``cli``, and from ``core`` only its shared types (``types``, ``buffers``). Imports under
``if TYPE_CHECKING:`` are type hints, not edges. No cycles between subpackages.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "fl_lightning"

#: subpackage -> subpackages (or top-level modules) of fl_lightning it must not import at runtime.
FORBIDDEN = {
    "functional": {"core", "strategies", "callbacks", "data", "models", "cli", "runs", "flower"},
    "core": {"strategies", "callbacks", "cli", "flower"},
    "data": {"core", "strategies", "callbacks", "models", "cli", "flower"},
    "models": {"core", "strategies", "callbacks", "data", "cli", "flower"},
    "strategies": {"callbacks", "cli", "flower"},
    "callbacks": {"strategies", "cli", "flower"},
    "cli": {"flower"},  # the Flower apps sit on top (optional extra); nothing imports them
}
#: (module, imported module) edges the design allows despite FORBIDDEN.
ALLOWED = {
    ("fl_lightning.core.module", "fl_lightning.strategies.base"),  # the strategy type and its default
    ("fl_lightning.core.module", "fl_lightning.strategies.fedavg"),
    ("fl_lightning.core.module", "fl_lightning.callbacks.base"),  # the federated hooks it calls
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def runtime_imports(source: str, module: str) -> set[str]:
    """The ``fl_lightning`` modules ``source`` imports, outside ``if TYPE_CHECKING:`` blocks.

    Function-level (lazy) imports count: they run too, only later.
    """
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names if a.name.startswith("fl_lightning"))
            elif isinstance(child, ast.ImportFrom):
                if child.level:  # relative import: resolve against the package of `module`
                    base = module.split(".")[: -child.level] if child.level else []
                    name = ".".join([*base, child.module] if child.module else base)
                else:
                    name = child.module or ""
                if name.startswith("fl_lightning"):
                    found.add(name)
                    # `from fl_lightning.strategies import fedavg` imports a submodule
                    found.update(
                        f"{name}.{a.name}"
                        for a in child.names
                        if (PACKAGE.parent / name.replace(".", "/") / f"{a.name}.py").exists()
                    )
            visit(child)

    visit(ast.parse(source))
    return found


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    return {
        _module_name(p): runtime_imports(p.read_text(), _module_name(p)) for p in sorted(root.rglob("*.py"))
    }


def _subpackage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def violations(graph: dict[str, set[str]]) -> list[str]:
    """Every edge that breaks :data:`FORBIDDEN` (minus :data:`ALLOWED`)."""
    out = []
    for module, imports in graph.items():
        banned = FORBIDDEN.get(_subpackage(module), set())
        for target in sorted(imports):
            if _subpackage(target) in banned and (module, target) not in ALLOWED:
                out.append(f"{module} imports {target}")
    return out


def subpackage_cycles(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Pairs of subpackages that import each other (directly or through others), allowed edges excluded."""
    edges: dict[str, set[str]] = {}
    for module, imports in graph.items():
        for target in imports:
            a, b = _subpackage(module), _subpackage(target)
            if a != b and (module, target) not in ALLOWED:
                edges.setdefault(a, set()).add(b)

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            node = todo.pop()
            for nxt in edges.get(node, ()):
                if nxt == goal:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return False

    names = sorted(edges)
    return [(a, b) for i, a in enumerate(names) for b in names[i + 1 :] if reaches(a, b) and reaches(b, a)]


def test_the_package_imports_one_way():
    graph = import_graph()
    assert "fl_lightning.core.round" in graph and "fl_lightning.functional.tensor" in graph
    assert violations(graph) == []


def test_subpackages_have_no_cycles():
    packages = {"core", "functional", "strategies", "callbacks", "data", "models"}
    cycles = [c for c in subpackage_cycles(import_graph()) if set(c) <= packages]
    assert cycles == []


def test_strategies_and_callbacks_use_only_the_shared_types_of_core():
    """Strategies sit below the loop: they get a ClientContext and return tensors, never call back up.

    Besides the shared types they may use the aggregators (``Strategy.aggregator`` chooses one)."""
    shared = {"fl_lightning.core.types", "fl_lightning.core.buffers", "fl_lightning.core.aggregation"}
    for module, imports in import_graph().items():
        if _subpackage(module) in ("strategies", "callbacks"):
            assert {i for i in imports if _subpackage(i) == "core"} <= shared, module


def test_functional_imports_only_itself_and_errors():
    graph = import_graph()
    for module, imports in graph.items():
        if _subpackage(module) == "functional":
            assert {
                i for i in imports if not i.startswith(("fl_lightning.functional", "fl_lightning.errors"))
            } == set(), module


@pytest.mark.parametrize(
    ("module", "source", "bad"),
    [
        ("fl_lightning.functional.x", "from fl_lightning.core.types import Payload\n", True),
        ("fl_lightning.core.round", "from fl_lightning.strategies.base import Strategy\n", True),
        (
            "fl_lightning.core.round",
            "def f():\n    from fl_lightning.callbacks import FederatedSummary\n",
            True,
        ),
        (
            "fl_lightning.core.round",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from fl_lightning.strategies.base import Strategy\n",
            False,
        ),
        ("fl_lightning.core.module", "from fl_lightning.strategies.fedavg import FedAvg\n", False),
        ("fl_lightning.core.local", "from fl_lightning.strategies.fedavg import FedAvg\n", True),
        ("fl_lightning.strategies.fedprox", "from fl_lightning.cli import main\n", True),
        ("fl_lightning.models.cp", "from fl_lightning.functional.cp import cp_als\n", False),
    ],
)
def test_the_check_catches_an_import_that_runs_back_up(module, source, bad):
    graph = {module: runtime_imports(source, module)}
    assert bool(violations(graph)) is bad


def test_the_check_catches_a_cycle():
    graph = {
        "fl_lightning.core.round": {"fl_lightning.functional.tensor"},
        "fl_lightning.functional.tensor": {"fl_lightning.data.viz"},
        "fl_lightning.data.viz": {"fl_lightning.core.types"},
    }
    assert subpackage_cycles(graph) == [("core", "data"), ("core", "functional"), ("data", "functional")]
