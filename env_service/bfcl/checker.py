"""BFCL's multi-turn verdict plus one failure tag per ground-truth turn, in one pass.

:func:`check_turns` replays the model's accepted calls and the ground truth on **fresh** backend
instances (two :class:`~env_service.bfcl.executor.Executor` objects made for this call only) and,
turn by turn:

* judges the turn as ``bfcl_eval``'s ``multi_turn_checker`` does: the empty-turn rule, the state
  check (its pure ``state_checker``) and the cumulative unordered response check (its pure
  ``response_checker``), on every turn with ground-truth calls (:attr:`BfclTurnCheck.verdict`);
* gathers each ground-truth turn's :class:`seal_shared.tags.TurnEvidence` (missing model turns count
  as empty; the checks go on after a failure, on the model's own accumulated state), from which the
  registered tag rules tag the turn (:func:`seal_shared.tags.classify_turn`).

:func:`check_episode` builds the episode's evaluation from them with the kit
(:func:`env_service.kit.build_evaluation`): BFCL's verdict is the first judged turn's failure, and a
model turn count different from the ground truth's is ``multi_turn:force_terminated``, as BFCL's eval
runner rules before checking. Both the verdict and the tags come from the same single pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import response_checker, state_checker
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import is_empty_execute_response

from env_service.bfcl.executor import DEFAULT_CALL_TIMEOUT_S, REFUSED_KINDS, Executor
from env_service.bfcl.tasks import is_long_context
from env_service.kit import EMPTY_TURN, FORCE_TERMINATED, TurnCheck, TurnVerdict, build_evaluation
from seal_shared.tags import TurnEvidence
from seal_shared.types import TurnDiagnosis

__all__ = ["CHECKER_ERROR", "EMPTY_TURN", "FORCE_TERMINATED", "BfclTurnCheck", "EpisodeCheck", "check_episode",
           "check_turns"]

CHECKER_ERROR = "multi_turn:checker_error"  # not a BFCL type: a checker function itself raised
_GT_ERROR_KINDS = frozenset({"parse", "blocked", "unknown"})
_MAX_DETAIL_CHARS = 500


@dataclass(frozen=True)
class BfclTurnCheck(TurnCheck):
    """The kit's per-turn check plus BFCL's verdict on the turn (``None``: it passes, or BFCL does not
    judge it: a turn whose ground truth makes no call)."""

    verdict: TurnVerdict | None = None


@dataclass
class EpisodeCheck:
    """BFCL's verdict for one episode plus the per-turn diagnosis, read from the kit's evaluation
    (:meth:`to_dict`, all JSON-safe)."""

    valid: bool
    error_type: str | None
    error_message: str | None
    failed_turn: int | None  # the turn BFCL's verdict failed on (None: valid or force-terminated)
    tags: list[str]
    turns: list[TurnDiagnosis]
    passed_turns: int
    scorable_turns: int
    irrelevance_turns: int
    passed_irrelevance_turns: int
    progress: float
    progress_with_irrelevance: float
    terminated_early: bool
    details: dict[str, Any] = field(default_factory=dict)
    evaluation: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_evaluation(cls, result: dict[str, Any]) -> EpisodeCheck:
        turns = [TurnDiagnosis(index=t["index"], tag=t["tag"], valid=t["valid"], irrelevance=t["irrelevance"],
                               errors=tuple(t["errors"])) for t in result["turns"]]
        keys = ("valid", "error_type", "error_message", "failed_turn", "passed_turns", "scorable_turns",
                "irrelevance_turns", "passed_irrelevance_turns", "progress", "progress_with_irrelevance",
                "terminated_early", "details")
        return cls(**{k: result[k] for k in keys}, tags=list(result["failure_tags"]), turns=turns, evaluation=result)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.evaluation)


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


def _verdict_of(outcome: _TurnOutcome) -> TurnVerdict | None:
    """BFCL's failure for a judged turn: state first, then response; None if both pass."""
    if outcome.state is None:
        return TurnVerdict(CHECKER_ERROR, outcome.errors[-1], {})
    if not outcome.state["valid"]:
        diffs = sorted(outcome.state.get("details", {}).get("differences", {}))
        return TurnVerdict(outcome.state["error_type"], outcome.state["error_message"], {"differences": diffs})
    if outcome.response is None:
        return TurnVerdict(CHECKER_ERROR, outcome.errors[-1], {})
    if not outcome.response["valid"]:
        missing = outcome.response.get("details", {}).get("missing_items", [])
        return TurnVerdict(outcome.response["error_type"], outcome.response["error_message"],
                           {"missing_items": [_clip(str(m)) for m in missing]})
    return None


def check_turns(model_turns: list[list[list[str]]], gt_turns: list[list[str]], entry: dict[str, Any],
                *, call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S) -> list[BfclTurnCheck]:
    """One :class:`BfclTurnCheck` per ground-truth turn (see the module docstring). ``model_turns``:
    turn -> step -> call strings."""
    long_context = is_long_context(entry["id"])
    classes, config = entry["involved_classes"], entry["initial_config"]
    model_ex = Executor(classes, config, long_context, call_timeout_s=call_timeout_s)
    gt_ex = Executor(classes, config, long_context, call_timeout_s=call_timeout_s)
    all_model_results: list[str] = []
    checks: list[BfclTurnCheck] = []
    for k, gt_calls in enumerate(gt_turns):
        steps = model_turns[k] if k < len(model_turns) else []
        model_executed = False
        turn_results: list[str] = []
        for step in steps:
            step_run = model_ex.run(step)
            turn_results.extend(r.text for r in step_run)
            model_executed |= any(r.error not in REFUSED_KINDS for r in step_run)
        all_model_results.extend(turn_results)
        gt_run = gt_ex.run(gt_calls)
        gt_error = any(r.error in _GT_ERROR_KINDS for r in gt_run)
        model_empty = not steps or is_empty_execute_response(steps)
        outcome = _TurnOutcome()
        if gt_calls and not model_empty:
            outcome = _run_checks(model_ex, gt_ex, all_model_results, [r.text for r in gt_run], k)
        if gt_error:
            outcome.errors.insert(0, "ground-truth calls failed to execute: "
                                  + "; ".join(_clip(r.text) for r in gt_run if r.error in _GT_ERROR_KINDS))
        verdict = None
        if gt_calls:
            verdict = TurnVerdict(EMPTY_TURN, f"Model response list is empty for turn {k}") if model_empty \
                else _verdict_of(outcome)
        evidence = TurnEvidence(
            gt_error=gt_error, gt_empty=not gt_calls, model_called=any(len(s) > 0 for s in steps),
            model_empty=model_empty,
            instances_match=bool(gt_ex.instances) and set(model_ex.instances) == set(gt_ex.instances),
            model_executed=model_executed,
            state_valid=None if outcome.state is None else outcome.state["valid"],
            response_valid=None if outcome.response is None else outcome.response["valid"],
            model_calls=tuple(c for s in steps for c in s), gt_calls=tuple(gt_calls),
            model_results=tuple(turn_results))
        checks.append(BfclTurnCheck(evidence, tuple(_clip(e) for e in outcome.errors), verdict))
    return checks


def judge(check: TurnCheck, index: int) -> TurnVerdict | None:
    """BFCL's verdict rule: the checker's own verdict on the turn."""
    if not isinstance(check, BfclTurnCheck):
        raise TypeError(f"BFCL judges the checks of env_service.bfcl.checker.check_turns, got {type(check).__name__}")
    return check.verdict


def check_episode(model_turns: list[list[list[str]]], gt_turns: list[list[str]], entry: dict[str, Any],
                  *, call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S) -> EpisodeCheck:
    """Judge one episode. ``model_turns``: turn -> step -> call strings."""
    checks = check_turns(model_turns, gt_turns, entry, call_timeout_s=call_timeout_s)
    return EpisodeCheck.from_evaluation(build_evaluation(checks, played_turns=len(model_turns), judge=judge))
