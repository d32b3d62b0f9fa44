"""Prompt rendering: the ``bfcl_qwen_fc`` system prompt and observation formats (golden structure)."""

from __future__ import annotations

import json

import pytest

from env_service.bfcl.episode import MISS_FUNC_SENTENCE, render_revealed_functions
from seal_shared.calls import call_to_string
from env_service.kit.prompts import (
    render_invalid_tool_call,
    render_system_prompt, render_tool_responses,
)

TOOLS = [
    {"name": "ls", "description": "List.", "parameters": {"type": "dict", "properties": {}, "required": []}},
    {"name": "cd", "description": "Change dir.", "parameters": {"type": "dict", "properties": {
        "folder": {"type": "string", "description": "Target."}}, "required": ["folder"]}},
]


def test_system_prompt_golden_structure():
    prompt = render_system_prompt(TOOLS)
    expected = (
        "# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        "<tools>\n"
        + json.dumps(TOOLS[0]) + "\n"
        + json.dumps(TOOLS[1]) + "\n"
        "</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n"
        "<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n'
        "</tool_call>"
    )
    assert prompt == expected


def test_system_prompt_tools_are_one_json_line_each(store):
    task = store.get("multi_turn_base_0")
    prompt = render_system_prompt(task.tools)
    inner = prompt.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0].split("\n")
    assert [json.loads(line) for line in inner] == task.tools


def test_extra_blocks_follow_after_a_blank_line():
    prompt = render_system_prompt(TOOLS, ["Observation note: be exact.", "", "  # Guidelines\n- one  "])
    assert prompt.endswith("</tool_call>\n\nObservation note: be exact.\n\n# Guidelines\n- one")


def test_tool_responses_and_hints():
    assert render_tool_responses(["a", '{"x": 1}']) == \
        "<tool_response>\na\n</tool_response>\n<tool_response>\n{\"x\": 1}\n</tool_response>\n"
    out = render_tool_responses(["ok", "Error during execution: bad"], ["", "[ToolHint] fix it"])
    assert out == ("<tool_response>\nok\n</tool_response>\n<tool_response>\nError during execution: bad\n"
                   "</tool_response>\n[ToolHint] fix it\n")
    with pytest.raises(ValueError):
        render_tool_responses(["a"], [])


def test_invalid_call_revealed_functions_and_call_strings():
    assert render_invalid_tool_call("bad JSON") == "[ERROR] Invalid tool call format: bad JSON"
    assert render_invalid_tool_call("bad", "[Hint] x") == "[ERROR] Invalid tool call format: bad\n[Hint] x"
    docs = [{"name": "sort", "description": "Sort."}]
    assert render_revealed_functions(docs) == str(docs) + "\n" + MISS_FUNC_SENTENCE
    assert MISS_FUNC_SENTENCE == "I have updated some more functions you can choose from. What about now?"
    assert call_to_string("cd", {"folder": "a'b", "n": -1, "flag": True, "x": None}) == \
        "cd(folder=\"a'b\", n=-1, flag=True, x=None)"
