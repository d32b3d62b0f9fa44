"""Call strings: ``name(k=literal, ...)``, the form tool calls take everywhere after parsing, so the calls
a model made can be replayed, checked and exported as text. :func:`parse_call` reads one (with
:mod:`ast`, never ``eval``); :func:`call_to_string` writes one.
"""

from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass, field
from typing import Any

# The prefix of every result text of a call that failed to run (BFCL's, which the kit keeps).
ERROR_PREFIX = "Error during execution: "
DEFAULT_MAX_CALL_CHARS = 32_768
DEFAULT_MAX_INT_ABS = 2**53  # the JSON-safe integer range

_LITERAL_NODES = (ast.Constant, ast.List, ast.Tuple, ast.Set, ast.Dict, ast.Load, ast.USub, ast.UAdd)


class CallParseError(ValueError):
    """A call string is not a single literal-argument call of a bare public name."""


@dataclass(frozen=True)
class ParsedCall:
    """A parsed call: ``name(*args, **kwargs)`` with literal values only."""

    name: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def bind(self, func: Any) -> dict[str, Any]:
        """Map positional arguments to parameter names as Python would (``inspect.signature().bind``)."""
        return dict(inspect.signature(func).bind(*self.args, **self.kwargs).arguments)


def _check_literal(node: ast.AST, max_int_abs: int) -> None:
    for sub in ast.walk(node):
        if isinstance(sub, ast.UnaryOp):
            if not isinstance(sub.op, (ast.USub, ast.UAdd)) or not isinstance(sub.operand, ast.Constant) \
                    or type(sub.operand.value) not in (int, float):
                raise CallParseError("only literal arguments are allowed (a sign may precede a number only)")
            continue
        if not isinstance(sub, _LITERAL_NODES):
            raise CallParseError(f"only literal arguments are allowed, found {type(sub).__name__}")
        if isinstance(sub, ast.Constant) and type(sub.value) is int and abs(sub.value) > max_int_abs:
            raise CallParseError(f"integer literal too large (limit {max_int_abs})")


def parse_call(text: str, *, max_call_chars: int = DEFAULT_MAX_CALL_CHARS,
               max_int_abs: int = DEFAULT_MAX_INT_ABS) -> ParsedCall:
    """Parse one call string such as ``"cd(folder='docs')"`` or ``"sort('a.txt')"``.

    Raises :class:`CallParseError` unless the text is exactly one call of a bare name that does
    not start with an underscore, whose arguments (positional or keyword, no ``*``/``**``) are
    literals. Syntax errors read like ``eval``'s (``"... (<string>, line 1)"``).
    """
    if not isinstance(text, str):
        raise CallParseError(f"a call must be a string, got {type(text).__name__}")
    if len(text) > max_call_chars:
        raise CallParseError(f"call string too long ({len(text)} characters, limit {max_call_chars})")
    try:
        # BFCL evaluates the call text, which ignores leading spaces and tabs; strip them the same way.
        tree = ast.parse(text.lstrip(" \t"), filename="<string>", mode="eval")
    except SyntaxError as e:
        raise CallParseError(str(e)) from None
    except (RecursionError, MemoryError, ValueError) as e:
        raise CallParseError(f"cannot parse call: {type(e).__name__}") from None
    call = tree.body
    if not isinstance(call, ast.Call):
        raise CallParseError(f"expected a function call, found {type(call).__name__}")
    if not isinstance(call.func, ast.Name):
        raise CallParseError(f"the called object must be a bare function name, found {type(call.func).__name__}")
    name = call.func.id
    if name.startswith("_"):
        raise CallParseError(f"function names starting with '_' are not callable: {name!r}")
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for node in call.args:
        if isinstance(node, ast.Starred):
            raise CallParseError("'*' argument unpacking is not allowed")
        _check_literal(node, max_int_abs)
        args.append(ast.literal_eval(node))
    for kw in call.keywords:
        if kw.arg is None:
            raise CallParseError("'**' argument unpacking is not allowed")
        _check_literal(kw.value, max_int_abs)
        kwargs[kw.arg] = ast.literal_eval(kw.value)
    return ParsedCall(name=name, args=tuple(args), kwargs=kwargs)


def call_to_string(name: str, arguments: dict[str, Any]) -> str:
    """A tool call as a call string, ``name(k=repr(v), ...)`` (BFCL's FC decoding)."""
    return f"{name}(" + ", ".join(f"{k}={v!r}" for k, v in arguments.items()) + ")"
