"""The failure-tag registry: the release's nine tags keep their exact rule, weights and lines;
registration errors name what to fix."""

from __future__ import annotations

import itertools

import pytest

from seal_shared.tags import (
    TagDefinition,
    TurnEvidence,
    classify_turn,
    default_guidelines,
    default_tag_weights,
    excluded_tags,
    get_tag,
    guideline_excluded_tags,
    known_tags,
    register_tag,
    tag_definitions,
    turn_verdict,
    unregister_tag,
)
from seal_shared.types import UNKNOWN_TAG, FailureTag, PaperLabel

T = FailureTag


def _release_chain(*, gt_error, gt_empty, model_called, model_empty, instances_match, state_valid, response_valid,
                   model_executed):
    """The release's per-turn priority chain, written out as it stood before the registry."""
    if gt_error:
        return T.GT_ERROR
    if gt_empty:
        return T.SPURIOUS_TOOL_CALL if model_called else T.CORRECT_ABSTENTION
    if model_empty:
        return T.EMPTY_TURN_MODEL_RESPONSE
    if not model_executed or not instances_match:
        return T.INSTANCE_MISMATCH
    if state_valid is None:
        return T.CHECKER_ERROR
    if not state_valid:
        return T.STATE_MISMATCH
    if response_valid is None:
        return T.CHECKER_ERROR
    if not response_valid:
        return T.RESPONSE_MISMATCH
    return T.PASS


_BOOL = (False, True)
_TRI = (None, False, True)
ALL_EVIDENCE = [
    dict(gt_error=a, gt_empty=b, model_called=c, model_empty=d, instances_match=e, state_valid=f,
         response_valid=g, model_executed=h)
    for a, b, c, d, e, f, g, h in itertools.product(_BOOL, _BOOL, _BOOL, _BOOL, _BOOL, _TRI, _TRI, _BOOL)
]


def test_registered_rules_equal_the_release_chain_on_every_input() -> None:
    for kwargs in ALL_EVIDENCE:
        expected = _release_chain(**kwargs)
        assert classify_turn(TurnEvidence(**kwargs)) == expected, kwargs
        assert TurnEvidence(**kwargs).passed == (expected == T.PASS), kwargs


def test_release_tags_in_order_with_their_weights_lines_and_labels() -> None:
    assert [d.name for d in tag_definitions()] == [
        T.GT_ERROR, T.SPURIOUS_TOOL_CALL, T.CORRECT_ABSTENTION, T.EMPTY_TURN_MODEL_RESPONSE, T.INSTANCE_MISMATCH,
        T.CHECKER_ERROR, T.STATE_MISMATCH, T.RESPONSE_MISMATCH, T.PASS]
    assert default_tag_weights() == {"gt_error": 1.0, "spurious_tool_call": 2.0, "correct_abstention": 1.8,
                                     "empty_turn_model_response": 1.5, "instance_mismatch": 0.6,
                                     "checker_error": 1.0, "state_mismatch": 1.0, "response_mismatch": 0.9,
                                     "pass": 1.0}
    assert set(default_guidelines()) == {T.SPURIOUS_TOOL_CALL, T.EMPTY_TURN_MODEL_RESPONSE, T.STATE_MISMATCH,
                                         T.INSTANCE_MISMATCH, T.RESPONSE_MISMATCH}
    assert excluded_tags() == {"checker_error", "gt_error"}
    assert guideline_excluded_tags() == {"checker_error", "gt_error", "pass", "correct_abstention", UNKNOWN_TAG}
    assert known_tags() == {str(t) for t in FailureTag} | {UNKNOWN_TAG}
    assert get_tag("state_mismatch").paper_label is PaperLabel.STATE_MISMATCH
    assert get_tag(T.SPURIOUS_TOOL_CALL).description.startswith("The right move was to abstain")


def test_registration_errors_name_the_problem() -> None:
    rule = lambda e: False  # noqa: E731
    with pytest.raises(ValueError, match="already registered"):
        register_tag(TagDefinition("pass", 5000, rule))
    with pytest.raises(ValueError, match="priority 60 is taken by 'state_mismatch'"):
        register_tag(TagDefinition("my_tag", 60, rule))
    with pytest.raises(ValueError, match="pseudo-tag"):
        register_tag(TagDefinition(UNKNOWN_TAG, 5001, rule))
    with pytest.raises(ValueError, match="weight"):
        TagDefinition("my_tag", 5002, rule, weight=-1.0)
    with pytest.raises(ValueError, match="letters, digits"):
        TagDefinition("my tag", 5003, rule)
    with pytest.raises(ValueError, match="cannot be removed"):
        unregister_tag("pass")
    with pytest.raises(ValueError, match="unknown failure tag 'nope'"):
        get_tag("nope")
    assert [d.name for d in tag_definitions()][-1] == "pass"  # nothing was added on the way


def test_a_registered_tag_takes_its_place_in_the_order_and_leaves_cleanly() -> None:
    register_tag(TagDefinition("late_response", 70, lambda e: e.state_valid is True and e.response_valid is False))
    try:
        evidence = TurnEvidence(gt_error=False, gt_empty=False, model_called=True, model_empty=False,
                                instances_match=True, state_valid=True, response_valid=False)
        assert classify_turn(evidence) == "late_response"  # before response_mismatch (80)
        assert "late_response" in known_tags() and default_tag_weights()["late_response"] == 1.0
    finally:
        unregister_tag("late_response")
    assert classify_turn(evidence) == T.RESPONSE_MISMATCH


def test_a_turns_verdict_follows_its_tags_flags() -> None:
    assert turn_verdict(FailureTag.PASS) is True and turn_verdict(FailureTag.CORRECT_ABSTENTION) is True
    assert turn_verdict(FailureTag.STATE_MISMATCH) is False and turn_verdict(FailureTag.SPURIOUS_TOOL_CALL) is False
    assert turn_verdict(FailureTag.GT_ERROR) is None and turn_verdict(FailureTag.CHECKER_ERROR) is None
    assert turn_verdict(UNKNOWN_TAG) is None and turn_verdict("nobody_registered_this") is None
    register_tag(TagDefinition("partial_credit", 990, lambda e: False, failure=False))
    try:
        assert turn_verdict("partial_credit") is True
    finally:
        unregister_tag("partial_credit")
