"""From per-turn check results to the evaluation shape the trainer reads.

An environment's per-turn check gives one :class:`TurnCheck` per ground-truth turn: the
:class:`seal_shared.tags.TurnEvidence` the tag rules read, and the error texts of the model's refused
calls. :func:`build_evaluation` turns them into the ``evaluate(sparse=False)`` dict, with the keys
and meanings of the BFCL checker's (each key, and how the tags and the verdict are chosen:
``docs/extending.md``). :func:`replay_turns` is the default per-turn check, for a world with a public
``state()``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from env_service.kit.tools import ToolResult
from seal_shared.tags import TurnEvidence, classify_turn

FORCE_TERMINATED = "multi_turn:force_terminated"
EMPTY_TURN = "multi_turn:empty_turn_model_response"
STATE_MISMATCH = "multi_turn:instance_state_mismatch"
RESPONSE_MISMATCH = "multi_turn:execution_response_mismatch"


class TurnVerdict(NamedTuple):
    """Why a turn fails the episode: the error type and message (BFCL's vocabulary) and any details
    (BFCL's: the differing instances, the missing results). A judge may return a plain
    ``(error_type, message)`` tuple; ``None`` means the turn does not fail the episode."""

    error_type: str
    message: str
    details: Mapping[str, Any] | None = None


class World(Protocol):
    """What an episode runs its calls on: ``run(call string)`` answers a :class:`ToolResult` and never
    raises for a bad call. A ``ToolBox`` is one; so is any world that brings its own executor and
    declares its tool errors in the results (``error``: refused before running; ``tool_error``)."""

    def run(self, call: str) -> ToolResult: ...


class StatefulWorld(World, Protocol):
    """A world the default check can replay: ``state()`` is the public state compared after each turn."""

    def state(self) -> Any: ...


@dataclass(frozen=True)
class TurnCheck:
    """The per-turn check's result on one ground-truth turn.

    Attributes:
        evidence: what the check observed (the input of every tag rule; see ``seal_shared.tags``).
        errors: the texts of the model's calls of the turn that were refused (shown in ``turns``).
    """

    evidence: TurnEvidence
    errors: tuple[str, ...] = ()

    @classmethod
    def of(cls, *, gt_calls: Sequence[str], model_calls: Sequence[str], state_valid: bool | None,
           response_valid: bool | None = None, model_results: Sequence[str] = (), gt_error: bool = False,
           model_executed: bool | None = None, errors: Iterable[str] = ()) -> TurnCheck:
        """A check from the turn's calls: ``gt_empty``, ``model_called`` and ``model_empty`` follow from
        them, ``instances_match`` is true (a BFCL notion), ``model_executed`` defaults to ``model_called``."""
        called = bool(model_calls)
        return cls(TurnEvidence(
            gt_error=gt_error, gt_empty=not gt_calls, model_called=called, model_empty=not called,
            instances_match=True, state_valid=state_valid, response_valid=response_valid,
            model_executed=called if model_executed is None else model_executed,
            model_calls=tuple(model_calls), gt_calls=tuple(gt_calls), model_results=tuple(model_results),
        ), tuple(errors))


def turn_failure(evidence: TurnEvidence, index: int) -> TurnVerdict | None:
    """The default verdict rule of one turn (BFCL's, plus a judged abstention).

    A turn with ground-truth calls fails when the model made none, when ``state_valid`` is not true
    (a check that did not run counts as a mismatch), or when ``response_valid`` is false. A turn
    whose right move is no call fails only when the model called and ``state_valid`` is false (its
    calls changed the state); a read-only call there is tagged ``spurious_tool_call`` but passes.
    """
    e = evidence
    state = TurnVerdict(STATE_MISMATCH, f"Model instance state does not match the ground truth after turn {index}")
    if e.gt_empty:
        return state if e.model_called and e.state_valid is False else None
    if not e.model_called:
        return TurnVerdict(EMPTY_TURN, f"Model response list is empty for turn {index}")
    if not e.state_valid:
        return state
    if e.response_valid is False:
        return TurnVerdict(RESPONSE_MISMATCH, f"A ground-truth result of turn {index} is missing from the model's results")
    return None


def _default_judge(check: TurnCheck, index: int) -> TurnVerdict | None:
    return turn_failure(check.evidence, index)


def build_evaluation(checks: Sequence[TurnCheck], *, played_turns: int,
                     judge: Callable[[TurnCheck, int], tuple[Any, ...] | None] = _default_judge) -> dict[str, Any]:
    """The evaluation dict of an episode whose model played ``played_turns`` user turns, from one
    check per ground-truth turn: one tag per turn (:func:`seal_shared.tags.classify_turn`, so a tag a
    plug-in registers applies too) and the verdict, ``multi_turn:force_terminated`` when the model played
    another number of turns, else the first turn that ``judge(check, index)`` fails (default:
    :func:`turn_failure` on the check's evidence)."""
    terminated_early = played_turns != len(checks)
    verdict: TurnVerdict | None = None
    if terminated_early:
        verdict = TurnVerdict(FORCE_TERMINATED, "Model was force-terminated during inference phase. The length of the "
                              f"model result turns ({played_turns}) does not match the length of the ground truth "
                              f"turns ({len(checks)}).")
    failed_turn: int | None = None
    turns: list[dict[str, Any]] = []
    for k, check in enumerate(checks):
        e = check.evidence
        if verdict is None:
            judged = judge(check, k)
            verdict = None if judged is None else TurnVerdict(*judged)
            failed_turn = k if verdict is not None else None
        turns.append({"index": k, "tag": str(classify_turn(e)),
                      "valid": None if e.gt_empty and not e.gt_error else e.passed,
                      "irrelevance": (not e.model_called) if e.gt_empty else None, "errors": list(check.errors)})
    return _summary(turns, verdict, failed_turn, terminated_early)


def _summary(turns: list[dict[str, Any]], verdict: TurnVerdict | None, failed_turn: int | None,
             terminated_early: bool) -> dict[str, Any]:
    passed = sum(1 for t in turns if t["valid"] is True)
    scorable = sum(1 for t in turns if t["valid"] is not None)
    irr = sum(1 for t in turns if t["irrelevance"] is not None)
    passed_irr = sum(1 for t in turns if t["irrelevance"] is True)
    return {
        "valid": verdict is None,
        "accuracy": 1.0 if verdict is None else 0.0,
        "error_type": None if verdict is None else verdict[0],
        "error_message": None if verdict is None else verdict[1],
        "failed_turn": failed_turn,
        "failure_tags": [t["tag"] for t in turns],
        "per_turn_valid": [t["valid"] for t in turns],
        "irrelevance_per_turn": [t["irrelevance"] for t in turns],
        "turns": turns,
        "passed_turns": passed,
        "scorable_turns": scorable,
        "irrelevance_turns": irr,
        "passed_irrelevance_turns": passed_irr,
        "progress": passed / scorable if scorable else 0.0,
        "progress_with_irrelevance": (passed + passed_irr) / (scorable + irr) if scorable + irr else 0.0,
        "terminated_early": terminated_early,
        "details": dict(verdict.details or {}) if verdict is not None else {},
    }


def replay_turns(model_turns: Sequence[Sequence[Sequence[str]]], gt_turns: Sequence[Sequence[str]],
                 new_world: Callable[[], StatefulWorld]) -> list[TurnCheck]:
    """The per-turn check by replay: the model's accepted calls (turn -> step -> call strings) and the
    ground truth run on two fresh worlds, turn by turn.

    ``state_valid``: the two worlds' ``state()`` are equal after the turn (checked when the model
    called). ``response_valid``: every ground-truth result of the turn is among the model's results so
    far (checked when both sides called). ``gt_error``: a ground-truth call was refused.
    """
    model_world, gt_world = new_world(), new_world()
    model_results: list[str] = []
    checks: list[TurnCheck] = []
    for k, gt_calls in enumerate(gt_turns):
        calls = [call for step in (model_turns[k] if k < len(model_turns) else []) for call in step]
        runs = [model_world.run(call) for call in calls]
        model_results.extend(r.text for r in runs)
        gt_runs = [gt_world.run(call) for call in gt_calls]
        state_valid = model_world.state() == gt_world.state() if runs else None
        response_valid = all(r.text in model_results for r in gt_runs) if gt_calls and runs else None
        checks.append(TurnCheck.of(
            gt_calls=gt_calls, model_calls=calls, model_results=[r.text for r in runs], state_valid=state_valid,
            response_valid=response_valid, gt_error=any(not r.executed for r in gt_runs),
            model_executed=any(r.executed for r in runs), errors=[r.text for r in runs if not r.executed]))
    return checks
