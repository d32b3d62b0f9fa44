"""Safe execution of BFCL tool-call strings on one episode's own backend instances.

BFCL's ``execute_multi_turn_func_call`` ``eval``s call strings in its module globals and caches
instances there; this module keeps BFCL's observable behaviour (instances, result strings,
error strings) without either:

* Instances: BFCL's 8 multi-turn classes, created as BFCL creates them (``cls()``, then
  ``_load_scenario(deepcopy(initial_config.get(name, {})), long_context=...)`` unless the class
  is stateless), owned by one :class:`Executor` and reachable from nowhere else.
* Calls are parsed by the kit's call parser (:func:`seal_shared.calls.parse_call`: exactly one
  call of a bare, public name, with literal arguments only; negative numbers allowed). The
  method is looked up in this executor's table (public methods of its instances) and called with
  the parsed positional and keyword values, so Python itself maps positional arguments to
  parameters and raises the same ``TypeError`` text BFCL's ``eval`` would. Nothing is ever
  ``eval``-ed or ``exec``-ed.
* Result strings follow BFCL: ``str`` as is; an exact ``dict`` through ``json.dumps`` (default
  arguments, ``str()`` if that raises); anything else ``str()``; any failure
  ``"Error during execution: <message>"``. BFCL's blocked names (kill, exit, ...) give BFCL's
  message; a name that is not a method of this episode gives Python's ``NameError`` text, as
  BFCL's ``eval`` does.
* Limits: call strings longer than ``max_call_chars`` and integer literals beyond
  ``max_int_abs`` are refused; each call gets a wall-clock budget (``call_timeout_s``) on any
  thread, and the arguments that would make a BFCL function run unbounded C code are refused
  before the call (:mod:`env_service.bfcl.limits`). The service's worker watchdog stays as the
  last resort for anything else.
* Shared module data: ``VehicleControlAPI.get_outside_temperature_from_google`` (long-context
  mode) writes into and returns the module-level ``LONG_WEATHER_EXTENSION`` dict, and
  ``MathAPI.logarithm`` sets mpmath's global precision before computing. Calls of these methods
  run, and their results are turned into strings, under one process-wide lock, so concurrent
  episodes in threads cannot see each other's values.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json
import threading
from dataclasses import dataclass
from typing import Any

from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING, STATELESS_CLASSES

from env_service.bfcl.limits import CallTimeout, argument_problem, has_argument_checks, time_budget
from seal_shared.calls import DEFAULT_MAX_CALL_CHARS, DEFAULT_MAX_INT_ABS, ERROR_PREFIX, CallParseError, parse_call

MULTI_TURN_CLASSES: tuple[str, ...] = ("GorillaFileSystem", "MathAPI", "MessageAPI", "TwitterAPI", "TicketAPI",
                                        "TradingBot", "TravelAPI", "VehicleControlAPI")
BLOCKED_NAMES: frozenset[str] = frozenset({"kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run"})
DEFAULT_CALL_TIMEOUT_S = 2.0
# Refusals: calls the executor refuses before any backend method runs. BFCL's runner returns a step's
# instances only when the step executed, so a turn whose every call was refused has none to compare
# (``instance_mismatch``). A method that raised or ran out of time did execute.
REFUSED_KINDS = frozenset({"parse", "blocked", "unknown", "limit"})

# (class, method) pairs that touch module-level state; see the module docstring.
_SHARED_STATE_METHODS: frozenset[tuple[str, str]] = frozenset({
    ("VehicleControlAPI", "get_outside_temperature_from_google"), ("MathAPI", "logarithm")})
_SHARED_STATE_LOCK = threading.Lock()


@dataclass(frozen=True)
class CallResult:
    """One executed call: the BFCL result string and, on failure, what kind of failure it was."""

    text: str
    error: str | None = None  # None | "parse" | "blocked" | "unknown" | "limit" | "timeout" | "exception"


def format_result(value: Any) -> str:
    """BFCL's result-string rule (``multi_turn_utils.execute_multi_turn_func_call``)."""
    if type(value) is str:
        return value
    if type(value) is dict:
        try:
            return json.dumps(value)
        except (TypeError, ValueError, OverflowError, RecursionError):
            return str(value)
    return str(value)


def backend_class(class_name: str) -> type:
    """The BFCL backend class for ``class_name`` (one of the 8 multi-turn classes)."""
    if class_name not in MULTI_TURN_CLASSES:
        raise KeyError(f"unknown BFCL multi-turn class {class_name!r}; expected one of {', '.join(MULTI_TURN_CLASSES)}")
    return getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name]), class_name)


class Executor:
    """One episode's backend instances, method table and call execution."""

    def __init__(self, involved_classes: list[str] | tuple[str, ...], initial_config: dict[str, Any],
                 long_context: bool, *, call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
                 max_call_chars: int = DEFAULT_MAX_CALL_CHARS, max_int_abs: int = DEFAULT_MAX_INT_ABS):
        self.call_timeout_s = call_timeout_s
        self.max_call_chars = max_call_chars
        self.max_int_abs = max_int_abs
        # Insertion order = involved_classes order, as BFCL's instance dict (the state checker
        # reports the first mismatching class in this order).
        self.instances: dict[str, Any] = {}
        self._methods: dict[str, tuple[str, Any]] = {}
        for class_name in involved_classes:
            instance = backend_class(class_name)()
            if class_name not in STATELESS_CLASSES:
                instance._load_scenario(copy.deepcopy(initial_config.get(class_name, {})),
                                        long_context=long_context)
            self.instances[class_name] = instance
            for method_name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
                if not method_name.startswith("_"):
                    self._methods[method_name] = (class_name, method)

    @property
    def method_names(self) -> list[str]:
        return sorted(self._methods)

    def execute(self, calls: list[str]) -> list[str]:
        """Execute ``calls`` in order; one BFCL result string per call."""
        return [self.run_one(c).text for c in calls]

    def run(self, calls: list[str]) -> list[CallResult]:
        """Like :meth:`execute`, also telling how each call failed (if it did)."""
        return [self.run_one(c) for c in calls]

    def run_one(self, call: str) -> CallResult:
        try:
            parsed = parse_call(call, max_call_chars=self.max_call_chars, max_int_abs=self.max_int_abs)
        except CallParseError as e:
            return CallResult(ERROR_PREFIX + str(e), "parse")
        if parsed.name in BLOCKED_NAMES:
            return CallResult(f"{ERROR_PREFIX}Function call {parsed.name} is not allowed.", "blocked")
        entry = self._methods.get(parsed.name)
        if entry is None:
            return CallResult(f"{ERROR_PREFIX}name '{parsed.name}' is not defined", "unknown")
        class_name, method = entry
        if has_argument_checks(class_name, parsed.name):
            try:
                problem = argument_problem(class_name, parsed.name, parsed.bind(method))
            except TypeError:
                problem = None  # a bad signature fails in the call itself, with Python's own message
            if problem:
                return CallResult(f"{ERROR_PREFIX}{problem}", "limit")
        try:
            with time_budget(self.call_timeout_s):
                if (class_name, parsed.name) in _SHARED_STATE_METHODS:
                    with _SHARED_STATE_LOCK:
                        return CallResult(format_result(method(*parsed.args, **parsed.kwargs)))
                return CallResult(format_result(method(*parsed.args, **parsed.kwargs)))
        except CallTimeout:
            return CallResult(f"{ERROR_PREFIX}call exceeded its time budget of {self.call_timeout_s:g} s", "timeout")
        except Exception as e:  # noqa: BLE001 - BFCL turns every execution failure into its result string
            return CallResult(ERROR_PREFIX + str(e), "exception")
