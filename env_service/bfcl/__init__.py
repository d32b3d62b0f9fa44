"""The BFCL multi-turn environment, without HTTP.

Modules: ``tasks`` (the task store and splits), ``executor`` (safe per-episode backends),
``checker`` (BFCL's verdict plus per-turn failure tags), ``parsers`` (assistant text
to tool calls), ``prompts`` (system prompt and observation text), ``episode`` (the protocol).
The names below are re-exported lazily, so importing this package costs nothing until used.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Task": "tasks", "TaskStore": "tasks", "default_store": "tasks", "load_split": "tasks",
    "CATEGORIES": "tasks",
    "Executor": "executor", "parse_call": "executor", "ParsedCall": "executor",
    "check_episode": "checker", "EpisodeCheck": "checker",
    "parse_tool_calls": "parsers", "ParseResult": "parsers", "ToolCall": "parsers",
    "render_system_prompt": "prompts", "render_tool_responses": "prompts",
    "BfclEpisode": "episode", "EpisodeParams": "episode", "StepOutcome": "episode",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'env_service.bfcl' has no attribute {name!r}")
    return getattr(importlib.import_module(f"env_service.bfcl.{module}"), name)
