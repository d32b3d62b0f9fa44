"""Diagnosis stats (metrics, epoch dump, error collection) and the paper-label mapping."""

from collections import Counter

import pytest

from seal.diagnosis import (
    CapabilityState,
    DiagnosisConfig,
    DiagnosisStats,
    TurnEvents,
    extract_error_messages,
    labels_from_result,
    paper_label,
    paper_labels,
)
from seal.types import FailureTag, PaperLabel

T, P = FailureTag, PaperLabel


def test_metrics_window_per_category() -> None:
    s = CapabilityState()
    s.observe("multi_turn_base", "multi_turn_base_0", 1.0, True, [T.PASS], 0, 0)
    s.observe("multi_turn_base", "multi_turn_base_1", 0.0, False, [T.STATE_MISMATCH], 0, 0)
    s.observe("multi_turn_long_context", "multi_turn_long_context_1", 0.4, False, [T.STATE_MISMATCH], 0, 0)
    s.dynamic_tag_weights = {"pass": 1.0}
    m = DiagnosisStats(s).metrics()
    assert m["seal/diagnosis/window/multi_turn_base/count"] == 2
    assert m["seal/diagnosis/window/multi_turn_base/success_rate"] == 0.5
    assert m["seal/diagnosis/window/multi_turn_long_context/reward_mean"] == pytest.approx(0.4)
    assert m["seal/diagnosis/window/multi_turn_long_context/partial_count"] == 1
    assert m["seal/diagnosis/state/observe_count"] == 3 and m["seal/diagnosis/state/num_tasks"] == 3
    assert m["seal/diagnosis/dynamic_tag_weight/pass"] == 1.0
    s.reset_window()
    assert not any("/window/" in k for k in DiagnosisStats(s).metrics())


def test_epoch_dump_contents() -> None:
    s = CapabilityState()
    s.observe("multi_turn_base", "multi_turn_base_0", 0.0, False, [T.PASS, T.RESPONSE_MISMATCH], 1, 7)
    errors = Counter({f"e{i}": i for i in range(30)})
    d = DiagnosisStats(s, DiagnosisConfig(top_errors=20)).epoch_dump(1, 7, errors)
    assert d["epoch"] == 1 and d["global_step"] == 7
    assert d["tags"]["response_mismatch"]["count"] == 1
    assert d["category_tags"]["multi_turn_base::pass"]["count"] == 1
    assert d["turn_positions"]["late::response_mismatch"]["count"] == 1
    assert d["tasks"]["multi_turn_base_0"]["last_tag"] == "response_mismatch"
    assert [e["message"] for e in d["top_errors"]] == [f"e{i}" for i in range(29, 9, -1)]
    assert d["categories"]["multi_turn_base"]["success_rate"] == 0.0


def test_extract_error_messages() -> None:
    long = "x" * 300
    messages = [
        {"role": "system", "content": '[ERROR] in the system prompt is ignored {"error": "no"}'},
        {"role": "user", "content": "please cd"},
        {"role": "assistant", "content": "[ERROR] the model's own text is ignored"},
        {"role": "user", "content": "[ERROR] Invalid tool call format: missing name\n[Hint] ..."},
        {"role": "tool", "content": '<tool_response>{"error": "cd: no such directory: \\"tmp\\""}</tool_response>'},
        {"role": "user", "content": f"<tool_response>Error during execution: {long}</tool_response>"},
    ]
    found = extract_error_messages(messages)
    assert found[0] == "[ERROR] Invalid tool call format: missing name"
    assert found[1] == 'cd: no such directory: \\"tmp\\"'
    assert found[2].startswith("Error during execution: xxx") and len(found[2]) == 200
    assert len(found) == 3
    assert extract_error_messages(['{"error": "bad"}'], max_chars=2) == ["ba"]


def test_diagnosis_config_validation() -> None:
    assert DiagnosisConfig().top_errors == 20
    with pytest.raises(ValueError, match="unknown key"):
        DiagnosisConfig.from_dict({"top_error": 3})
    with pytest.raises(ValueError, match="save_every_n_steps"):
        DiagnosisConfig(save_every_n_steps=-1)


def test_paper_labels_rules_in_order() -> None:
    assert paper_label(T.PASS) is P.NONE and paper_label(T.GT_ERROR, TurnEvents(tool_errors=3)) is P.NONE
    assert paper_label(T.CORRECT_ABSTENTION) is P.NONE and paper_label(T.CHECKER_ERROR) is P.NONE
    assert paper_label(T.SPURIOUS_TOOL_CALL, TurnEvents(tool_errors=1)) is P.INVALID_TOOL_CALL
    assert paper_label(T.EMPTY_TURN_MODEL_RESPONSE) is P.MISSING_TOOL_CALL
    assert paper_label(T.EMPTY_TURN_MODEL_RESPONSE, TurnEvents(parse_errors=1)) is P.INVALID_TOOL_CALL
    assert paper_label(T.STATE_MISMATCH, TurnEvents(unavailable_tools=1, tool_errors=1)) is P.INVALID_TOOL_CALL
    assert paper_label(T.STATE_MISMATCH, TurnEvents(tool_errors=1)) is P.RECOVERY_FAILURE
    assert paper_label(T.INSTANCE_MISMATCH) is P.RECOVERY_FAILURE
    right_tools = TurnEvents(model_calls=("cd", "mv", "ls"), gt_calls=("mv", "cd"))
    assert paper_label(T.STATE_MISMATCH, right_tools) is P.ARGUMENT_MISMATCH
    assert paper_label(T.STATE_MISMATCH, TurnEvents(model_calls=("cd",), gt_calls=("cd", "cd"))) is P.STATE_MISMATCH
    assert paper_label(T.STATE_MISMATCH) is P.STATE_MISMATCH
    assert paper_label(T.RESPONSE_MISMATCH, right_tools) is P.RESPONSE_MISMATCH


def test_paper_labels_list() -> None:
    tags = [T.PASS, T.EMPTY_TURN_MODEL_RESPONSE, T.RESPONSE_MISMATCH]
    assert paper_labels(tags) == [P.NONE, P.MISSING_TOOL_CALL, P.RESPONSE_MISMATCH]
    assert paper_labels(tags, [None, TurnEvents(parse_errors=2)]) == [P.NONE, P.INVALID_TOOL_CALL, P.RESPONSE_MISMATCH]
    with pytest.raises(ValueError, match="events for 4 turns"):
        paper_labels(tags, [None] * 4)
    with pytest.raises(ValueError):
        paper_labels(["not_a_tag"])


def test_labels_from_an_environment_result() -> None:
    result = {
        "failure_tags": ["pass", "state_mismatch", "empty_turn_model_response"],
        "turn_events": [
            {"parse_errors": 0, "unavailable_tools": 0, "tool_errors": 0, "model_calls": ["cd"], "gt_calls": ["cd"]},
            {"parse_errors": 0, "unavailable_tools": 0, "tool_errors": 0, "model_calls": ["mv", "cd"], "gt_calls": ["cd", "mv"]},
            {"parse_errors": 0, "unavailable_tools": 2, "tool_errors": 0, "model_calls": [], "gt_calls": ["ls"]},
        ],
    }
    assert labels_from_result(result) == [P.NONE, P.ARGUMENT_MISMATCH, P.INVALID_TOOL_CALL]
    assert labels_from_result({"failure_tags": ["empty_turn_model_response"]}) == [P.MISSING_TOOL_CALL]
    with pytest.raises(KeyError, match="failure_tags"):
        labels_from_result({})
