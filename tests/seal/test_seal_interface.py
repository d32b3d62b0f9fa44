"""Interface evolution: observation hints, recovery feedback, guidelines, per-episode gates."""

import copy
import json

import pytest

from seal.diagnosis import CapabilityState
from seal_shared.interface import (
    GUIDELINES_HEADER,
    OBSERVATION_INSTRUCTION,
    EpisodeInterface,
    GuidelineConfig,
    observation_hints,
    parse_error_feedback,
    render_guidelines,
    tool_error_feedback,
    tool_error_hint,
)
from seal.interface import select_guidelines
from seal_shared.types import FailureTag

T = FailureTag
TOOLS = [
    {
        "name": "sort",
        "description": "Sort a file.",
        "parameters": {
            "type": "dict",
            "properties": {
                "file_name": {"type": "string", "description": "The file."},
                "order": {"type": "string", "description": "Order.", "enum": ["asc", "desc"]},
                "opts": {"type": "dict", "description": "Options.", "properties": {"x": {"type": "string", "description": "x"}}},
            },
            "required": ["file_name"],
        },
    },
    {"type": "function", "function": {"name": "ls", "description": "List.", "parameters": {
        "type": "dict", "properties": {"a": {"type": "boolean", "description": "All. [required]"}}, "required": ["a"]}}},
    {"name": "pwd", "description": "Where am I.", "parameters": {"type": "dict", "properties": {}, "required": []}},
]  # fmt: skip


# ---- observation hints -----------------------------------------------------------------------


def test_observation_hints_defaults_and_purity() -> None:
    before = copy.deepcopy(TOOLS)
    out = observation_hints(TOOLS)
    assert TOOLS == before
    props = out[0]["parameters"]["properties"]
    assert props["file_name"]["description"] == "The file. [required]"
    assert props["order"]["description"] == "Order. Allowed values: asc, desc"
    assert props["opts"]["properties"]["x"]["description"] == "x"  # nested: untouched
    assert out[1]["function"]["parameters"]["properties"]["a"]["description"] == "All. [required]"  # not doubled
    assert out[2] == TOOLS[2]


def test_observation_hints_options() -> None:
    out = observation_hints(TOOLS, add_required_hint=False, add_type_hint=True, add_enum_hint=False, hide_optional=True)
    props = out[0]["parameters"]["properties"]
    assert list(props) == ["file_name"]
    assert props["file_name"]["description"] == "The file. [type: string]"
    assert out[0]["parameters"]["required"] == ["file_name"]
    no_desc = [{"name": "f", "parameters": {"properties": {"p": {"enum": [1, 2]}}, "required": ["p"]}}]
    assert observation_hints(no_desc)[0]["parameters"]["properties"]["p"]["description"] == "[required] Allowed values: 1, 2"


# ---- recovery feedback -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "expect"),
    [
        ("cd() missing 1 required positional argument: 'folder'", "(folder)"),
        ("sort() got an unexpected keyword argument 'path'", "'path' is not a parameter"),
        ("cd: no such directory: 'tmp'", "not in the current location"),
        ("mv: cannot use path for destination; use a single component", "single file or directory name"),
        ("User not authenticated. Please log in first.", "log in"),
        ("Error: tool not found", "available tools: ls, pwd"),
        ("Expected a list but got str", "wrong type"),
        ("something odd happened", "Read the error"),
    ],
)
def test_tool_error_rules(error: str, expect: str) -> None:
    hint = tool_error_hint(error, tool_names=["ls", "pwd"])
    assert hint is not None and expect in hint


def test_tool_error_rule_order_and_limits() -> None:
    # Matches both rule 1 (missing argument) and rule 7 (expected/got): the first rule wins.
    both = "f() missing 2 required positional arguments: 'a' and 'b'; expected int got str"
    assert "(a, b)" in tool_error_hint(both)
    assert tool_error_hint("z" * 250) is None  # long, unrecognised: no hint
    assert tool_error_hint("   ") is None
    many = [f"t{i}" for i in range(12)]
    assert "(and 4 more)" in tool_error_hint("unknown function foo", tool_names=many)
    assert tool_error_feedback("unknown function foo").startswith("[ToolHint] ")
    assert tool_error_feedback("z" * 250) == ""


def test_parse_error_feedback() -> None:
    names = [f"tool{i}" for i in range(15)]
    text = parse_error_feedback("Invalid tool call JSON", parser_mode="xml_json", tool_names=names)
    assert "<tool_call>" in text and "tool11" in text and "tool12" not in text and "(and 3 more)" in text
    assert "plain text" in text.splitlines()[-1]
    py = parse_error_feedback("Tool 'x' is not available in the current tool list.", parser_mode="python_list", tool_names=["a"])
    assert "[<tool_name>(" in py and "spelled exactly" in py
    with pytest.raises(ValueError, match="parser_mode"):
        parse_error_feedback("x", parser_mode="yaml", tool_names=[])


# ---- guidelines ------------------------------------------------------------------------------


def _state(rows: list[tuple[str, float, list[str]]]) -> CapabilityState:
    s = CapabilityState()
    for i, (cat, reward, tags) in enumerate(rows):
        s.observe(cat, f"{cat}_{i}", reward, reward >= 1, tags, 0, i)
    return s


def test_select_guidelines_thresholds_and_ranking() -> None:
    rows = (
        [("multi_turn_base", 0.0, [T.STATE_MISMATCH])] * 30  # prevalence .3, rm 0 -> score .3
        + [("multi_turn_base", 0.0, [T.EMPTY_TURN_MODEL_RESPONSE])] * 12  # .12 -> .12
        + [("multi_turn_base", 1.0, [T.RESPONSE_MISMATCH])] * 20  # reward mean 1 >= 0.6: dropped
        + [("multi_turn_base", 0.0, [T.SPURIOUS_TOOL_CALL])] * 7  # count 7 < 8: dropped
        + [("multi_turn_base", 1.0, [T.PASS])] * 31  # excluded, but in the denominator
    )
    lines = select_guidelines(_state(rows), cfg=GuidelineConfig())
    cfg = GuidelineConfig()
    assert lines == [cfg.line_for(T.STATE_MISMATCH), cfg.line_for(T.EMPTY_TURN_MODEL_RESPONSE)]
    assert select_guidelines(_state(rows), cfg=GuidelineConfig(max_lines=1)) == lines[:1]
    assert select_guidelines(_state(rows), cfg=GuidelineConfig(prevalence_threshold=0.2)) == lines[:1]
    override = GuidelineConfig(guidelines={"state_mismatch": "", "empty_turn_model_response": "Act."})
    assert select_guidelines(_state(rows), cfg=override) == ["Act."]
    assert select_guidelines(CapabilityState(), cfg=cfg) == []


def test_select_guidelines_by_category_and_window() -> None:
    rows = [("multi_turn_base", 0.0, [T.STATE_MISMATCH])] * 10 + [("multi_turn_miss_func", 0.0, [T.EMPTY_TURN_MODEL_RESPONSE])] * 10
    s = _state(rows)
    cfg = GuidelineConfig()
    assert select_guidelines(s, category="multi_turn_miss_func", cfg=cfg) == [cfg.line_for(T.EMPTY_TURN_MODEL_RESPONSE)]
    s.reset_window()
    s.observe("multi_turn_base", "multi_turn_base_0", 1.0, True, [T.PASS] * 9, 1, 99)
    assert select_guidelines(s, cfg=cfg) == []  # window (all passes) wins over the totals
    assert select_guidelines(s, category="multi_turn_miss_func", cfg=cfg) != []  # window lacks it -> totals


def test_render_guidelines() -> None:
    assert render_guidelines([]) == ""
    assert render_guidelines(["a", "b"]) == f"{GUIDELINES_HEADER}\n- a\n- b"


def test_guideline_config_rejects_unknown_tag() -> None:
    with pytest.raises(ValueError, match="statemismatch"):
        GuidelineConfig(guidelines={"statemismatch": "x"})


# ---- EpisodeInterface ------------------------------------------------------------------------

ALL_ON = {
    "observation_lite": {"enable": True},
    "tool_feedback_evolution": {"enable": True},
    "diagnostic_evolution": {"enable": True, "lines": ["Check arguments."]},
}


def test_training_episode_gets_every_part() -> None:
    ei = EpisodeInterface.from_params({"rollout_mode": "sample", **ALL_ON}, category="multi_turn_base")
    assert ei.active == {"observation_lite": True, "tool_feedback_evolution": True, "diagnostic_evolution": True}
    assert ei.system_blocks() == [OBSERVATION_INSTRUCTION, render_guidelines(["Check arguments."])]
    assert ei.transform_tools(TOOLS) == observation_hints(TOOLS)
    assert ei.parse_error_feedback("bad", parser_mode="xml_json", tool_names=["ls"]).startswith("[Hint]")
    assert ei.tool_error_feedback("unknown function f", tool_names=["ls"]).startswith("[ToolHint]")


def test_validation_episode_is_untouched() -> None:
    ei = EpisodeInterface.from_params({"rollout_mode": "validate", **ALL_ON}, category="multi_turn_base")
    assert not any(ei.active.values())
    assert ei.system_blocks() == []
    out = ei.transform_tools(TOOLS)
    assert json.dumps(out) == json.dumps(TOOLS) and out is not TOOLS and out[0] is not TOOLS[0]
    assert ei.parse_error_feedback("bad", parser_mode="xml_json", tool_names=["ls"]) == ""
    assert ei.tool_error_feedback("unknown function f", tool_names=["ls"]) == ""


def test_apply_to_validation_and_category_filter() -> None:
    params = {
        "rollout_mode": "validate",
        "observation_lite": {"enable": True, "apply_to_validation": True, "instruction": "Note."},
        "tool_feedback_evolution": {"enable": True, "categories": ["multi_turn_base"], "apply_to_validation": True},
        "diagnostic_evolution": {"enable": True, "lines": []},
    }
    ei = EpisodeInterface.from_params(params, category="multi_turn_miss_param")
    assert ei.active == {"observation_lite": True, "tool_feedback_evolution": False, "diagnostic_evolution": False}
    assert ei.system_blocks() == ["Note."]
    on_train = EpisodeInterface.from_params({**params, "rollout_mode": "sample"}, category="multi_turn_miss_param")
    assert on_train.system_blocks() == ["Note."]  # empty lines: no guideline block
    assert EpisodeInterface.from_params({}, category="x").active == dict.fromkeys(ei.active, False)


def test_from_params_errors_name_the_key() -> None:
    with pytest.raises(ValueError, match="state_path"):
        EpisodeInterface.from_params({"diagnostic_evolution": {"enable": True, "state_path": "x.json"}}, category="c")
    for mode in ("valdiate", "val", "test", "train"):  # one spelling per mode: sample, validate
        with pytest.raises(ValueError, match=r"rollout_mode must be one of \['sample', 'validate'\]"):
            EpisodeInterface.from_params({"rollout_mode": mode}, category="c")
    with pytest.raises(ValueError, match="categories"):
        EpisodeInterface.from_params({"observation_lite": {"categories": "multi_turn_base"}}, category="c")
    with pytest.raises(ValueError, match="lines"):
        EpisodeInterface.from_params({"diagnostic_evolution": {"lines": "one string"}}, category="c")


def test_diagnostic_block_with_trainer_selection_keys() -> None:
    """One config tree: the trainer's thresholds may ride in the block; the env ignores them."""
    block = {"enable": True, "apply_to_validation": False, "categories": None, "prevalence_threshold": 0.2,
             "reward_threshold": 0.5, "min_tag_count": 4, "max_lines": 2, "category_tags": True, "lines": ["x"]}
    cfg = GuidelineConfig.from_diagnostic_evolution(block)
    assert (cfg.prevalence_threshold, cfg.min_tag_count, cfg.max_lines, cfg.per_category) == (0.2, 4, 2, True)
    ei = EpisodeInterface.from_params({"diagnostic_evolution": block, "rollout_mode": "sample"}, category="c")
    assert ei.diagnostic.lines == ["x"] and ei.active["diagnostic_evolution"]
    with pytest.raises(ValueError, match="min_tag_count"):
        EpisodeInterface.from_params({"diagnostic_evolution": {**block, "min_tag_count": -1}}, category="c")
