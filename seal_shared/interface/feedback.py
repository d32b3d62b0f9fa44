"""Recovery feedback: hints appended to the environment's error observations in training.

The base environment always reports errors explicitly; these functions only add guidance on
how to recover. Tool-error hints are chosen by the first matching rule, in the release's order.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

FORMAT_EXAMPLES: dict[str, str] = {
    "xml_json": '<tool_call>\n{"name": "<tool_name>", "arguments": {"<parameter>": <value>}}\n</tool_call>',
    "python_list": "[<tool_name>(<parameter>=<value>)]",
    "llama3_json": '{"name": "<tool_name>", "parameters": {"<parameter>": <value>}}',
}
TOOL_HINT_PREFIX = "[ToolHint] "
GENERIC_HINT_MAX_CHARS = 200
MAX_LISTED_TOOLS_IN_TOOL_HINT = 8


def _tool_list(tool_names: Sequence[str], limit: int) -> str:
    shown = ", ".join(tool_names[:limit])
    more = len(tool_names) - limit
    return f"{shown} (and {more} more)" if more > 0 else shown


def parse_error_feedback(reason: str, *, parser_mode: str, tool_names: Sequence[str], max_tool_names: int = 12) -> str:
    """Hint lines for a rejected (unparseable or unavailable-tool) message, newline-joined.

    ``reason`` is the environment's one-line reason; the hints say how a valid call looks in
    ``parser_mode``, which tools exist (at most ``max_tool_names``), and that plain text is
    the right reply when no tool fits.
    """
    if parser_mode not in FORMAT_EXAMPLES:
        raise ValueError(f"unknown parser_mode {parser_mode!r}; known: {sorted(FORMAT_EXAMPLES)}")
    lines = [f"[Hint] A valid tool call looks like:\n{FORMAT_EXAMPLES[parser_mode]}"]
    if "not available" in reason.lower():
        lines.append("[Hint] Call only tools from the current tool list, spelled exactly as listed.")
    if tool_names and max_tool_names > 0:
        lines.append(f"[Hint] Available tools: {_tool_list(list(tool_names), max_tool_names)}")
    lines.append("[Hint] If no available tool fits the request, reply in plain text without a tool call.")
    return "\n".join(lines)


def _missing_args(m: re.Match, text: str, _: Sequence[str]) -> str:
    names = re.findall(r"'([^']+)'", text[m.end():])
    which = f" ({', '.join(names)})" if names else ""
    return f"The call left out required argument(s){which}; pass every parameter marked required in the schema."


def _unexpected_arg(m: re.Match, _t: str, _n: Sequence[str]) -> str:
    return f"'{m.group(1)}' is not a parameter of this tool; use only the parameter names in its schema."


def _unknown_tool(_m: re.Match, _t: str, names: Sequence[str]) -> str:
    listed = f": {_tool_list(list(names), MAX_LISTED_TOOLS_IN_TOOL_HINT)}" if names else ""
    return f"That tool does not exist here; call one of the available tools{listed}."


def _fixed(hint: str) -> Callable[[re.Match, str, Sequence[str]], str]:
    return lambda _m, _t, _n: hint


# (pattern, hint builder), checked in this order; the first match wins.
_TOOL_ERROR_RULES: tuple[tuple[re.Pattern, Callable[[re.Match, str, Sequence[str]], str]], ...] = (
    (re.compile(r"missing \d+ required (?:positional |keyword(?:-only)? )?arguments?", re.I), _missing_args),
    (re.compile(r"unexpected keyword argument '?([\w.]+)'?", re.I), _unexpected_arg),
    (re.compile(r"no such (?:file or )?(?:directory|file)", re.I),
     _fixed("That file or directory is not in the current location; look at the directory contents or move to "
            "the right directory first.")),
    (re.compile(r"cannot use path|single component", re.I),
     _fixed("Give a single file or directory name, not a path; change into the containing directory first.")),
    (re.compile(r"not authenticated|log ?in\b.*\brequired", re.I),
     _fixed("This action needs authentication; log in with the matching tool first, then retry.")),
    (re.compile(r"tool not found|no such tool|unknown function", re.I), _unknown_tool),
    (re.compile(r"expected\b.*\bgot\b", re.I | re.S),
     _fixed("An argument has the wrong type; match the types in the schema (number vs string, list vs single value).")),
)


def tool_error_hint(error_text: str, *, tool_names: Sequence[str] = ()) -> str | None:
    """A one-line recovery hint for a tool's error text: the first matching rule's, else a generic hint
    for a short error (under :data:`GENERIC_HINT_MAX_CHARS`), else ``None``."""
    if not error_text.strip():
        return None
    for pattern, build in _TOOL_ERROR_RULES:
        m = pattern.search(error_text)
        if m:
            return build(m, error_text, tool_names)
    if len(error_text.strip()) < GENERIC_HINT_MAX_CHARS:
        return "Read the error, fix the arguments or pick another tool, and retry; do not repeat the identical call."
    return None


def tool_error_feedback(error_text: str, *, tool_names: Sequence[str] = ()) -> str:
    """``"[ToolHint] <hint>"`` for a tool error, or ``""`` when no rule applies."""
    hint = tool_error_hint(error_text, tool_names=tool_names)
    return f"{TOOL_HINT_PREFIX}{hint}" if hint else ""
