"""Tools as plain Python classes: their JSON docs, and a safe executor of call strings on them.

Each public method of a tool class is one tool (``state`` excepted). Its signature (type hints,
defaults) and docstring (first line: what it does; ``Args:`` lines: ``name: description``) are all
the prompt shows, turned into BFCL-shaped JSON docs by :func:`tool_docs`. ``state()`` returns the
public state the per-turn check compares after every turn.

:class:`ToolBox` holds one episode's instances (or one checker replay's) and runs call strings on
them: each is parsed by :func:`~seal_shared.calls.parse_call`, looked up among the instances'
public methods, checked against the method's type hints and called, into a :class:`ToolResult`.
"""

from __future__ import annotations

import inspect
import json
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from seal_shared.calls import ERROR_PREFIX, CallParseError, parse_call

_JSON_TYPES = {str: "string", int: "integer", float: "float", bool: "boolean", list: "array", dict: "dict"}


@dataclass(frozen=True)
class ToolResult:
    """One call's result.

    Attributes:
        text: what the model sees.
        error: why the call was refused before any tool ran (``parse``, ``unknown``, ``arguments``,
            or an environment's own word); ``None`` when a tool ran.
        tool_error: the tool ran and reported a failure (the environment's declared rule).
    """

    text: str
    error: str | None = None
    tool_error: bool = False

    @property
    def executed(self) -> bool:
        """A tool method ran (the executor did not refuse the call)."""
        return self.error is None

    @property
    def failed(self) -> bool:
        """The call was refused or the tool reported a failure: a tool error for the episode's
        counts and its recovery hints (``tool_feedback_evolution``)."""
        return self.error is not None or self.tool_error


def returns_error_key(value: Any) -> bool:
    """The default tool-error rule: the tool returned an object with an ``error`` key."""
    return isinstance(value, dict) and "error" in value


def public_methods(cls: type) -> dict[str, Any]:
    """The tools of a class: its public methods except ``state`` (name -> function)."""
    return {name: fn for name, fn in inspect.getmembers(cls, inspect.isfunction)
            if not name.startswith("_") and name != "state"}


def _type_ok(value: Any, hint: Any) -> bool:
    """``value`` fits ``hint`` (JSON types and their unions; ``bool`` is not an ``int``)."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    for option in typing.get_args(hint) if union else (hint,):
        base = typing.get_origin(option) or option
        if option is Any or (option is type(None) and value is None):
            return True
        if base is int and isinstance(value, int) and not isinstance(value, bool):
            return True
        if base is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return True
        if base in (str, bool, list, dict) and isinstance(value, base):
            return True
    return False


class ToolBox:
    """The tool instances of one episode (or one checker replay), by name; see the module docstring.

    ``is_error`` is the declared tool-error rule, applied to what a tool method returned.
    """

    def __init__(self, apps: Mapping[str, object], *, is_error: Callable[[Any], bool] = returns_error_key) -> None:
        for name, app in apps.items():
            if not callable(getattr(app, "state", None)):
                raise TypeError(f"tool instance {name!r} ({type(app).__name__}) needs a state() method for the check")
        self.apps = dict(apps)
        self._is_error = is_error
        self._methods = {m: (app, fn) for app in self.apps.values() for m, fn in public_methods(type(app)).items()}

    def state(self) -> dict[str, Any]:
        """Every instance's public state, by name (what the per-turn check compares)."""
        return {name: app.state() for name, app in self.apps.items()}  # type: ignore[attr-defined]

    def run(self, call: str) -> ToolResult:
        """Run one call string such as ``"add_item(text='milk')"``; never raises for a bad call."""
        try:
            parsed = parse_call(call)
        except CallParseError as err:
            return ToolResult(f"{ERROR_PREFIX}{err}", "parse")
        if parsed.name not in self._methods:
            return ToolResult(f"{ERROR_PREFIX}name '{parsed.name}' is not defined", "unknown")
        app, fn = self._methods[parsed.name]
        try:
            bound = inspect.signature(fn).bind(app, *parsed.args, **parsed.kwargs)
        except TypeError as err:
            return ToolResult(f"{ERROR_PREFIX}{parsed.name}(): {err}", "arguments")
        hints = typing.get_type_hints(fn)
        for name, value in list(bound.arguments.items())[1:]:
            if name in hints and not _type_ok(value, hints[name]):
                return ToolResult(f"{ERROR_PREFIX}{parsed.name}(): argument {name!r} must be "
                                  f"{getattr(hints[name], '__name__', hints[name])}, got {type(value).__name__}",
                                  "arguments")
        try:
            value = fn(*bound.args, **bound.kwargs)
        except Exception as err:  # a tool's own bug is the model's tool error, not the service's 500
            return ToolResult(f"{ERROR_PREFIX}{parsed.name}(): {type(err).__name__}: {err}", tool_error=True)
        return ToolResult(json.dumps(value, sort_keys=True, default=str), tool_error=self._is_error(value))


def _json_type(hint: Any) -> str:
    """The JSON type of a parameter annotation (``str | None`` is a string)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    base = typing.get_origin(args[0]) or args[0] if args else typing.get_origin(hint) or hint
    return _JSON_TYPES.get(base, "string")


def _arg_descriptions(doc: str) -> dict[str, str]:
    out: dict[str, str] = {}
    in_args = False
    for line in doc.splitlines():
        text = line.strip()
        if text == "Args:":
            in_args = True
        elif in_args and ":" in text:
            name, _, desc = text.partition(":")
            out[name.strip()] = desc.strip()
    return out


def tool_doc(cls: type, name: str) -> dict[str, Any]:
    """The JSON tool doc of one method (BFCL's shape: name, description, parameters)."""
    fn = public_methods(cls)[name]
    doc = inspect.getdoc(fn) or ""
    descriptions = _arg_descriptions(doc)
    hints = typing.get_type_hints(fn)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for pname, param in inspect.signature(fn).parameters.items():
        if pname == "self":
            continue
        prop: dict[str, Any] = {"type": _json_type(hints.get(pname, str)), "description": descriptions.get(pname, "")}
        if param.default is inspect.Parameter.empty:
            required.append(pname)
        else:
            prop["default"] = param.default
        properties[pname] = prop
    first_line = doc.splitlines()[0] if doc else name
    return {"name": name, "description": f"This tool belongs to the {cls.__name__}. {first_line}",
            "parameters": {"type": "dict", "properties": properties, "required": required}}


def tool_docs(classes: Iterable[type]) -> list[dict[str, Any]]:
    """The docs of every tool of ``classes``, in class order, then method name order."""
    return [tool_doc(cls, name) for cls in classes for name in public_methods(cls)]
