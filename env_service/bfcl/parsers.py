"""Turning assistant text into tool calls: ``xml_json`` (default), ``python_list``, ``llama3_json``.

``xml_json`` is the release's strict Qwen mode: ``<tool_call>{"name": ..., "arguments": {...}}
</tool_call>`` blocks. In strict mode any error rejects *all* calls of the message. The other
two modes serve baselines: a Python call list ``[f(a=1), g(b='x')]`` parsed with :mod:`ast`
(literal keyword arguments only), and raw JSON (``{"name": ..., "parameters": {...}}``, a list of
such objects, or one object per line).

Every mode returns a :class:`ParseResult`; a message without any tool-call syntax is plain text
(no calls, no error), which the episode takes as "advance to the next user turn".
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any

PARSER_MODES: tuple[str, ...] = ("xml_json", "python_list", "llama3_json")
# The release's names for the same parsers.
PARSER_ALIASES: dict[str, str] = {"toolace_fc": "python_list", "llama31_official_fc": "llama3_json"}

_TOOL_CALL_BLOCK = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)
_PY_LITERAL = re.compile(r"\b(True|False|None)\b")
_BLANK_LINES = re.compile(r"\n\s*\n+")
_FENCE = re.compile(r"^```[a-zA-Z0-9_]*\s*\n?(.*?)\n?```$", re.DOTALL)

# Python's parser refuses more than 200 nested brackets, so a deeper call could never run; refusing it
# here also keeps every later step (the call string's repr, the checker) away from the recursion limit.
MAX_ARGUMENT_DEPTH = 200
NO_VALID_BLOCK = "Found tool_call tag text, but no valid <tool_call>{...}</tool_call> block."


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass
class ParseResult:
    """Calls found in one message. In strict mode ``calls`` is empty whenever ``errors`` is not;
    the calls that were well formed but dropped because of another error are in ``rejected``."""

    calls: list[ToolCall] = field(default_factory=list)
    content: str = ""
    errors: list[str] = field(default_factory=list)
    rejected: list[ToolCall] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


def resolve_mode(mode: str) -> str:
    mode = PARSER_ALIASES.get(mode, mode)
    if mode not in PARSER_MODES:
        raise ValueError(f"unknown tool_call_parser {mode!r}; expected one of "
                         f"{', '.join(PARSER_MODES + tuple(PARSER_ALIASES))}")
    return mode


def _call_from_obj(obj: dict[str, Any], *, strict: bool, accept_parameters: bool,
                   names_parameters: bool = False) -> ToolCall:
    """Validate one decoded JSON object; raise ValueError with the reason."""
    if accept_parameters and "arguments" not in obj and "parameters" in obj:
        obj = {**obj, "arguments": obj["parameters"]}
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError("tool call without a 'name' string")
    key = "parameters" if names_parameters else "arguments"
    if "arguments" not in obj:
        raise ValueError(f"tool call {name[:60]!r} has no '{key}' object")
    args = obj["arguments"]
    if isinstance(args, str):
        try:
            args = _loads(args) if args.strip() else {}
        except ValueError as e:
            if strict:
                reason = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
                raise ValueError(f"the '{key}' string of {name[:60]!r} is not valid JSON ({reason})") from None
            args = {}
    if not isinstance(args, dict):
        raise ValueError(f"the '{key}' of {name[:60]!r} must be a JSON object, got {type(args).__name__}")
    if _nested_deeper_than(args, MAX_ARGUMENT_DEPTH):
        raise ValueError(f"the '{key}' of {name[:60]!r} are nested deeper than {MAX_ARGUMENT_DEPTH} levels")
    return ToolCall(name=name.strip(), arguments=args)


def _nested_deeper_than(value: Any, limit: int) -> bool:
    """Iterative (a recursive walk is what deep input attacks)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return False


def _finish(calls: list[ToolCall], errors: list[str], content: str, strict: bool) -> ParseResult:
    if strict and errors:
        return ParseResult(calls=[], content=content, errors=errors, rejected=calls)
    return ParseResult(calls=calls, content=content, errors=errors)


class _JsonLimitError(ValueError):
    """Valid JSON that this parser will not build: nesting past the recursion limit, or an integer
    literal past Python's digit limit. It is the model's malformed call, reported like any other."""


def _loads(raw: str) -> Any:
    """``json.loads`` whose every failure is a :class:`json.JSONDecodeError` or :class:`_JsonLimitError`."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise _JsonLimitError("nested too deeply") from None
    except json.JSONDecodeError:
        raise
    except ValueError as err:  # int("9" * 5000): Python's integer-string conversion limit
        raise _JsonLimitError(f"a number is too long ({str(err).split(':')[0]})") from None


def _decode_error(raw: str, err: ValueError, flag_literals: bool) -> str:
    if isinstance(err, _JsonLimitError):
        return f"Invalid tool call JSON: {err}"
    msg = f"Invalid tool call JSON: {err.msg} at character {err.pos}"
    if flag_literals and _PY_LITERAL.search(raw):
        msg += " (use JSON literals true/false/null, not Python's True/False/None)"
    return msg


def parse_xml_json(text: str, *, strict: bool = True, reject_tool_call_with_content: bool = False,
                   flag_python_literals_in_tool_json: bool = False,
                   accept_parameters_as_arguments: bool = False) -> ParseResult:
    """The release's ``xml_json`` parser (see the module docstring)."""
    matches = list(_TOOL_CALL_BLOCK.finditer(text))
    content = _BLANK_LINES.sub("\n", _TOOL_CALL_BLOCK.sub("", text)).strip()
    if not matches:
        if strict and ("<tool_call" in text or "</tool_call>" in text):
            return ParseResult(content=content, errors=[NO_VALID_BLOCK])
        return ParseResult(content=content)
    calls: list[ToolCall] = []
    errors: list[str] = []
    for m in matches:
        raw = m.group(1)
        try:
            obj = _loads(raw)
        except ValueError as e:
            errors.append(_decode_error(raw, e, flag_python_literals_in_tool_json))
            continue
        if not isinstance(obj, dict):
            continue  # the release skips non-object payloads silently
        try:
            calls.append(_call_from_obj(obj, strict=strict, accept_parameters=accept_parameters_as_arguments))
        except ValueError as e:
            errors.append(str(e))
    if reject_tool_call_with_content and content:
        errors.append("text outside the <tool_call> blocks is not allowed when calling tools: "
                      f"{content[:80]!r}")
    return _finish(calls, errors, content, strict)


def _py_call(node: ast.expr) -> ToolCall:
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"each list item must be a call like f(a=1), found {type(node).__name__}")
    name = node.func.id
    if node.args:
        raise ValueError(f"positional arguments are not accepted in {name}(...); name every argument")
    args: dict[str, Any] = {}
    for kw in node.keywords:
        if kw.arg is None:
            raise ValueError(f"'**' unpacking is not accepted in {name}(...)")
        try:
            args[kw.arg] = ast.literal_eval(kw.value)
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            raise ValueError(f"argument {kw.arg!r} of {name}(...) is not a literal") from None
    return ToolCall(name=name, arguments=args)


def _strip_fence(text: str) -> str:
    stripped = text.strip()
    m = _FENCE.match(stripped)
    return m.group(1).strip() if m else stripped


def parse_python_list(text: str, *, strict: bool = True) -> ParseResult:
    """``[f(a=1), g(b='x')]`` (or a single ``f(a=1)``); literal keyword arguments only."""
    body = _strip_fence(text)
    looks_like_call = (body.startswith("[") and body.endswith("]")) or re.fullmatch(r"[A-Za-z_]\w*\(.*\)", body, re.DOTALL)
    if not looks_like_call:
        return ParseResult(content=text.strip())
    try:
        tree = ast.parse(body, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        if body.startswith("[") and "(" not in body:
            return ParseResult(content=text.strip())  # a bracketed remark, not a call list
        return ParseResult(content=text.strip(), errors=[f"Invalid Python tool-call list: {e}"])
    nodes = tree.elts if isinstance(tree, ast.List) else [tree]
    if isinstance(tree, ast.List) and not any(isinstance(n, ast.Call) for n in ast.walk(tree)):
        return ParseResult(content=text.strip())  # e.g. "[1, 2]": no call anywhere, plain text
    calls: list[ToolCall] = []
    errors: list[str] = []
    for node in nodes:
        try:
            calls.append(_py_call(node))
        except ValueError as e:
            errors.append(str(e))
    return _finish(calls, errors, "", strict)


def _json_objects(body: str) -> list[Any]:
    """One JSON value, or one per non-empty line (raises json.JSONDecodeError)."""
    try:
        value = _loads(body)
        return value if isinstance(value, list) else [value]
    except json.JSONDecodeError:
        lines = [ln.strip().rstrip(";") for ln in body.splitlines() if ln.strip()]
        if len(lines) < 2:
            raise
        return [_loads(ln) for ln in lines]


def parse_llama3_json(text: str, *, strict: bool = True, flag_python_literals_in_tool_json: bool = False
                      ) -> ParseResult:
    """Raw JSON tool calls with ``name`` and ``parameters`` (``arguments`` also accepted)."""
    body = _strip_fence(text).removeprefix("<|python_tag|>").strip()
    if not body.startswith(("{", "[")):
        if strict and ("<tool_call" in text or "</tool_call>" in text):
            return ParseResult(content=text.strip(),
                               errors=["<tool_call> tags are not used in this format; reply with a bare JSON "
                                       "object {\"name\": ..., \"parameters\": {...}}"])
        return ParseResult(content=text.strip())
    try:
        objs = _json_objects(body)
    except ValueError as e:
        return ParseResult(content=text.strip(), errors=[_decode_error(body, e, flag_python_literals_in_tool_json)])
    calls: list[ToolCall] = []
    errors: list[str] = []
    for obj in objs:
        if not isinstance(obj, dict):
            continue
        try:
            calls.append(_call_from_obj(obj, strict=strict, accept_parameters=True, names_parameters=True))
        except ValueError as e:
            errors.append(str(e))
    return _finish(calls, errors, "", strict)


def parse_tool_calls(text: str, mode: str = "xml_json", *, strict: bool = True,
                     reject_tool_call_with_content: bool = False,
                     flag_python_literals_in_tool_json: bool = False,
                     accept_parameters_as_arguments: bool = False) -> ParseResult:
    """Parse one assistant message in ``mode`` (``xml_json``, ``python_list`` or ``llama3_json``)."""
    if not isinstance(text, str):
        raise TypeError(f"assistant content must be a string, got {type(text).__name__}")
    mode = resolve_mode(mode)
    if mode == "xml_json":
        return parse_xml_json(text, strict=strict, reject_tool_call_with_content=reject_tool_call_with_content,
                              flag_python_literals_in_tool_json=flag_python_literals_in_tool_json,
                              accept_parameters_as_arguments=accept_parameters_as_arguments)
    if mode == "python_list":
        return parse_python_list(text, strict=strict)
    return parse_llama3_json(text, strict=strict, flag_python_literals_in_tool_json=flag_python_literals_in_tool_json)
