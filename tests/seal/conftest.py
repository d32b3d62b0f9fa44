"""Fixtures shared by the tests under tests/seal."""

from __future__ import annotations

import importlib
import sys

import pytest

from seal.advantage.registry import unregister_reweighter
from seal.config import REPO_ROOT
from seal_shared.tags import unregister_tag

SMOLLM2_DIR = REPO_ROOT / "models" / "SmolLM2-135M-Instruct"


@pytest.fixture(scope="session")
def tokenizer():
    """SmolLM2-135M-Instruct's tokenizer (install.sh saves it); the tests using it skip without it."""
    if not (SMOLLM2_DIR / "tokenizer.json").is_file():
        pytest.skip("models/SmolLM2-135M-Instruct is not installed (run install.sh)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(SMOLLM2_DIR))


@pytest.fixture
def plugins():
    """docs/extending.md's plug-in module (tests/seal/example_plugins.py), freshly imported: it
    registers the ``missed_tool`` tag and the ``failure_boost`` reweighter, removed afterwards."""
    sys.modules.pop("example_plugins", None)
    yield importlib.import_module("example_plugins")
    unregister_tag("missed_tool")
    unregister_reweighter("failure_boost")
    sys.modules.pop("example_plugins", None)
