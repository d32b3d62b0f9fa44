"""Fixtures shared by the environment-service tests."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

from env_service.registry import unregister_environment

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"


@pytest.fixture
def import_plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str, str], ModuleType]]:
    """``import_plugin(module, env_name)``: ``tests/plugins/<module>.py`` importable (on sys.path
    only: no PYTHONPATH), imported fresh; the environment it registers is unregistered after."""
    loaded: list[tuple[str, str]] = []

    def load(module: str, env_name: str) -> ModuleType:
        monkeypatch.syspath_prepend(str(PLUGINS))
        sys.modules.pop(module, None)
        loaded.append((module, env_name))
        return importlib.import_module(module)

    yield load
    for module, env_name in loaded:
        unregister_environment(env_name)
        sys.modules.pop(module, None)
