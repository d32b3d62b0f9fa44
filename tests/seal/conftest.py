"""Fixtures shared by the tests under tests/seal."""

from __future__ import annotations

import importlib
import sys

import pytest

from seal.advantage.registry import unregister_reweighter
from seal.tags import unregister_tag


@pytest.fixture
def plugins():
    """docs/extending.md's plug-in module (tests/seal/example_plugins.py), freshly imported: it
    registers the ``missed_tool`` tag and the ``failure_boost`` reweighter, removed afterwards."""
    sys.modules.pop("example_plugins", None)
    yield importlib.import_module("example_plugins")
    unregister_tag("missed_tool")
    unregister_reweighter("failure_boost")
    sys.modules.pop("example_plugins", None)
