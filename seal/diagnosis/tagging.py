"""The per-turn failure-tag rule: one tag per ground-truth turn.

The environment's checker (``env_service.bfcl.checker``) gathers a :class:`seal.tags.TurnEvidence`
per ground-truth turn in a single pass on fresh backend instances; :func:`seal.tags.classify_turn`
names the turn's tag from the registered tag definitions. With the release's tags (see
:mod:`seal.tags`), the first matching rule wins in this order:

1. ``gt_error``: the ground-truth calls of the turn could not be executed as written.
2. ground truth empty: ``spurious_tool_call`` if the model made any call, else
   ``correct_abstention``.
3. ``empty_turn_model_response``: the ground truth has calls, the model's turn has none.
4. ``instance_mismatch``: none of the model's calls of the turn executed on a backend, so the
   turn has no model instances to compare, or the two instance sets differ.
5. ``checker_error``: the state checker raised, or the state matched and the response checker raised.
6. ``state_mismatch``: public backend state differs from the ground truth's.
7. ``response_mismatch``: a ground-truth result is missing from the model's results so far.
8. ``pass``.
"""

from __future__ import annotations

from seal.tags import TurnEvidence, classify_turn


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
) -> str:
    """The tag of one ground-truth turn from the checker's core observations.

    The arguments are the fields of :class:`seal.tags.TurnEvidence` of the same names; see
    there. The checker itself builds the full evidence (with the turn's calls and results) and
    calls :func:`seal.tags.classify_turn`.
    """
    return classify_turn(TurnEvidence(
        gt_error=gt_error, gt_empty=gt_empty, model_called=model_called, model_empty=model_empty,
        instances_match=instances_match, state_valid=state_valid, response_valid=response_valid,
        model_executed=model_executed,
    ))
