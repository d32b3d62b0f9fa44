"""The rooms of the code base: which package may import which (every import, top level or deferred).

* the two trainer backends never import each other, and the shared trainer modules import neither;
* the episode runner (``seal.rollout``) never imports a trainer or the evaluation code (the
  validation record's column name is the episode record's, ``seal.episode``), and the generation engine
  (``seal.engine``) imports no trainer, runner, evaluation or environment code;
* the pure core (tags, diagnosis, reweighting, interface evolution, rewards) imports no trainer,
  runner, evaluation or environment-service code, and diagnosis and reweighting do not import
  each other (the dynamic weights take tag statistics as input);
* what the trainer and the environments share (``seal_shared``: tags, interface evolution, plug-in
  loading) imports neither of them, and the environment service imports nothing of ``seal``;
* the environment kit and the service's generic modules (host, registry, catalogue, routes, pool,
  client) know no environment: BFCL and ``notes`` are built on the kit, never the reverse, and what
  the service answers of an environment (its oracle, its judge) comes through its registration.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE = ("seal_shared", "seal.diagnosis", "seal.advantage", "seal.interface", "seal.rewards")
FORBIDDEN = [
    ("seal.trainer.local", ("seal.trainer.verl",)),
    ("seal.trainer.verl", ("seal.trainer.local",)),
    ("seal.rollout", ("seal.trainer", "seal.eval")),
    ("seal.engine", ("seal.trainer", "seal.rollout", "seal.eval", "seal.cli", "env_service")),
    *[(core, ("seal.trainer", "seal.rollout", "seal.eval", "seal.cli", "env_service")) for core in CORE],
    ("seal.diagnosis", ("seal.advantage",)),
    ("seal.advantage", ("seal.diagnosis",)),
    ("seal_shared", ("seal", "env_service")),
    ("env_service", ("seal",)),
    ("env_service.kit", ("env_service.bfcl", "env_service.notes")),
    *[(f"env_service.{generic}", ("env_service.bfcl", "env_service.notes"))
      for generic in ("host", "registry", "catalogue", "app", "service", "pool", "client", "schemas")],
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _inside(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _shared_trainer_module(name: str) -> bool:
    return _inside(name, "seal.trainer") and not any(_inside(name, f"seal.trainer.{b}") for b in ("local", "verl"))


GRAPH = {_module_name(p): _imports(p) for top in ("seal", "seal_shared", "env_service") for p in (ROOT / top).rglob("*.py")}


def test_the_graph_was_read() -> None:
    assert any(_inside(i, "seal.advantage") for i in GRAPH["seal.trainer.coevolution"])
    assert any(_inside(i, "seal_shared.tags") for i in GRAPH["env_service.kit.evaluation"])
    assert any(_inside(i, "seal.rollout") for i in GRAPH["seal.trainer.local.loop"])


@pytest.mark.parametrize(("room", "never"), FORBIDDEN, ids=[r for r, _ in FORBIDDEN])
def test_room_imports_nothing_it_must_not(room: str, never: tuple[str, ...]) -> None:
    bad = sorted(f"{mod} -> {imp}" for mod, imports in GRAPH.items() if _inside(mod, room)
                 for imp in imports if any(_inside(imp, n) for n in never))
    assert not bad, f"{room} must not import {never}: {bad}"


def test_shared_trainer_modules_import_no_backend() -> None:
    bad = sorted(f"{mod} -> {imp}" for mod, imports in GRAPH.items() if _shared_trainer_module(mod)
                 for imp in imports if _inside(imp, "seal.trainer.local") or _inside(imp, "seal.trainer.verl"))
    assert not bad, bad
