"""The per-turn failure-tag rule: one ``FailureTag`` per ground-truth turn.

This is a pure function of what the checker observed on one turn. The environment's checker
(``env_service.bfcl.checker``) computes the observations in a single pass on fresh backend
instances and calls :func:`tag_turn` once per ground-truth turn.

Priority (the first matching rule wins), as in the release's per-turn scorer:

1. ``gt_error``: the ground-truth calls of the turn could not be executed as written.
2. ground truth empty: ``spurious_tool_call`` if the model made any call, else
   ``correct_abstention``.
3. ``empty_turn_model_response``: the ground truth has calls, the model's turn has none.
4. ``instance_mismatch``: none of the model's calls of the turn executed on a backend, so the
   turn has no model instances to compare (the release's rule: the model's instances are those of
   the turn's last step that executed, ``{}`` when none did, and the tag fires when their set
   differs from the ground truth's); or the two instance sets differ.
5. ``checker_error``: the state checker raised.
6. ``state_mismatch``: public backend state differs from the ground truth's.
7. ``checker_error``: the response checker raised.
8. ``response_mismatch``: a ground-truth result is missing from the model's results so far.
9. ``pass``.
"""

from __future__ import annotations

from seal.types import FailureTag


def tag_turn(
    *,
    gt_error: bool,
    gt_empty: bool,
    model_called: bool,
    model_empty: bool,
    instances_match: bool,
    state_valid: bool | None,
    response_valid: bool | None,
    model_executed: bool = True,
) -> FailureTag:
    """Return the failure tag of one ground-truth turn.

    Args:
        gt_error: executing the turn's ground-truth calls failed at the executor level (a call
            string that does not parse, or names no method of the task's backends).
        gt_empty: the ground truth for this turn is ``[]`` (the right move is to abstain).
        model_called: the model made at least one accepted call in this turn.
        model_empty: BFCL's empty-turn rule holds for the model's turn (no steps, or a single
            empty step).
        instances_match: the model's backend instances cover the same classes as the ground
            truth's.
        state_valid: result of BFCL's state check; ``None`` when the checker itself raised.
        response_valid: result of BFCL's cumulative response check; ``None`` when it raised.
        model_executed: at least one of the model's calls of this turn reached a backend method
            (a call the executor refused before running it -- unknown name, blocked name,
            unparsable call string, argument over a limit -- did not).
    """
    if gt_error:
        return FailureTag.GT_ERROR
    if gt_empty:
        return FailureTag.SPURIOUS_TOOL_CALL if model_called else FailureTag.CORRECT_ABSTENTION
    if model_empty:
        return FailureTag.EMPTY_TURN_MODEL_RESPONSE
    if not model_executed or not instances_match:
        return FailureTag.INSTANCE_MISMATCH
    if state_valid is None:
        return FailureTag.CHECKER_ERROR
    if not state_valid:
        return FailureTag.STATE_MISMATCH
    if response_valid is None:
        return FailureTag.CHECKER_ERROR
    if not response_valid:
        return FailureTag.RESPONSE_MISMATCH
    return FailureTag.PASS
