"""Oracle episodes: the assistant messages that replay a task's ground truth through the protocol.

For each ground-truth turn the oracle sends one assistant message holding all of the turn's calls
as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (skipped when the turn's
ground truth is empty), then a plain reply, which advances to the next user turn (or reveals the
held-out functions, or ends the episode). Ground-truth call strings may use positional arguments
(``sort('final_report.pdf')``); they are turned into keyword JSON with the tool's parameter names
in order (an episode class's :meth:`~env_service.kit.ToolEpisode.tool_parameters`, so each
environment names them from its own tools), as Python would bind them. Calls are written in the
syntax of the episode's ``tool_call_parser``: ``<tool_call>`` JSON blocks (``xml_json``, the
default), a Python call list ``[f(a=1), g(b='x')]`` (``python_list`` / ``toolace_fc``) or JSON
objects with ``name`` and ``parameters`` (``llama3_json`` / ``llama31_official_fc``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from env_service.kit.parsers import resolve_mode
from seal_shared.calls import call_to_string, parse_call

# tool name -> its parameter names in order (what names a call string's positional arguments).
ToolParameters = Mapping[str, Sequence[str]]

ORACLE_REPLY = "Done."


def call_to_json(call: str, parameters: ToolParameters) -> dict[str, Any]:
    """``"sort('a.txt')"`` -> ``{"name": "sort", "arguments": {"file_name": "a.txt"}}``.

    Only positional arguments are bound (named after ``parameters``); keyword arguments pass through
    unchecked, so a ground-truth call with a wrong keyword reaches the tool and fails there, as it
    does in BFCL.
    """
    parsed = parse_call(call)
    if not parsed.args:
        return {"name": parsed.name, "arguments": dict(parsed.kwargs)}
    names = parameters.get(parsed.name)
    if names is None:
        raise KeyError(f"no tool {parsed.name!r} among the environment's tools: the positional arguments of "
                       f"{call!r} have no names")
    return {"name": parsed.name, "arguments": {**dict(zip(names, parsed.args)), **parsed.kwargs}}


def tool_call_message(calls: list[str], parameters: ToolParameters, *, parser: str = "xml_json") -> str:
    """One assistant message with every call of a turn, in ``parser``'s syntax (see the module
    docstring): one ``<tool_call>`` block per call for ``xml_json``."""
    objects = [call_to_json(c, parameters) for c in calls]
    mode = resolve_mode(parser)
    if mode == "python_list":
        return "[" + ", ".join(call_to_string(o["name"], o["arguments"]) for o in objects) + "]"
    if mode == "llama3_json":
        named = [{"name": o["name"], "parameters": o["arguments"]} for o in objects]
        return json.dumps(named[0] if len(named) == 1 else named)
    return "\n".join(f"<tool_call>\n{json.dumps(o)}\n</tool_call>" for o in objects)


def oracle_messages(gt_turns: list[list[str]], parameters: ToolParameters, *, parser: str = "xml_json") -> list[str]:
    """The assistant messages of a full oracle episode, in order."""
    messages: list[str] = []
    for calls in gt_turns:
        if calls:
            messages.append(tool_call_message(calls, parameters, parser=parser))
        messages.append(ORACLE_REPLY)
    return messages

