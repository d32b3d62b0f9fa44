"""Turning assistant text into tool calls, one parser per tool-call format (``tool_call_parser``):
``xml_json`` (default), ``python_list`` and ``llama3_json``, each described by its ``parse_*`` function.
Nothing is ever evaluated: Python syntax is read with :mod:`ast` and literals only.

In strict mode any error rejects *all* calls of the message. Every mode returns a
:class:`ParseResult`; a message without any tool-call syntax is plain text (no calls, no error),
which the episode takes as "advance to the next user turn".
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
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((v, depth + 1) for v in children)
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
    if not isinstance(err, json.JSONDecodeError):
        return f"Invalid tool call JSON: {err}"
    msg = f"Invalid tool call JSON: {err.msg} at character {err.pos}"
    if flag_literals and _PY_LITERAL.search(raw):
        msg += " (use JSON literals true/false/null, not Python's True/False/None)"
    return msg


def parse_xml_json(text: str, *, strict: bool = True, reject_tool_call_with_content: bool = False,
                   flag_python_literals_in_tool_json: bool = False,
                   accept_parameters_as_arguments: bool = False) -> ParseResult:
    """The release's strict Qwen mode: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks."""
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
    if _nested_deeper_than(args, MAX_ARGUMENT_DEPTH):
        raise ValueError(f"the arguments of {name}(...) are nested deeper than {MAX_ARGUMENT_DEPTH} levels")
    return ToolCall(name=name, arguments=args)


def _strip_fence(text: str) -> str:
    stripped = text.strip()
    m = _FENCE.match(stripped)
    return m.group(1).strip() if m else stripped


def _bracket_spans(text: str) -> list[tuple[int, int]]:
    """Top-level ``[...]`` spans that contain a parenthesis (quotes respected): the candidate call
    lists of a message, wherever they sit in its text."""
    spans: list[tuple[int, int]] = []
    depth, start, quote, escaped = 0, -1, "", False
    for i, ch in enumerate(text):
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "[":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "]" and depth:
            depth -= 1
            if depth == 0 and "(" in text[start:i] and ")" in text[start:i]:
                spans.append((start, i + 1))
    return spans


def _calls_of_list(snippet: str) -> tuple[list[ToolCall], list[str]]:
    try:
        tree = ast.parse(snippet, mode="eval").body
    except SyntaxError as e:
        return [], [f"Invalid Python function-call list: {e.msg}"]
    except (ValueError, RecursionError, MemoryError) as e:
        return [], [f"Invalid Python function-call list: {type(e).__name__}"]
    nodes = tree.elts if isinstance(tree, (ast.List, ast.Tuple)) else [tree]
    calls: list[ToolCall] = []
    errors: list[str] = []
    for node in nodes:
        try:
            calls.append(_py_call(node))
        except ValueError as e:
            errors.append(str(e))
    return calls, errors


_JSON_LIST_START = re.compile(r"^\[\s*\{")
_BARE_CALL = re.compile(r"^[A-Za-z_][\w.]*\s*\(.*\)$", re.DOTALL)
_UNQUOTED_NAME = re.compile(r'("name"\s*:\s*)([A-Za-z_][\w.]*)(\s*[,}])')
NOT_A_CALL_LIST = "expected a Python function-call list such as [tool_name(arg='value')]"


def parse_python_list(text: str, *, strict: bool = True) -> ParseResult:
    """The release's ``toolace_fc`` parser: ``[f(a=1), g(b='x')]`` anywhere in the message (text
    around it is the content), or a bare ``f(a=1)``; literal keyword arguments only. JSON call
    objects (``{"name": ..., "parameters": ...}``, or a list of them) are accepted as well."""
    body = _strip_fence(text)
    if body.startswith("{") or _JSON_LIST_START.match(body):
        return _json_fallback(body, strict=strict)
    spans = _bracket_spans(body)
    if not spans:
        if "<tool_call" in body or "</tool_call>" in body:
            errors = [f"<tool_call> tags are not used in this format; {NOT_A_CALL_LIST}"] if strict else []
            return ParseResult(content=body, errors=errors)
        if _BARE_CALL.match(body):
            spans = [(0, len(body))]
        elif body.startswith("[") or body.endswith("]"):
            return ParseResult(content=body, errors=[f"Invalid Python function-call list: {NOT_A_CALL_LIST}"])
        else:
            return ParseResult(content=text.strip())
    calls: list[ToolCall] = []
    errors: list[str] = []
    for start, end in spans:
        found, problems = _calls_of_list(body[start:end])
        calls += found
        errors += problems
    content = body
    for start, end in reversed(spans):
        content = content[:start] + content[end:]
    return _finish(calls, errors, re.sub(r"\n\s*\n", "\n\n", content).strip(), strict)


def _json_fallback(body: str, *, strict: bool) -> ParseResult:
    try:
        objs = _json_or_literal_objects(body)
    except ValueError:
        try:  # {"name": ls, ...}: a bare function name where a JSON string belongs
            objs = _json_or_literal_objects(_UNQUOTED_NAME.sub(r'\1"\2"\3', body))
        except ValueError as e:
            return ParseResult(content=body, errors=[f"Invalid tool call JSON: {e}"])
    return _calls_from_objects(objs, strict=strict)


def _json_or_literal_objects(body: str) -> list[Any]:
    """One JSON (or Python-literal) value, one per line, or ``;``-separated; a list is its items."""
    for parts in (None, body.splitlines(), body.split(";")):
        pieces = [body] if parts is None else [p.strip().rstrip(",;") for p in parts if p.strip()]
        if parts is not None and len(pieces) < 2:
            continue
        try:
            values = [_json_or_literal(p) for p in pieces]
        except ValueError:
            continue
        return values[0] if parts is None and isinstance(values[0], list) else values
    raise ValueError("expected a JSON function call such as {\"name\": ..., \"parameters\": {...}}")


def _json_or_literal(raw: str) -> Any:
    """``json.loads``, then ``ast.literal_eval`` (Python's True/None spellings); never ``eval``."""
    try:
        return _loads(raw)
    except ValueError:
        try:
            return ast.literal_eval(raw)
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            raise ValueError("not a JSON or Python literal") from None


def _calls_from_objects(objs: list[Any], *, strict: bool) -> ParseResult:
    calls: list[ToolCall] = []
    errors: list[str] = []
    for obj in objs:
        if not isinstance(obj, dict):
            errors.append(f"each function call must be a JSON object, got {type(obj).__name__}")
            continue
        if "name" not in obj and isinstance(obj.get("function"), str):
            obj = {**obj, "name": obj["function"]}
        try:
            calls.append(_call_from_obj(obj, strict=strict, accept_parameters=True, names_parameters=True))
        except ValueError as e:
            errors.append(str(e))
    return _finish(calls, errors, "", strict)


def parse_llama3_json(text: str, *, strict: bool = True, flag_python_literals_in_tool_json: bool = False
                      ) -> ParseResult:
    """The release's ``llama31_official_fc`` parser: raw JSON calls with ``name`` and ``parameters``
    (``arguments`` also accepted): one object, a list, one per line, or ``;``-separated. Python literal
    spellings (``True``/``None``) are read with ``ast.literal_eval``."""
    body = _strip_fence(text).replace("<|python_tag|>", "").strip()
    if "<tool_call" in body or "</tool_call>" in body:
        errors = ["<tool_call> tags are not used in this format; reply with a bare JSON object "
                  "{\"name\": ..., \"parameters\": {...}}"] if strict else []
        return ParseResult(content=text.strip(), errors=errors)
    if not body.startswith(("{", "[")):
        return ParseResult(content=text.strip())
    try:
        objs = _json_or_literal_objects(body)
    except ValueError as e:
        try:
            _loads(body)
        except ValueError as json_err:  # the JSON decoder's reason names the character at fault
            e = json_err
        return ParseResult(content=text.strip(), errors=[_decode_error(body, e, flag_python_literals_in_tool_json)])
    return _calls_from_objects(objs, strict=strict)


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
