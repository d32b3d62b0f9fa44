"""The Llama-3.1 / ToolACE prompt modes (``llama31_official_fc``, ``toolace_fc``) on real tasks:
what the model sees, how its calls are read, and full ground-truth episodes through the service."""

from __future__ import annotations

import json
from typing import Any

import pytest

from env_service.bfcl.episode import BfclEpisode, BfclParams
from env_service.kit.prompts import INVALID_TOOL_CALL_PREFIX
from env_service.client import EnvClient
from env_service.kit.oracle import ORACLE_REPLY, call_to_json

TASK = "multi_turn_base_0"
LLAMA31_SYSTEM = "Environment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024"


def python_list_message(calls: list[str]) -> str:
    """A turn's ground-truth calls as ToolACE writes them: ``[f(a=1), g(b='x')]``."""
    items = []
    for call in calls:
        obj = call_to_json(call, BfclEpisode.tool_parameters())
        items.append(obj["name"] + "(" + ", ".join(f"{k}={v!r}" for k, v in obj["arguments"].items()) + ")")
    return "[" + ", ".join(items) + "]"


def llama31_message(calls: list[str]) -> str:
    """A turn's ground-truth calls as Llama 3.1 writes them: raw JSON with ``parameters``."""
    objs = [{"name": o["name"], "parameters": o["arguments"]} for o in (call_to_json(c, BfclEpisode.tool_parameters()) for c in calls)]
    return json.dumps(objs[0] if len(objs) == 1 else objs)


WRITERS = {"toolace_fc": python_list_message, "llama31_official_fc": llama31_message}


def oracle(task: Any, mode: str) -> list[str]:
    messages: list[str] = []
    for calls in task.gt_turns:
        if calls:
            messages.append(WRITERS[mode](calls))
        messages.append(ORACLE_REPLY)
    return messages


# ----- rendering ------------------------------------------------------------------------------
def test_params_pair_parser_and_results_with_the_prompt_mode():
    assert (BfclParams().tool_call_parser, BfclParams().tool_result_mode) == ("xml_json", "bfcl_tool_response")
    llama = BfclParams(tool_prompt_mode="llama31_official_fc")
    assert (llama.tool_call_parser, llama.tool_result_mode, llama.observation_role) == \
        ("llama3_json", "llama31_official", "ipython")
    ace = BfclParams(tool_prompt_mode="toolace_fc")
    assert (ace.tool_call_parser, ace.tool_result_mode, ace.observation_role) == \
        ("python_list", "toolace_official_prompt", "ipython")
    explicit = BfclParams(tool_prompt_mode="toolace_fc", tool_call_parser="xml_json",
                             tool_result_mode="bfcl_tool_response")
    assert (explicit.tool_call_parser, explicit.observation_role) == ("xml_json", "user")  # an explicit key wins


def test_llama31_tools_go_into_the_user_message(store, inert):
    task = store.get(TASK)
    system, user = BfclEpisode(task, {"tool_prompt_mode": "llama31_official_fc"}, interface=inert).reset()
    assert system == {"role": "system", "content": LLAMA31_SYSTEM}
    text = user["content"]
    assert user["role"] == "user"
    assert text.startswith("Given the following functions, please respond with a JSON for a function call")
    assert '{"name": function name, "parameters": dictionary of argument name and its value}' in text
    for tool in task.tools:  # every doc, indented, each followed by a blank line
        assert json.dumps(tool, ensure_ascii=False, indent=4) + "\n\n" in text
    assert text.endswith("\n" + task.user_message(0).strip())
    assert "<tools>" not in text and "<tool_call>\n" not in text  # no Qwen preamble


def test_toolace_docs_in_the_system_prompt(store, inert):
    task = store.get(TASK)
    system, user = BfclEpisode(task, {"tool_prompt_mode": "toolace_fc"}, interface=inert).reset()
    lines = system["content"].split("\n")
    assert lines[0].startswith("You are an expert in composing functions.")
    assert "[func_name1(param_name1=param_value1, param_name2=param_value2), func_name2(param=value)]" in lines[3]
    start, end = lines.index("<tools>"), lines.index("</tools>")
    docs = [json.loads(line) for line in lines[start + 1:end]]
    assert docs == [{"name": t["name"], "description": t["description"], "arguments": t["parameters"]}
                    for t in task.tools]
    assert lines[start + 1] == json.dumps(docs[0], ensure_ascii=False, separators=(",", ":"))  # compact
    assert lines[-1] == 'Remember: output only a bracketed function-call list, e.g. [search(query="value")].'
    assert user == {"role": "user", "content": task.user_message(0)}


def test_interface_blocks_placement(store, recording):
    task = store.get(TASK)
    _, user = BfclEpisode(task, {"tool_prompt_mode": "llama31_official_fc"}, interface=recording).reset()
    assert user["content"].endswith("EXTRA BLOCK ONE\nEXTRA BLOCK TWO\n\n" + task.user_message(0))
    assert "[annotated]" in user["content"]
    system, _ = BfclEpisode(task, {"tool_prompt_mode": "toolace_fc"}, interface=recording).reset()
    assert system["content"].endswith('e.g. [search(query="value")].\n\nEXTRA BLOCK ONE\n\nEXTRA BLOCK TWO')


# ----- calls and observations -----------------------------------------------------------------
@pytest.mark.parametrize("mode, text", [
    ("toolace_fc", "I will move into the folder.\n[cd(folder='document'), ls(a=True)]"),
    ("toolace_fc", "cd(folder='document')"),
    ("toolace_fc", '{"name": "cd", "parameters": {"folder": "document"}}'),
    ("llama31_official_fc", '{"name": "cd", "parameters": {"folder": "document"}}'),
    ("llama31_official_fc", '<|python_tag|>[{"name": "cd", "parameters": {"folder": "document"}}]'),
    ("llama31_official_fc", '{"name": "cd", "parameters": {"folder": "document"}}; {"name": "ls", "parameters": {}}'),
])
def test_valid_calls_run_and_come_back_bare(store, inert, mode, text):
    ep = BfclEpisode(store.get(TASK), {"tool_prompt_mode": mode}, interface=inert)
    ep.reset()
    out = ep.step(text)
    assert ep.model_turns[0][0][0] == "cd(folder='document')"
    assert out.info["observation_role"] == "ipython" and out.info.get("bfcl_error_type") is None
    assert "<tool_response>" not in out.observation and out.observation.endswith("\n")
    assert out.observation.split("\n")[0] == '{"current_working_directory": "document"}'  # cd's result, bare
    assert ep.executor.instances["GorillaFileSystem"]._current_dir.name == "document"


@pytest.mark.parametrize("mode, text, fragment", [
    ("toolace_fc", "[cd(folder='document']", "Invalid Python function-call list"),
    ("toolace_fc", "[cd('document')]", "positional arguments"),
    ("toolace_fc", "[cd(folder=__import__('os').getcwd())]", "is not a literal"),
    ("toolace_fc", "[cd(folder='document'), 42]", "must be a call"),
    ("toolace_fc", '<tool_call>{"name": "cd", "arguments": {"folder": "document"}}</tool_call>',
     "<tool_call> tags are not used"),
    ("toolace_fc", "[cd(**{'folder': 'document'})]", "unpacking"),
    ("llama31_official_fc", '{"name": "cd", "parameters": {"folder": ', "Invalid tool call JSON"),
    ("llama31_official_fc", '{"name": "cd"}', "has no 'parameters'"),
    ("llama31_official_fc", "[1, 2]", "must be a JSON object"),
    ("llama31_official_fc", '<tool_call>{"name": "cd", "arguments": {}}</tool_call>', "<tool_call> tags are not used"),
])
def test_malformed_calls_are_one_line_tool_format_errors(store, inert, mode, text, fragment):
    ep = BfclEpisode(store.get(TASK), {"tool_prompt_mode": mode}, interface=inert)
    ep.reset()
    out = ep.step(text)
    assert out.observation.startswith(INVALID_TOOL_CALL_PREFIX) and fragment in out.observation
    assert "\n" not in out.observation  # one line, like any malformed call in the default mode
    assert out.info["bfcl_error_type"] == "parse_error" and not out.terminated
    assert ep.model_turns == [[]] and ep.turn == 0  # nothing ran, the turn did not advance


def test_literal_arguments_are_never_evaluated(store, inert, tmp_path):
    marker = tmp_path / "ran"
    ep = BfclEpisode(store.get(TASK), {"tool_prompt_mode": "toolace_fc"}, interface=inert)
    ep.reset()
    out = ep.step(f"[cd(folder=open({str(marker)!r}, 'w').write('x'))]")
    assert out.info["bfcl_error_type"] == "parse_error" and not marker.exists()


# ----- full episodes through the service ------------------------------------------------------
@pytest.fixture(scope="module")
def client():
    c = EnvClient.in_process(workers=0)
    yield c
    c.close()


@pytest.mark.parametrize("mode", ["toolace_fc", "llama31_official_fc"])
@pytest.mark.parametrize("task_id", ["multi_turn_base_0", "multi_turn_miss_func_0", "multi_turn_miss_param_3"])
def test_oracle_episode_scores_one(store, client, mode, task_id):
    task = store.get(task_id)
    created = client.create(task_id, {"tool_prompt_mode": mode})
    assert created.info["observation_role"] == "ipython" and created.info["tool_prompt_mode"] == mode
    result = None
    for text in oracle(task, mode):
        result = client.step(created.instance_id, text)
        assert not result.observation.startswith(INVALID_TOOL_CALL_PREFIX), result.observation
        assert result.info["observation_role"] == "ipython"
    assert result is not None and result.terminated and result.reward == 1.0
    full = client.evaluate(created.instance_id, sparse=False)
    assert full["valid"] and set(full["failure_tags"]) <= {"pass", "correct_abstention"}
    client.release(created.instance_id)


def test_http_step_state_carries_the_ipython_role():
    from fastapi.testclient import TestClient

    from env_service.app import create_app
    from env_service.service import ServiceConfig

    with TestClient(create_app(ServiceConfig(workers=0))) as http:
        body = {"env_type": "bfcl", "task_id": TASK, "params": {"tool_prompt_mode": "toolace_fc"}}
        created = http.post("/create", json=body).json()["data"]
        assert created["info"]["observation_role"] == "ipython"
        step = http.post("/step", json={"instance_id": created["info"]["instance_id"],
                                        "messages": {"role": "assistant", "content": "[pwd()]"}}).json()["data"]
        assert step["state"][0]["role"] == "ipython"
        assert json.loads(step["state"][0]["content"]) == {"current_working_directory": "/workspace"}
        plain = http.post("/create", json={"env_type": "bfcl", "task_id": TASK}).json()["data"]
        step = http.post("/step", json={"instance_id": plain["info"]["instance_id"],
                                        "messages": {"role": "assistant", "content": "Hello."}}).json()["data"]
        assert plain["info"]["observation_role"] == "user" and step["state"][0]["role"] == "user"
