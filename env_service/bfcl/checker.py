"""BFCL's multi-turn verdict plus one failure tag per ground-truth turn, in one pass.

``check_episode(model_turns, gt_turns, entry)`` replays the model's accepted calls and the
ground truth on **fresh** backend instances (two :class:`~env_service.bfcl.executor.Executor`
objects made for this call only) and, turn by turn:

* reproduces ``bfcl_eval``'s ``multi_turn_checker`` exactly: the empty-turn rule, the state
  check (its pure ``state_checker``) and the cumulative unordered response check (its pure
  ``response_checker``), stopping *judging* at the first failure; a model turn count different
  from the ground truth's is ``multi_turn:force_terminated``, as BFCL's eval runner rules before
  checking;
* keeps going after the first failure, on the model's own accumulated state (missing model turns
  count as empty), gathers each ground-truth turn's :class:`seal_shared.tags.TurnEvidence` and tags the
  turn with the registered tag rules (:func:`seal_shared.tags.classify_turn`).

Both the verdict and the tags come from the same single pass on instances created for it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import response_checker, state_checker
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import is_empty_execute_response

from env_service.bfcl.executor import DEFAULT_CALL_TIMEOUT_S, Executor
from env_service.bfcl.tasks import is_long_context
from seal_shared.tags import TurnEvidence, classify_turn
from seal_shared.types import TurnDiagnosis

logger = logging.getLogger(__name__)

FORCE_TERMINATED = "multi_turn:force_terminated"
EMPTY_TURN = "multi_turn:empty_turn_model_response"
CHECKER_ERROR = "multi_turn:checker_error"  # not a BFCL type: a checker function itself raised
_GT_ERROR_KINDS = frozenset({"parse", "blocked", "unknown"})
# Calls the executor refuses before any backend method runs. BFCL's runner returns a step's
# instances only when the step executed; a turn whose every call was refused has none to compare
# (``instance_mismatch``). A method that raised or ran out of time did execute.
_NOT_EXECUTED_KINDS = frozenset({"parse", "blocked", "unknown", "limit"})
_MAX_DETAIL_CHARS = 500


@dataclass
class EpisodeCheck:
    """BFCL's verdict for one episode plus the per-turn diagnosis (all fields JSON-safe via ``to_dict``)."""

    valid: bool
    error_type: str | None
    error_message: str | None
    tags: list[str]
    turns: list[TurnDiagnosis]
    passed_turns: int
    scorable_turns: int
    irrelevance_turns: int
    passed_irrelevance_turns: int
    progress: float
    progress_with_irrelevance: float
    terminated_early: bool
    failed_turn: int | None = None  # the turn BFCL's verdict failed on (None: valid or force-terminated)
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def per_turn_valid(self) -> list[bool | None]:
        return [t.valid for t in self.turns]

    @property
    def irrelevance_per_turn(self) -> list[bool | None]:
        return [t.irrelevance for t in self.turns]

    @property
    def accuracy(self) -> float:
        return 1.0 if self.valid else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "accuracy": self.accuracy,
            "error_type": self.error_type,
            "error_message": self.error_message,
            "failed_turn": self.failed_turn,
            "failure_tags": [str(t) for t in self.tags],
            "per_turn_valid": self.per_turn_valid,
            "irrelevance_per_turn": self.irrelevance_per_turn,
            "turns": [{"index": t.index, "tag": str(t.tag), "valid": t.valid,
                       "irrelevance": t.irrelevance, "errors": list(t.errors)} for t in self.turns],
            "passed_turns": self.passed_turns,
            "scorable_turns": self.scorable_turns,
            "irrelevance_turns": self.irrelevance_turns,
            "passed_irrelevance_turns": self.passed_irrelevance_turns,
            "progress": self.progress,
            "progress_with_irrelevance": self.progress_with_irrelevance,
            "terminated_early": self.terminated_early,
            "details": self.details,
        }


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_DETAIL_CHARS else text[:_MAX_DETAIL_CHARS] + "...[truncated]"


@dataclass
class _TurnOutcome:
    """What one turn's checks found (``None`` validity: that checker raised or did not run)."""

    state: dict[str, Any] | None = None
    response: dict[str, Any] | None = None
    errors: list[str] = field(default_factory=list)


def _run_checks(model_ex: Executor, gt_ex: Executor, all_model_results: list[str],
                gt_results: list[str], turn: int) -> _TurnOutcome:
    out = _TurnOutcome()
    try:
        out.state = state_checker(model_ex.instances, gt_ex.instances)
    except Exception as e:  # noqa: BLE001 - a raising checker is a diagnosis (checker_error), not a crash
        out.errors.append(f"state checker raised {type(e).__name__}: {e}")
        return out
    if not out.state["valid"]:
        out.errors.append(out.state["error_message"])
    try:
        out.response = response_checker(all_model_results, gt_results, turn)
    except Exception as e:  # noqa: BLE001 - as above
        out.errors.append(f"response checker raised {type(e).__name__}: {e}")
        return out
    if not out.response["valid"]:
        out.errors.append(out.response["error_message"])
    return out


def _verdict_of(outcome: _TurnOutcome) -> tuple[str, str, dict[str, Any]] | None:
    """BFCL's failure for a judged turn: state first, then response; None if both pass."""
    if outcome.state is None:
        return CHECKER_ERROR, outcome.errors[-1], {}
    if not outcome.state["valid"]:
        diffs = sorted(outcome.state.get("details", {}).get("differences", {}))
        return outcome.state["error_type"], outcome.state["error_message"], {"differences": diffs}
    if outcome.response is None:
        return CHECKER_ERROR, outcome.errors[-1], {}
    if not outcome.response["valid"]:
        missing = outcome.response.get("details", {}).get("missing_items", [])
        return (outcome.response["error_type"], outcome.response["error_message"],
                {"missing_items": [_clip(str(m)) for m in missing]})
    return None


def check_episode(model_turns: list[list[list[str]]], gt_turns: list[list[str]], entry: dict[str, Any],
                  *, call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S) -> EpisodeCheck:
    """Judge one episode. ``model_turns``: turn -> step -> call strings."""
    long_context = is_long_context(entry["id"])
    classes, config = entry["involved_classes"], entry["initial_config"]
    model_ex = Executor(classes, config, long_context, call_timeout_s=call_timeout_s)
    gt_ex = Executor(classes, config, long_context, call_timeout_s=call_timeout_s)

    terminated_early = len(model_turns) != len(gt_turns)
    verdict: tuple[str, str, dict[str, Any]] | None = None
    failed_turn: int | None = None
    if terminated_early:
        verdict = (FORCE_TERMINATED,
                   f"Model was force-terminated during inference phase. The length of the model result turns "
                   f"({len(model_turns)}) does not match the length of the ground truth turns ({len(gt_turns)}).",
                   {})

    all_model_results: list[str] = []
    turns: list[TurnDiagnosis] = []
    for k, gt_calls in enumerate(gt_turns):
        steps = model_turns[k] if k < len(model_turns) else []
        model_executed = False
        turn_results: list[str] = []
        for step in steps:
            step_run = model_ex.run(step)
            turn_results.extend(r.text for r in step_run)
            model_executed |= any(r.error not in _NOT_EXECUTED_KINDS for r in step_run)
        all_model_results.extend(turn_results)
        gt_run = gt_ex.run(gt_calls)
        gt_results = [r.text for r in gt_run]
        gt_error = any(r.error in _GT_ERROR_KINDS for r in gt_run)
        model_empty = not steps or is_empty_execute_response(steps)
        model_called = any(len(s) > 0 for s in steps)

        outcome = _TurnOutcome()
        if gt_calls and not model_empty:
            outcome = _run_checks(model_ex, gt_ex, all_model_results, gt_results, k)
        if gt_error:
            outcome.errors.insert(0, "ground-truth calls failed to execute: "
                                  + "; ".join(_clip(r.text) for r in gt_run if r.error in _GT_ERROR_KINDS))
        if verdict is None and gt_calls:
            if model_empty:
                verdict = (EMPTY_TURN, f"Model response list is empty for turn {k}", {})
            else:
                verdict = _verdict_of(outcome)
            if verdict is not None:
                failed_turn = k

        evidence = TurnEvidence(
            gt_error=gt_error, gt_empty=not gt_calls, model_called=model_called, model_empty=model_empty,
            instances_match=bool(gt_ex.instances) and set(model_ex.instances) == set(gt_ex.instances),
            model_executed=model_executed,
            state_valid=None if outcome.state is None else outcome.state["valid"],
            response_valid=None if outcome.response is None else outcome.response["valid"],
            model_calls=tuple(c for s in steps for c in s), gt_calls=tuple(gt_calls),
            model_results=tuple(turn_results),
        )
        tag = classify_turn(evidence)
        valid: bool | None = None if not gt_calls and not gt_error else evidence.passed
        irrelevance = (not model_called) if not gt_calls else None
        turns.append(TurnDiagnosis(index=k, tag=tag, valid=valid, irrelevance=irrelevance,
                                   errors=tuple(_clip(e) for e in outcome.errors)))
    return _summarise(turns, verdict, failed_turn, terminated_early)


def _summarise(turns: list[TurnDiagnosis], verdict: tuple[str, str, dict[str, Any]] | None,
               failed_turn: int | None, terminated_early: bool) -> EpisodeCheck:
    passed = sum(1 for t in turns if t.valid is True)
    scorable = sum(1 for t in turns if t.valid is not None)
    irr = sum(1 for t in turns if t.irrelevance is not None)
    passed_irr = sum(1 for t in turns if t.irrelevance is True)
    denom = scorable + irr
    return EpisodeCheck(
        valid=verdict is None,
        error_type=None if verdict is None else verdict[0],
        error_message=None if verdict is None else verdict[1],
        tags=[t.tag for t in turns],
        turns=turns,
        passed_turns=passed,
        scorable_turns=scorable,
        irrelevance_turns=irr,
        passed_irrelevance_turns=passed_irr,
        progress=passed / scorable if scorable else 0.0,
        progress_with_irrelevance=(passed + passed_irr) / denom if denom else 0.0,
        terminated_early=terminated_early,
        failed_turn=failed_turn,
        details={} if verdict is None else verdict[2],
    )
