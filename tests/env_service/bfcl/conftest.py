"""Fixtures for the BFCL environment-core tests: the task store, an inert interface, an oracle."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from env_service.bfcl.episode import BfclEpisode
from env_service.bfcl.tasks import BfclTask, load_store
from env_service.kit import TaskStore


class InertInterface:
    """A stand-in for ``seal_shared.interface.EpisodeInterface`` with every part switched off."""

    def transform_tools(self, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [dict(t) for t in tools]

    def system_blocks(self) -> list[str]:
        return []

    def parse_error_feedback(self, reason: str, *, parser_mode: str, tool_names: list[str]) -> str:
        return ""

    def tool_error_feedback(self, error_text: str, *, tool_names: list[str]) -> str:
        return ""


class RecordingInterface(InertInterface):
    """A test double whose every part is visible in the episode's text."""

    def __init__(self) -> None:
        self.parse_calls: list[tuple[str, str]] = []

    def transform_tools(self, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{**t, "description": t["description"] + " [annotated]"} for t in tools]

    def system_blocks(self) -> list[str]:
        return ["EXTRA BLOCK ONE", "EXTRA BLOCK TWO"]

    def parse_error_feedback(self, reason: str, *, parser_mode: str, tool_names: list[str]) -> str:
        self.parse_calls.append((reason, parser_mode))
        return f"[Hint] tools: {len(tool_names)}"

    def tool_error_feedback(self, error_text: str, *, tool_names: list[str]) -> str:
        return "[ToolHint] check the arguments"


@pytest.fixture(scope="session")
def store() -> TaskStore:
    """The four categories plus the retired composite set."""
    return load_store(include_composite=True)


@pytest.fixture
def inert() -> InertInterface:
    return InertInterface()


@pytest.fixture
def recording() -> RecordingInterface:
    return RecordingInterface()


def oracle_messages(task: BfclTask) -> list[str] | None:
    """Assistant messages replaying the ground truth (``BfclEpisode.oracle``): each turn's calls in
    one message, then a plain reply. ``None`` when a ground-truth call is not valid Python
    (composite data bugs)."""
    try:
        return BfclEpisode.oracle(task)
    except ValueError:
        return None


@pytest.fixture(scope="session")
def oracle() -> Callable[[BfclTask], list[str] | None]:
    return oracle_messages
