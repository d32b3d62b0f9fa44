"""Prompt and observation text of the BFCL episode (the release's ``bfcl_qwen_fc`` mode).

The system prompt is Qwen2.5's native tool preamble with the task's BFCL func docs, one
``json.dumps(doc)`` per line inside ``<tools>``; extra instruction blocks (interface evolution)
follow, each after a blank line. Tool results come back as ``<tool_response>`` blocks.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

TOOL_PROMPT_MODES: tuple[str, ...] = ("bfcl_qwen_fc",)
TOOL_RESULT_MODES: tuple[str, ...] = ("bfcl_tool_response",)

CONVERSATION_COMPLETED = "[CONVERSATION_COMPLETED]"
INVALID_TOOL_CALL_PREFIX = "[ERROR] Invalid tool call format: "
# BFCL's DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC (constants/default_prompts.py).
MISS_FUNC_SENTENCE = "I have updated some more functions you can choose from. What about now?"

_QWEN_TOOLS_HEADER = (
    "# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>"
)
_QWEN_TOOLS_FOOTER = (
    "</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n"
    "<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>"
)


def render_system_prompt(tools: list[dict[str, Any]], extra_blocks: Iterable[str] = ()) -> str:
    """The ``bfcl_qwen_fc`` system prompt for ``tools`` (BFCL func docs), plus extra blocks."""
    lines = [_QWEN_TOOLS_HEADER, *(json.dumps(tool) for tool in tools), _QWEN_TOOLS_FOOTER]
    prompt = "\n".join(lines)
    for block in extra_blocks:
        if block and block.strip():
            prompt += "\n\n" + block.strip()
    return prompt


def render_tool_responses(results: Iterable[str], hints: Iterable[str] | None = None) -> str:
    """Wrap each result in a ``<tool_response>`` block; blocks joined by newlines, trailing newline.

    ``hints`` (parallel to ``results``) are optional ``[ToolHint] ...`` lines placed right after
    the block of the failing call; empty strings add nothing.
    """
    results = list(results)
    hint_list = list(hints) if hints is not None else [""] * len(results)
    if len(hint_list) != len(results):
        raise ValueError(f"{len(hint_list)} hints for {len(results)} results")
    parts: list[str] = []
    for result, hint in zip(results, hint_list):
        parts.append(f"<tool_response>\n{result}\n</tool_response>")
        if hint:
            parts.append(hint)
    return "\n".join(parts) + "\n"


def render_invalid_tool_call(reason: str, feedback: str = "") -> str:
    """The observation for a rejected message: ``[ERROR] Invalid tool call format: <reason>``."""
    text = INVALID_TOOL_CALL_PREFIX + reason
    if feedback:
        text += "\n" + feedback.strip()
    return text


def render_revealed_functions(docs: list[dict[str, Any]]) -> str:
    """BFCL's prompting-style hold-out turn: the docs' Python ``str()``, a newline, the sentence."""
    return str(docs) + "\n" + MISS_FUNC_SENTENCE


def call_to_string(name: str, arguments: dict[str, Any]) -> str:
    """A tool call as the executor's call string, ``name(k=repr(v), ...)`` (BFCL's FC decoding)."""
    return f"{name}(" + ", ".join(f"{k}={v!r}" for k, v in arguments.items()) + ")"
