"""No import cycles: neither between the modules of ``seal``, ``seal_shared`` and ``env_service`` nor
between their packages.

Every import counts, top level or deferred inside a function (a deferred import hides a circle
from Python but not from a reader). Each import is resolved to the deepest module of the project
it names (``from seal.tags import FailureTag`` -> ``seal.tags``; ``from seal import tags`` ->
``seal.tags``); the implicit import of a parent package is not an edge, so a package's
``__init__`` may re-export its modules as long as they never import it back.

Packages depend one way too: with every module replaced by its package at one depth (depth 1:
``seal``, ``env_service``; depth 2: ``seal.trainer``, ``seal.warm_start``, ``env_service.kit``, ...; a
module directly inside a package stays itself), the graph must still be acyclic, so no package
needs another that needs it back through different modules. A package's ``__main__`` is left out:
an entry point that nothing imports cannot tie two packages together.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("seal", "seal_shared", "env_service")


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    files = {_module_name(p, root): p for top in PACKAGES for p in (root / top).rglob("*.py")}

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


def package_graph(graph: dict[str, set[str]], depth: int) -> dict[str, set[str]]:
    """``graph`` with each module replaced by the first ``depth`` parts of its name (its package at that
    depth), without self-edges and without ``__main__`` modules."""
    def package(module: str) -> str:
        return ".".join(module.split(".")[:depth])

    out: dict[str, set[str]] = {}
    for module, targets in graph.items():
        if module.rpartition(".")[2] == "__main__":
            continue
        out.setdefault(package(module), set()).update(package(t) for t in targets if package(t) != package(module))
    return out


def test_the_module_import_graph_has_no_cycle() -> None:
    cycle = find_cycle(_import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_packages_depend_one_way(depth: int) -> None:
    cycle = find_cycle(package_graph(_import_graph(), depth))
    assert cycle is None, f"package cycle at depth {depth}: " + " -> ".join(cycle or [])


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


def test_two_packages_that_import_each_other_through_other_modules_are_a_cycle(tmp_path: Path) -> None:
    for package, source in (("seal", "from env_service.client import x\n"), ("env_service", "import seal.tags\n")):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "seal" / "tags.py").write_text("")
    (tmp_path / "seal" / "cli.py").write_text("from env_service.client import x\n")
    (tmp_path / "env_service" / "client.py").write_text("x = 1\n")
    (tmp_path / "env_service" / "kit.py").write_text("import seal.tags\n")
    graph = _import_graph(tmp_path)
    assert find_cycle(graph) is None  # no module cycle ...
    assert set(find_cycle(package_graph(graph, 1)) or []) == {"seal", "env_service"}  # ... but a package one
    (tmp_path / "env_service" / "__main__.py").write_text("import seal.tags\n")
    (tmp_path / "env_service" / "kit.py").write_text("")
    assert find_cycle(package_graph(_import_graph(tmp_path), 1)) is None  # an entry point ties nothing


def service_imports_outside_the_client(graph: dict[str, set[str]]) -> list[str]:
    """``seal`` module -> ``env_service`` module edges other than to :mod:`env_service.client` (and
    the package itself, which ``from env_service.client import ...`` passes through)."""
    allowed = {"env_service", "env_service.client"}
    return sorted(f"{module} -> {target}" for module, targets in graph.items() if module.split(".")[0] == "seal"
                  for target in targets if target.split(".")[0] == "env_service" and target not in allowed)


def test_seal_reaches_the_environments_only_through_the_client() -> None:
    """The trainer side asks the service (splits, categories, params checks, oracles, offline
    judgements) through ``env_service.client``, never its registry, kit or environments."""
    assert service_imports_outside_the_client(_import_graph()) == []


def test_an_import_of_the_registry_from_seal_is_caught(tmp_path: Path) -> None:
    for package in ("seal", "env_service"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "env_service" / "client.py").write_text("x = 1\n")
    (tmp_path / "env_service" / "registry.py").write_text("y = 1\n")
    (tmp_path / "seal" / "ok.py").write_text("from env_service.client import x\n")
    (tmp_path / "seal" / "bad.py").write_text("def f():\n    from env_service.registry import y\n")
    assert service_imports_outside_the_client(_import_graph(tmp_path)) == ["seal.bad -> env_service.registry"]
