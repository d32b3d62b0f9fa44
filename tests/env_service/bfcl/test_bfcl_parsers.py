"""Tool-call parsers: every mode and every error path."""

from __future__ import annotations

import pytest

from env_service.kit.parsers import NO_VALID_BLOCK, ToolCall, parse_tool_calls


def block(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


# ----- xml_json --------------------------------------------------------------------------------
def test_xml_json_parses_blocks_and_keeps_the_content():
    text = "Let me look.\n\n" + block('{"name": "ls", "arguments": {"a": true}}') + "\n" + \
        block('{"name": "cd", "arguments": "{\\"folder\\": \\"x\\"}"}')
    r = parse_tool_calls(text)
    assert r.ok and r.calls == [ToolCall("ls", {"a": True}), ToolCall("cd", {"folder": "x"})]
    assert r.content == "Let me look."


def test_xml_json_nested_braces_and_no_calls():
    r = parse_tool_calls(block('{"name": "f", "arguments": {"d": {"k": [1, {"z": 2}]}}}'))
    assert r.calls == [ToolCall("f", {"d": {"k": [1, {"z": 2}]}})]
    plain = parse_tool_calls("All done, nothing else to do.")
    assert plain.ok and plain.calls == [] and plain.content == "All done, nothing else to do."


def test_xml_json_arguments_past_the_depth_limit_are_refused():
    # The arguments object is level 1 and every value inside counts: the innermost [] of 199 nested
    # lists sits at level 200 (allowed), the 1 inside 199 nested objects at level 201 (refused).
    def call(value: str) -> str:
        return block('{"name": "f", "arguments": {"a": ' + value + "}}")

    refused = ["the 'arguments' of 'f' are nested deeper than 200 levels"]
    assert parse_tool_calls(call("[" * 199 + "]" * 199)).ok
    assert parse_tool_calls(call("[" * 200 + "]" * 200)).errors == refused
    assert parse_tool_calls(call('{"k": ' * 198 + "1" + "}" * 198)).ok
    assert parse_tool_calls(call('{"k": ' * 199 + "1" + "}" * 199)).errors == refused


def test_xml_json_tag_text_without_a_valid_block():
    r = parse_tool_calls("<tool_call>ls()</tool_call>")
    assert r.errors == [NO_VALID_BLOCK] and r.calls == []
    assert parse_tool_calls("<tool_call>ls()</tool_call>", strict=False).errors == []


def test_xml_json_strict_rejects_every_call_on_any_error():
    text = block('{"name": "ls", "arguments": {}}') + block('{"name": "cd", "arguments": {oops}}')
    r = parse_tool_calls(text)
    assert r.calls == [] and r.rejected == [ToolCall("ls", {})]
    assert len(r.errors) == 1 and r.errors[0].startswith("Invalid tool call JSON:")
    lenient = parse_tool_calls(text, strict=False)
    assert lenient.calls == [ToolCall("ls", {})] and len(lenient.errors) == 1


@pytest.mark.parametrize("body, fragment", [
    ('{"arguments": {}}', "without a 'name'"),
    ('{"name": "", "arguments": {}}', "without a 'name'"),
    ('{"name": "ls"}', "has no 'arguments'"),
    ('{"name": "ls", "arguments": [1]}', "must be a JSON object"),
    ('{"name": "ls", "arguments": "not json"}', "is not valid JSON"),
    ('{"name": "ls", "arguments": "[1, 2]"}', "must be a JSON object"),
])
def test_xml_json_call_errors(body, fragment):
    r = parse_tool_calls(block(body))
    assert r.calls == [] and len(r.errors) == 1 and fragment in r.errors[0]


def test_xml_json_stray_tag_text_next_to_a_valid_block_is_ignored():
    # As in the release, tag text is an error only when no block matched at all.
    r = parse_tool_calls(block('{"name": "ls", "arguments": {}}') + "<tool_call>[1]</tool_call>")
    assert r.calls == [ToolCall("ls", {})] and r.errors == []


def test_xml_json_options():
    params = block('{"name": "ls", "parameters": {"a": 1}}')
    assert "has no 'arguments'" in parse_tool_calls(params).errors[0]
    assert parse_tool_calls(params, accept_parameters_as_arguments=True).calls == [ToolCall("ls", {"a": 1})]

    mixed = "I will call ls.\n" + block('{"name": "ls", "arguments": {}}')
    assert parse_tool_calls(mixed).ok
    r = parse_tool_calls(mixed, reject_tool_call_with_content=True)
    assert r.calls == [] and "not allowed" in r.errors[0]

    py = block('{"name": "ls", "arguments": {"a": True}}')
    assert "true/false/null" not in parse_tool_calls(py).errors[0]
    assert "true/false/null" in parse_tool_calls(py, flag_python_literals_in_tool_json=True).errors[0]


# ----- python_list -----------------------------------------------------------------------------
def test_python_list_mode():
    r = parse_tool_calls("[cd(folder='x'), ls(a=True, n=-1)]", "python_list")
    assert r.calls == [ToolCall("cd", {"folder": "x"}), ToolCall("ls", {"a": True, "n": -1})]
    assert parse_tool_calls("```python\nls()\n```", "python_list").calls == [ToolCall("ls", {})]
    assert parse_tool_calls("I am done.", "toolace_fc").calls == []


@pytest.mark.parametrize("text, fragment", [
    ("[sort('a.txt')]", "positional arguments"),
    ("[ls(**kw)]", "'**' unpacking"),
    ("[ls(a=x)]", "is not a literal"),
    ("[ls(a=__import__('os'))]", "is not a literal"),
    ("[os.system(a=1)]", "must be a call like"),
    ("[ls(a=1), 3]", "must be a call like"),
    ("[ls(a=1]", "Invalid Python function-call list"),
])
def test_python_list_errors(text, fragment):
    r = parse_tool_calls(text, "python_list")
    assert r.calls == [] and any(fragment in e for e in r.errors), r.errors


# ----- llama3_json -----------------------------------------------------------------------------
def test_llama3_json_mode():
    one = parse_tool_calls('{"name": "ls", "parameters": {"a": 1}}', "llama3_json")
    assert one.calls == [ToolCall("ls", {"a": 1})]
    many = parse_tool_calls('[{"name": "ls", "parameters": {}}, {"name": "cd", "arguments": {"folder": "x"}}]',
                            "llama3_json")
    assert many.calls == [ToolCall("ls", {}), ToolCall("cd", {"folder": "x"})]
    lines = parse_tool_calls('{"name": "ls", "parameters": {}}\n{"name": "pwd", "parameters": {}}', "llama31_official_fc")
    assert [c.name for c in lines.calls] == ["ls", "pwd"]
    assert parse_tool_calls("Finished.", "llama3_json").calls == []


@pytest.mark.parametrize("text, fragment", [
    ('{"name": "ls", "parameters": {', "Invalid tool call JSON"),
    ('{"parameters": {}}', "without a 'name'"),
    ('{"name": "ls"}', "has no 'parameters'"),
    ('<tool_call>{"name": "ls", "parameters": {}}</tool_call>', "not used in this format"),
])
def test_llama3_json_errors(text, fragment):
    r = parse_tool_calls(text, "llama3_json")
    assert r.calls == [] and any(fragment in e for e in r.errors), r.errors


def test_unknown_mode_and_bad_input():
    with pytest.raises(ValueError, match="unknown tool_call_parser"):
        parse_tool_calls("x", "yaml")
    with pytest.raises(TypeError):
        parse_tool_calls(None)  # type: ignore[arg-type]
