"""No package-level import cycles in src/agentload.

The graph is read from the source with ``ast``, not from ``sys.modules``, so an import hidden in a function body
(the usual way to dodge a cycle) counts like one at the top of a module. Imports under ``if TYPE_CHECKING:`` count
too: it is the stricter choice, and a type-only edge still means the two packages know each other, so the cycle is
only postponed to whoever needs the type at run time. ``importlib.import_module("agentload....")`` with a literal
name counts as an import — the sim ↔ suite cycle was hidden exactly that way.

A node is a sub-package of ``agentload`` (``sim``, ``store``, ...), a top-level module (``clock``, ``errors``,
``inputs``) or ``agentload`` itself (``__version__``); imports inside one node are not edges.

A second, finer graph has one node per module (a package's ``__init__`` is the package's node), read the same way:
hidden, ``TYPE_CHECKING`` and ``import_module`` imports count, for the same reasons; so no two modules of one
package import each other either, directly or round a circle. A circle between modules is the same defect one level
down: whichever module Python starts on sees the other half-initialised, and a function-body import that dodges
that only moves the failure to whoever first calls it. What two modules share belongs in a module below both. The
one edge not counted is the import of a module's own enclosing packages that Python runs first: it is implicit
(never written) and every ``__init__`` that re-exports its submodules would otherwise be a circle with each of them;
an explicit ``from agentload.store import X`` inside ``store`` does count, and with such an ``__init__`` is one.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT_PACKAGE = "agentload"

# (importing node, imported node) -> the import statements that make the edge, as "module:line statement".
Graph = dict[tuple[str, str], list[str]]


def _module_name(path: Path, src: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(src).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_package else parts), is_package


def _imported(node: ast.AST, module: str, is_package: bool) -> Iterator[str]:
    """The absolute module names one AST node imports (nothing for nodes that are not imports)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        if node.level:  # a relative import: resolve it against the importing module's package
            package = module.split(".") if is_package else module.split(".")[:-1]
            base = ".".join(package[: len(package) - (node.level - 1)])
            target = f"{base}.{node.module}" if node.module else base
        else:
            target = node.module or ""
        # Each name is read as a module: `from agentload import clock` imports the module agentload.clock, and
        # `from agentload import __version__` a name that _node_of gives to the root package.
        yield from (f"{target}.{alias.name}" for alias in node.names)
    elif isinstance(node, ast.Call) and node.args:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        first = node.args[0]
        if name in {"import_module", "__import__"} and isinstance(first, ast.Constant) and isinstance(first.value, str):
            yield first.value


def _node_of(module: str, nodes: set[str]) -> str | None:
    """The graph node a module belongs to (the root package for a name defined in it); None outside it."""
    parts = module.split(".")
    if parts[0] != ROOT_PACKAGE:
        return None
    return parts[1] if len(parts) > 1 and parts[1] in nodes else ROOT_PACKAGE


def build_graph(src: Path = SRC, package: str = ROOT_PACKAGE) -> Graph:
    """Every import between two nodes of ``package`` under ``src``, wherever in a module it is written."""
    root = src / package
    nodes = {p.stem for p in root.glob("*.py") if p.stem != "__init__"} | {
        p.parent.name for p in root.glob("*/__init__.py")
    }
    graph: Graph = {}
    for path in sorted(root.rglob("*.py")):
        module, is_package = _module_name(path, src)
        source = _node_of(module, nodes)
        assert source is not None, module
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            targets = {_node_of(name, nodes) for name in _imported(node, module, is_package)}
            for target in sorted(t for t in targets if t is not None and t != source):
                line = getattr(node, "lineno", 0)
                graph.setdefault((source, target), []).append(f"{module}:{line} {ast.unparse(node)}")
    return graph


def build_module_graph(src: Path = SRC, package: str = ROOT_PACKAGE) -> Graph:
    """Every import between two modules of ``package`` under ``src``, wherever in a module it is written.

    A name is given to the longest module it starts with: ``from agentload.store.rundir import RunDir`` is an edge to
    ``agentload.store.rundir``, ``from agentload.store import RunDir`` one to ``agentload.store`` (its ``__init__``).
    """
    paths = {_module_name(path, src): path for path in sorted((src / package).rglob("*.py"))}
    modules = {module for module, _ in paths}

    def module_of(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: Graph = {}
    for (module, is_package), path in paths.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            targets = {module_of(name) for name in _imported(node, module, is_package)}
            for target in sorted(t for t in targets if t is not None and t != module):
                line = getattr(node, "lineno", 0)
                graph.setdefault((module, target), []).append(f"{module}:{line} {ast.unparse(node)}")
    return graph


def cycles(graph: Mapping[tuple[str, str], object]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan), each sorted; empty when acyclic."""
    succ: dict[str, list[str]] = {}
    for a, b in graph:
        succ.setdefault(a, []).append(b)
        succ.setdefault(b, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in succ[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(succ):
        if v not in index:
            visit(v)
    return sorted(found)


def describe(graph: Graph, found: list[list[str]]) -> str:
    lines = []
    for component in found:
        lines.append(" <-> ".join(component) + ":")
        members = set(component)
        for (a, b), statements in sorted(graph.items()):
            if a in members and b in members:
                lines.append(f"  {a} -> {b}")
                lines.extend(f"      {s}" for s in statements)
    return "\n".join(lines)


def test_the_package_graph_has_no_cycle() -> None:
    graph = build_graph()
    found = cycles(graph)
    assert not found, "package import cycles:\n" + describe(graph, found)


def test_no_module_imports_one_that_imports_it_back() -> None:
    graph = build_module_graph()
    found = cycles(graph)
    assert not found, "module import circles:\n" + describe(graph, found)


def test_the_module_graph_sees_imports_inside_a_package() -> None:
    graph = build_module_graph()
    # Edges inside one package (what the package graph cannot see), one to a package's __init__, one across.
    for edge in [
        ("agentload.store.runstore", "agentload.store.catalog"),
        ("agentload.dashboard.server", "agentload.dashboard.replay"),
        ("agentload.cli.report", "agentload.store"),
        ("agentload.fleet.samples", "agentload.endpoint.samples"),
    ]:
        assert edge in graph, edge


def test_the_graph_sees_the_packages_and_the_composition_root() -> None:
    graph = build_graph()
    # A vacuous graph would pass the test above: pin a few edges that must exist.
    for edge in [("cli", "sim"), ("cli", "suite"), ("sim", "capacity"), ("suite", "sim"), ("workload", "endpoint")]:
        assert edge in graph, edge


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def test_hidden_imports_count_and_a_cycle_is_named(tmp_path: Path) -> None:
    pkg = tmp_path / "agentload"
    _write(pkg / "__init__.py", '__version__ = "0"\n')
    _write(pkg / "clock.py", "")
    _write(pkg / "a" / "__init__.py", "def f():\n    from agentload.b import x\n")
    _write(pkg / "b" / "__init__.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..c import y\n")
    _write(pkg / "b" / "x.py", "from . import y\nfrom agentload import clock\n")
    _write(pkg / "c" / "__init__.py", 'import importlib\nimportlib.import_module("agentload.a.z")\n')
    _write(pkg / "d.py", "from agentload import __version__\nimport agentload.a\n")
    graph = build_graph(tmp_path)
    assert set(graph) == {("a", "b"), ("b", "c"), ("b", "clock"), ("c", "a"), ("d", "agentload"), ("d", "a")}
    assert graph[("a", "b")] == ["agentload.a:2 from agentload.b import x"]
    found = cycles(graph)
    assert found == [["a", "b", "c"]]
    assert "agentload.c:2 importlib.import_module('agentload.a.z')" in describe(graph, found)


def test_an_acyclic_graph_has_no_cycle() -> None:
    assert cycles({("a", "b"): [], ("b", "c"): [], ("a", "c"): []}) == []
    assert cycles({("a", "b"): [], ("b", "a"): [], ("c", "d"): [], ("d", "c"): []}) == [["a", "b"], ["c", "d"]]


def test_a_circle_between_two_modules_is_found_and_named(tmp_path: Path) -> None:
    pkg = tmp_path / "agentload"
    _write(pkg / "__init__.py", "")
    _write(pkg / "store" / "__init__.py", "from agentload.store.rundir import RunDir\n")
    # The circle: a module-level import one way, the other hidden in a function body.
    _write(pkg / "store" / "rundir.py", "from agentload.store.csvexport import export\nclass RunDir: ...\n")
    _write(pkg / "store" / "csvexport.py", "def export():\n    from .rundir import RunDir\n")
    # Not circles: a module's own package run first (implicit), a type-only import of a module that imports nothing.
    _write(
        pkg / "store" / "jsonl.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import atomic\n"
    )
    _write(pkg / "store" / "atomic.py", "")
    graph = build_module_graph(tmp_path)
    assert set(graph) == {
        ("agentload.store", "agentload.store.rundir"),
        ("agentload.store.rundir", "agentload.store.csvexport"),
        ("agentload.store.csvexport", "agentload.store.rundir"),
        ("agentload.store.jsonl", "agentload.store.atomic"),
    }
    found = cycles(graph)
    assert found == [["agentload.store.csvexport", "agentload.store.rundir"]]
    message = describe(graph, found)
    assert "agentload.store.csvexport:2 from .rundir import RunDir" in message
    assert "agentload.store.rundir:1 from agentload.store.csvexport import export" in message
    # The package graph sees none of it: the circle is inside one node.
    assert cycles(build_graph(tmp_path)) == []


def test_an_import_of_the_own_package_closes_a_circle_with_its_init(tmp_path: Path) -> None:
    pkg = tmp_path / "agentload"
    _write(pkg / "__init__.py", "")
    _write(pkg / "store" / "__init__.py", "from agentload.store.catalog import dir_info\n")
    _write(pkg / "store" / "catalog.py", "from agentload.store import RunStore\n")
    assert cycles(build_module_graph(tmp_path)) == [["agentload.store", "agentload.store.catalog"]]
