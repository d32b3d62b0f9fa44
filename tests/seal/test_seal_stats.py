"""Diagnosis stats: metrics, epoch dump, error collection."""

from collections import Counter

import pytest

from seal.diagnosis import CapabilityState, DiagnosisConfig, DiagnosisStats, extract_error_messages
from seal_shared.types import FailureTag

T = FailureTag


def test_metrics_window_per_category() -> None:
    s = CapabilityState()
    s.observe("multi_turn_base", "multi_turn_base_0", 1.0, True, [T.PASS], 0, 0)
    s.observe("multi_turn_base", "multi_turn_base_1", 0.0, False, [T.STATE_MISMATCH], 0, 0)
    s.observe("multi_turn_long_context", "multi_turn_long_context_1", 0.4, False, [T.STATE_MISMATCH], 0, 0)
    m = DiagnosisStats(s).metrics(tag_weights={"pass": 1.0})  # a reweighter's adaptive weights
    assert m["seal/diagnosis/window/multi_turn_base/count"] == 2
    assert m["seal/diagnosis/window/multi_turn_base/success_rate"] == 0.5
    assert m["seal/diagnosis/window/multi_turn_long_context/reward_mean"] == pytest.approx(0.4)
    assert m["seal/diagnosis/window/multi_turn_long_context/partial_count"] == 1
    assert m["seal/diagnosis/state/observe_count"] == 3 and m["seal/diagnosis/state/num_tasks"] == 3
    assert m["seal/diagnosis/dynamic_tag_weight/pass"] == 1.0
    s.reset_window()
    assert not any("/window/" in k or "dynamic_tag_weight" in k for k in DiagnosisStats(s).metrics())


def test_epoch_dump_contents() -> None:
    s = CapabilityState()
    s.observe("multi_turn_base", "multi_turn_base_0", 0.0, False, [T.PASS, T.RESPONSE_MISMATCH], 1, 7)
    errors = Counter({f"e{i}": i for i in range(30)})
    d = DiagnosisStats(s, DiagnosisConfig(top_errors=20)).epoch_dump(1, 7, errors, {"pass": 0.9})
    assert d["epoch"] == 1 and d["global_step"] == 7
    assert d["tags"]["response_mismatch"]["count"] == 1
    assert d["category_tags"]["multi_turn_base::pass"]["count"] == 1
    assert d["turn_positions"]["late::response_mismatch"]["count"] == 1
    assert d["tasks"]["multi_turn_base_0"]["last_tag"] == "response_mismatch"
    assert [e["message"] for e in d["top_errors"]] == [f"e{i}" for i in range(29, 9, -1)]
    assert d["categories"]["multi_turn_base"]["success_rate"] == 0.0
    assert d["dynamic_tag_weights"] == {"pass": 0.9}
    assert DiagnosisStats(s).epoch_dump(1, 7, errors)["dynamic_tag_weights"] == {}  # no adaptive weights


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
