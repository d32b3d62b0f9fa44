"""Fixtures for the BFCL environment-core tests: the task store, an inert interface, an oracle."""

from __future__ import annotations

import inspect
import json
from typing import Any, Callable

import pytest

from env_service.bfcl.executor import backend_class, parse_call
from env_service.bfcl.tasks import Task, TaskStore


class InertInterface:
    """A stand-in for ``seal.interface.EpisodeInterface`` with every part switched off."""

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
    return TaskStore.load(include_composite=True)


@pytest.fixture
def inert() -> InertInterface:
    return InertInterface()


@pytest.fixture
def recording() -> RecordingInterface:
    return RecordingInterface()


def _json_call(call: str, classes: tuple[str, ...]) -> dict[str, Any]:
    """A ground-truth call string as a JSON tool call, positional arguments named by the signature."""
    parsed = parse_call(call)
    args = dict(parsed.kwargs)
    if parsed.args:
        for cls in classes:
            method = getattr(backend_class(cls), parsed.name, None)
            if method is not None:
                names = [n for n in inspect.signature(method).parameters if n != "self"]
                args = {**dict(zip(names, parsed.args)), **args}
                break
    return {"name": parsed.name, "arguments": args}


def oracle_messages(task: Task) -> list[str] | None:
    """Assistant messages replaying the ground truth: each turn's calls in one message, then a
    plain reply. ``None`` when a ground-truth call is not valid Python (composite data bugs)."""
    messages: list[str] = []
    for gt in task.gt_turns:
        if gt:
            try:
                calls = [_json_call(c, task.involved_classes) for c in gt]
            except ValueError:
                return None
            messages.append("\n".join(f"<tool_call>\n{json.dumps(c)}\n</tool_call>" for c in calls))
        messages.append("Done.")
    return messages


@pytest.fixture(scope="session")
def oracle() -> Callable[[Task], list[str] | None]:
    return oracle_messages
