"""The ``notes`` checker: BFCL's evaluation shape for the notes tasks, one pass on fresh apps.

:class:`World` holds one episode's app instances and runs call strings on them: each string is
parsed by the project's safe call parser (:func:`env_service.bfcl.executor.parse_call`, literal
arguments only, never ``eval``), looked up among the public methods of the task's apps, checked
against the method's type hints and called. Results are JSON text, as the model sees them.

:func:`check_episode` replays the model's accepted calls and the ground truth on two fresh worlds,
turn by turn, and answers what the BFCL checker answers (``valid``, ``error_type``, one failure tag
per ground-truth turn from :func:`seal.diagnosis.tagging.tag_turn`, turn counts and progress):

* a turn with ground-truth calls fails when the model made none (``empty_turn_model_response``),
  when the apps' public state differs from the ground truth's afterwards (``state_mismatch``), or
  when a ground-truth result is missing from the model's results so far (``response_mismatch``);
* a turn whose right move is to make no call fails only when the model's calls changed the state
  (stricter than BFCL, which never judges such a turn; here an abstention turn can end a task);
* a model turn count different from the ground truth's is ``multi_turn:force_terminated``.
"""

from __future__ import annotations

import inspect
import json
import types
import typing
from dataclasses import dataclass
from typing import Any

from env_service.bfcl.executor import CallParseError, parse_call
from env_service.notes.tools import TOOL_CLASSES, public_methods
from seal.diagnosis.tagging import tag_turn
from seal.types import FailureTag, TurnDiagnosis

FORCE_TERMINATED = "multi_turn:force_terminated"
EMPTY_TURN = "multi_turn:empty_turn_model_response"
STATE_MISMATCH = "multi_turn:instance_state_mismatch"
RESPONSE_MISMATCH = "multi_turn:execution_response_mismatch"
ERROR_PREFIX = "Error during execution: "
# Calls refused before any app method ran (they leave the turn without an executed call).
NOT_EXECUTED = frozenset({"parse", "unknown", "arguments"})


@dataclass(frozen=True)
class CallResult:
    text: str
    error: str | None = None  # None | "parse" | "unknown" | "arguments"


def _type_ok(value: Any, hint: Any) -> bool:
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    for option in options:
        if option is type(None) and value is None:
            return True
        if option is int and isinstance(value, int) and not isinstance(value, bool):
            return True
        if option in (str, bool) and isinstance(value, option):
            return True
        if option is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return True
    return False


class World:
    """The app instances of one episode (or one checker replay), built from the task's state."""

    def __init__(self, classes: list[str], initial_state: dict[str, dict[str, Any]]) -> None:
        self.apps = {name: TOOL_CLASSES[name](**json.loads(json.dumps(initial_state.get(name, {}))))
                     for name in classes}
        self._methods = {m: (app, fn) for app in self.apps.values() for m, fn in public_methods(type(app)).items()}

    def state(self) -> dict[str, Any]:
        return {name: app.state() for name, app in self.apps.items()}

    def run(self, call: str) -> CallResult:
        try:
            parsed = parse_call(call)
        except CallParseError as err:
            return CallResult(f"{ERROR_PREFIX}{err}", "parse")
        if parsed.name not in self._methods:
            return CallResult(f"{ERROR_PREFIX}name '{parsed.name}' is not defined", "unknown")
        app, fn = self._methods[parsed.name]
        try:
            bound = inspect.signature(fn).bind(app, *parsed.args, **parsed.kwargs)
        except TypeError as err:
            return CallResult(f"{ERROR_PREFIX}{parsed.name}(): {err}", "arguments")
        hints = typing.get_type_hints(fn)
        for name, value in list(bound.arguments.items())[1:]:
            if not _type_ok(value, hints[name]):
                return CallResult(f"{ERROR_PREFIX}{parsed.name}(): argument {name!r} must be "
                                  f"{getattr(hints[name], '__name__', hints[name])}, got {type(value).__name__}",
                                  "arguments")
        return CallResult(json.dumps(fn(*bound.args, **bound.kwargs), sort_keys=True))


def _judge(gt_calls: list[str], model_called: bool, state_valid: bool,
           response_valid: bool | None, k: int) -> tuple[str, str] | None:
    if gt_calls and not model_called:
        return EMPTY_TURN, f"Model response list is empty for turn {k}"
    if not state_valid:
        return STATE_MISMATCH, f"Model instance state does not match the ground truth after turn {k}"
    if response_valid is False:
        return RESPONSE_MISMATCH, f"A ground-truth result of turn {k} is missing from the model's results"
    return None


def check_episode(model_turns: list[list[list[str]]], task: Any) -> dict[str, Any]:
    """Judge one episode: ``model_turns`` is turn -> step -> call strings; ``task`` a NotesTask."""
    model_world, gt_world = World(task.classes, task.initial_state), World(task.classes, task.initial_state)
    terminated_early = len(model_turns) != len(task.gt_turns)
    verdict: tuple[str, str] | None = None
    if terminated_early:
        verdict = (FORCE_TERMINATED, f"The model played {len(model_turns)} turns of {len(task.gt_turns)}.")
    failed_turn: int | None = None
    model_results: list[str] = []
    turns: list[TurnDiagnosis] = []
    for k, gt_calls in enumerate(task.gt_turns):
        steps = model_turns[k] if k < len(model_turns) else []
        runs = [model_world.run(call) for step in steps for call in step]
        model_results.extend(r.text for r in runs)
        gt_runs = [gt_world.run(call) for call in gt_calls]
        gt_error = any(r.error is not None for r in gt_runs)
        model_called = bool(runs)
        state_valid = model_world.state() == gt_world.state()
        response_valid = None
        if gt_calls and model_called:
            response_valid = all(r.text in model_results for r in gt_runs)
        if verdict is None and (gt_calls or model_called):
            verdict = _judge(gt_calls, model_called, state_valid, response_valid, k)
            failed_turn = k if verdict is not None else None
        tag = tag_turn(gt_error=gt_error, gt_empty=not gt_calls, model_called=model_called,
                       model_empty=not model_called, instances_match=True,
                       model_executed=any(r.error not in NOT_EXECUTED for r in runs),
                       state_valid=state_valid if gt_calls and model_called else None,
                       response_valid=response_valid)
        errors = tuple(r.text for r in runs if r.error is not None)
        turns.append(TurnDiagnosis(index=k, tag=tag,
                                   valid=None if not gt_calls and not gt_error else tag == FailureTag.PASS,
                                   irrelevance=(not model_called) if not gt_calls else None, errors=errors))
    return summarise(turns, verdict, failed_turn, terminated_early)


def summarise(turns: list[TurnDiagnosis], verdict: tuple[str, str] | None, failed_turn: int | None,
              terminated_early: bool) -> dict[str, Any]:
    """The evaluation dict, with the keys (and meanings) of the BFCL checker's."""
    passed = sum(1 for t in turns if t.valid is True)
    scorable = sum(1 for t in turns if t.valid is not None)
    irr = sum(1 for t in turns if t.irrelevance is not None)
    passed_irr = sum(1 for t in turns if t.irrelevance is True)
    return {
        "valid": verdict is None,
        "accuracy": 1.0 if verdict is None else 0.0,
        "error_type": None if verdict is None else verdict[0],
        "error_message": None if verdict is None else verdict[1],
        "failed_turn": failed_turn,
        "failure_tags": [str(t.tag) for t in turns],
        "per_turn_valid": [t.valid for t in turns],
        "irrelevance_per_turn": [t.irrelevance for t in turns],
        "turns": [{"index": t.index, "tag": str(t.tag), "valid": t.valid, "irrelevance": t.irrelevance,
                   "errors": list(t.errors)} for t in turns],
        "passed_turns": passed,
        "scorable_turns": scorable,
        "irrelevance_turns": irr,
        "passed_irrelevance_turns": passed_irr,
        "progress": passed / scorable if scorable else 0.0,
        "progress_with_irrelevance": (passed + passed_irr) / (scorable + irr) if scorable + irr else 0.0,
        "terminated_early": terminated_early,
        "details": {},
    }
