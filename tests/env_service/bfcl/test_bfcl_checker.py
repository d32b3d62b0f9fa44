"""Checker semantics beyond the differential test: tags, fresh instances, JSON output."""

from __future__ import annotations

import json

import pytest

from env_service.bfcl.checker import check_episode
from seal_shared.tags import TurnEvidence, classify_turn
from seal_shared.types import FailureTag as T

_OK = dict(gt_error=False, gt_empty=False, model_called=True, model_empty=False, instances_match=True,
           state_valid=True, response_valid=True)


def tag_turn(**evidence) -> str:
    return classify_turn(TurnEvidence(**evidence))


@pytest.mark.parametrize("changes, expected", [
    ({}, T.PASS),
    ({"gt_error": True, "state_valid": False}, T.GT_ERROR),
    ({"gt_empty": True}, T.SPURIOUS_TOOL_CALL),
    ({"gt_empty": True, "model_called": False, "model_empty": True}, T.CORRECT_ABSTENTION),
    ({"model_empty": True, "model_called": False, "state_valid": False}, T.EMPTY_TURN_MODEL_RESPONSE),
    ({"instances_match": False, "state_valid": False}, T.INSTANCE_MISMATCH),
    ({"state_valid": None, "response_valid": False}, T.CHECKER_ERROR),
    ({"state_valid": False, "response_valid": False}, T.STATE_MISMATCH),
    ({"response_valid": None}, T.CHECKER_ERROR),
    ({"response_valid": False}, T.RESPONSE_MISMATCH),
])
def test_tag_priority(changes, expected):
    assert tag_turn(**{**_OK, **changes}) == expected


def _oracle(task):
    return [[turn] if turn else [] for turn in task.gt_turns]


def test_tags_continue_past_the_first_failure(store):
    task = store.get("multi_turn_base_0")
    turns = _oracle(task)
    turns[1] = [["cd(folder='temp')"]]  # skip the read-only grep: the response check fails
    check = check_episode(turns, task.gt_turns, task.entry)
    assert (check.valid, check.error_type, check.failed_turn) == \
        (False, "multi_turn:execution_response_mismatch", 1)
    assert check.error_message == ("Model response execution results so far does not contain all the ground "
                                   "truth response execution results for turn 1.")
    assert check.tags == [T.PASS, T.RESPONSE_MISMATCH, T.PASS, T.PASS]
    assert (check.passed_turns, check.scorable_turns, check.progress) == (3, 4, 0.75)
    assert check.details["missing_items"]


def test_abstention_tags_and_irrelevance_counts(store):
    task = store.get("multi_turn_miss_param_0")
    empty = task.gt_turns.index([])
    abstain = check_episode(_oracle(task), task.gt_turns, task.entry)
    assert abstain.valid and abstain.tags[empty] == T.CORRECT_ABSTENTION
    assert (abstain.irrelevance_turns, abstain.passed_irrelevance_turns) == (1, 1)
    turns = _oracle(task)
    turns[empty] = [["pwd()"]]  # a read-only call where BFCL does not judge: still valid
    spurious = check_episode(turns, task.gt_turns, task.entry)
    assert spurious.valid and spurious.tags[empty] == T.SPURIOUS_TOOL_CALL
    assert spurious.passed_irrelevance_turns == 0 and spurious.progress_with_irrelevance < 1.0


def test_empty_turn_and_state_mismatch(store):
    task = store.get("multi_turn_base_0")
    turns = _oracle(task)
    turns[0] = []
    check = check_episode(turns, task.gt_turns, task.entry)
    assert (check.error_type, check.error_message) == \
        ("multi_turn:empty_turn_model_response", "Model response list is empty for turn 0")
    assert check.tags[0] == T.EMPTY_TURN_MODEL_RESPONSE and check.tags[1] == T.STATE_MISMATCH
    turns = _oracle(task)
    turns[0] = [["cd(folder='document')", "mkdir(dir_name='tmp')"]]
    check = check_episode(turns, task.gt_turns, task.entry)
    assert check.error_type == "multi_turn:instance_state_mismatch"
    assert check.error_message == ("Model instance for GorillaFileSystem does not match the state with "
                                   "ground truth instance.")
    assert check.details == {"differences": ["root"]}


def test_every_check_uses_fresh_instances(store):
    task = store.get("multi_turn_base_1")
    turns = _oracle(task)
    first = check_episode(turns, task.gt_turns, task.entry).to_dict()
    second = check_episode(turns, task.gt_turns, task.entry).to_dict()
    assert first == second and first["valid"]


def test_gt_error_for_ground_truth_that_cannot_run(store):
    task = store.get("multi_turn_composite_8")  # one ground-truth string there is not valid Python
    check = check_episode(_oracle(task), task.gt_turns, task.entry)
    assert check.valid  # BFCL's verdict: both sides get the same SyntaxError text
    bad_turn = check.tags.index(T.GT_ERROR)
    assert check.turns[bad_turn].valid is False and "failed to execute" in check.turns[bad_turn].errors[0]


def test_to_dict_is_json_safe_and_bounded_for_long_context(store):
    task = store.get("multi_turn_long_context_0")
    turns = _oracle(task)
    turns[-1] = [["pwd()"]]
    result = check_episode(turns, task.gt_turns, task.entry).to_dict()
    text = json.dumps(result)
    assert not result["valid"] and len(text) < 20_000
    assert all(len(m) <= 520 for m in result["details"].get("missing_items", []))
