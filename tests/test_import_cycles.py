"""No import cycles: the package import graph of ``seal`` and ``env_service`` is acyclic.

Every import counts, top level or deferred inside a function (a deferred import hides a circle
from Python but not from a reader). Each import is resolved to the deepest module of the project
it names (``from seal.tags import FailureTag`` -> ``seal.tags``; ``from seal import tags`` ->
``seal.tags``); the implicit import of a parent package is not an edge, so a package's
``__init__`` may re-export its modules as long as they never import it back.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    files = {_module_name(p, root): p for top in ("seal", "env_service") for p in (root / top).rglob("*.py")}

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(resolve(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets.update(resolve(f"{node.module}.{alias.name}") for alias in node.names)
        graph[module] = {t for t in targets if t and t != module}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if state.get(start):
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


def test_the_package_import_graph_has_no_cycle() -> None:
    cycle = find_cycle(_import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_a_two_module_circle_is_found(tmp_path: Path) -> None:
    pkg = tmp_path / "seal"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from seal.b import g\n")
    (pkg / "b.py").write_text("from seal import a\n")
    (tmp_path / "env_service").mkdir()
    cycle = find_cycle(_import_graph(tmp_path))
    assert cycle is not None and set(cycle) == {"seal.a", "seal.b"}


def test_a_package_reexporting_its_modules_is_no_cycle(tmp_path: Path) -> None:
    pkg = tmp_path / "seal"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from seal.a import f\n")
    (pkg / "a.py").write_text("import json\n")
    (tmp_path / "env_service").mkdir()
    assert find_cycle(_import_graph(tmp_path)) is None
