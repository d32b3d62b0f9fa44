"""The episode protocol: reset, step, turn advance, hold-out reveal, step limit, scoring, params."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from env_service.bfcl.episode import MISS_FUNC_SENTENCE, BfclEpisode, BfclParams
from env_service.kit import EpisodeTerminatedError
from env_service.kit.prompts import CONVERSATION_COMPLETED


def call(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def episode(store, interface, tid="multi_turn_base_0", **params) -> BfclEpisode:
    return BfclEpisode(store.get(tid), params, interface=interface)


def test_reset_returns_system_and_first_user_message(store, inert):
    task = store.get("multi_turn_base_0")
    ep = BfclEpisode(task, {}, interface=inert)
    system, user = ep.reset()
    assert system["role"] == "system" and system["content"].startswith("# Tools\n")
    assert json.dumps(task.tools[0]) in system["content"]
    assert user == {"role": "user", "content": task.entry["question"][0][0]["content"]}


def test_tool_calls_execute_and_do_not_advance(store, inert):
    ep = episode(store, inert)
    out = ep.step(call("cd", folder="document") + "\n" + call("pwd"))
    assert not out.terminated and ep.turn == 0
    assert out.observation == ('<tool_response>\n{"current_working_directory": "document"}\n</tool_response>\n'
                               '<tool_response>\n{"current_working_directory": "/workspace/document"}\n'
                               '</tool_response>\n')
    assert ep.model_turns == [[["cd(folder='document')", "pwd()"]]]
    assert "bfcl_error_type" not in out.info


def test_parse_error_rejects_the_whole_message(store, inert):
    ep = episode(store, inert)
    out = ep.step(call("mkdir", dir_name="new") + "<tool_call>{broken}</tool_call>")
    assert out.observation.startswith("[ERROR] Invalid tool call format: Invalid tool call JSON")
    assert out.info["bfcl_error_type"] == "parse_error" and not out.terminated and ep.turn == 0
    assert ep.model_turns == [[]]  # nothing recorded, and the valid mkdir did not run:
    assert "new" not in ep.step(call("ls")).observation
    assert ep.events["parse_errors"] == 1 and ep.events["rejected_calls"] == 1


def test_unavailable_and_malformed_tools_are_rejected(store, inert):
    ep = episode(store, inert)
    out = ep.step(call("get_stock_info", symbol="X") + call("ls"))
    assert out.observation == ("[ERROR] Invalid tool call format: "
                               "Tool 'get_stock_info' is not available in the current tool list.")
    assert ep.events["unavailable_tool_calls"] == 1 and ep.model_turns == [[]]
    bad = ep.step(call("os.system", command="ls"))
    assert "is not a valid function name" in bad.observation and bad.info["bfcl_error_type"] == "parse_error"
    open_ep = episode(store, inert, enforce_available_tools=False)
    out = open_ep.step(call("get_stock_info", symbol="X"))
    assert "Error during execution: name 'get_stock_info' is not defined" in out.observation
    assert out.info["bfcl_error_type"] == "tool_error"


def test_turns_advance_and_the_episode_completes(store, inert):
    task = store.get("multi_turn_base_0")
    ep = BfclEpisode(task, {}, interface=inert)
    for k in range(1, len(task.gt_turns)):
        out = ep.step("I am done with this request.")
        assert out.observation == task.entry["question"][k][0]["content"] and ep.turn == k
    out = ep.step("Bye.")
    assert out.observation == CONVERSATION_COMPLETED and out.terminated and ep.completed
    assert ep.evaluate() == 0.0  # the host scores a finished episode with evaluate(sparse=True)
    with pytest.raises(EpisodeTerminatedError, match="terminated"):
        ep.step("more")
    assert issubclass(EpisodeTerminatedError, ValueError)  # a caller error: the service answers 4xx


def test_miss_func_turn_reveals_held_out_tools(store, inert):
    task = store.get("multi_turn_miss_func_0")  # `sort` is held out until turn 3
    ep = BfclEpisode(task, {}, interface=inert)
    assert "sort" not in ep.offered
    for _ in range(2):
        ep.step("ok")
    early = ep.step(call("sort", file_name="final_report.pdf"))
    assert "Tool 'sort' is not available" in early.observation
    out = ep.step("I cannot do that yet.")
    assert out.observation == str(task.held_out[3]) + "\n" + MISS_FUNC_SENTENCE
    assert out.info["revealed_tools"] and "sort" in ep.offered
    assert not ep.step(call("sort", file_name="final_report.pdf")).observation.startswith("[ERROR]")


def test_step_limit_force_terminates_like_bfcl(store, inert):
    ep = episode(store, inert)
    for _ in range(20):
        assert not ep.step(call("pwd")).terminated
    out = ep.step(call("pwd"))  # BFCL quits once the step count exceeds 20
    assert out.terminated and out.observation == CONVERSATION_COMPLETED and out.info["force_terminated"]
    result = ep.evaluate(sparse=False)
    assert result["error_type"] == "multi_turn:force_terminated" and result["terminated_early"]
    assert result["terminated_reason"] == "max_steps_per_turn"


def test_step_limit_on_the_last_turn_is_scored_normally(store, inert, oracle):
    task = store.get("multi_turn_base_46")  # a single-turn task
    assert len(task.gt_turns) == 1
    ep = BfclEpisode(task, {"max_steps_per_turn": 1}, interface=inert)
    gt_message = oracle(task)[0]
    ep.step(gt_message)
    out = ep.step(gt_message.replace("\n", " "))  # the second step exceeds the limit of 1
    assert out.terminated and out.info["force_terminated"]
    assert ep.evaluate(sparse=False)["error_type"] != "multi_turn:force_terminated"


def test_terminate_on_parse_error_forces_zero(store, inert, oracle):
    ep = episode(store, inert, terminate_on_parse_error=True)
    out = ep.step("<tool_call>nope</tool_call>")
    assert out.terminated and out.observation == CONVERSATION_COMPLETED
    assert out.info["bfcl_force_zero_reward"] and ep.evaluate() == 0.0
    assert ep.evaluate(sparse=False)["valid"] is False


def test_open_query_ends_at_the_first_turn_advance(store, inert):
    ep = episode(store, inert, is_open_query=True)
    out = ep.step("done")
    assert out.terminated and out.observation == CONVERSATION_COMPLETED and not ep.completed


def test_full_evaluation_dict(store, inert, oracle):
    task = store.get("multi_turn_miss_param_0")
    ep = BfclEpisode(task, {}, interface=inert)
    ep.step("<tool_call>{bad}</tool_call>")
    ep.step(call("cd", folder="no_such_dir"))
    for text in oracle(task):
        out = ep.step(text)
    assert out.terminated and ep.evaluate() == 1.0
    result = ep.evaluate(sparse=False)
    json.dumps(result)  # JSON-safe
    assert result["valid"] and result["accuracy"] == 1.0 and result["error_type"] is None
    assert len(result["failure_tags"]) == len(task.gt_turns) == len(result["per_turn_valid"])
    assert set(result["failure_tags"]) <= {"pass", "correct_abstention"}
    assert result["passed_turns"] == result["scorable_turns"] and result["progress"] == 1.0
    ev = result["events"]
    assert ev["parse_errors"] == 1 and ev["tool_errors"] == 1 and ev["tool_calls_accepted"] >= 1
    assert result["turn_events"][0]["parse_errors"] == 1
    assert result["turn_events"][0]["gt_calls"] == [c.split("(")[0] for c in task.gt_turns[0]]
    assert any("no_such_dir" in m for m in result["error_messages"])
    assert result["completed"] and result["turn_count"] == len(task.gt_turns)
    assert result["bfcl_progress_info"]["failure_tags"] == result["failure_tags"]


def test_failed_episode_is_diagnosed_per_turn(store, inert):
    task = store.get("multi_turn_miss_param_0")
    ep = BfclEpisode(task, {}, interface=inert)
    while not ep.terminated:
        ep.step(call("pwd") if ep.steps_in_turn == 0 else "next")
    result = ep.evaluate(sparse=False)
    assert (result["valid"], result["error_type"], result["failed_turn"]) == \
        (False, "multi_turn:instance_state_mismatch", 0)
    # Tags go on past the first failure: the missing mkdir/mv keep every later state wrong, and
    # the pwd() on the abstention turn is a spurious call.
    assert result["failure_tags"] == ["spurious_tool_call" if not gt else "state_mismatch" for gt in task.gt_turns]
    assert result["passed_turns"] == 0 and result["irrelevance_turns"] == 1


def test_the_episode_verdict_is_the_checkers(store, inert):
    """The episode judges with BFCL's checker (its verdict hook): error type, message, failed turn and
    details equal check_episode's on the same calls, where the kit's default rule words them otherwise."""
    from env_service.bfcl.checker import check_episode

    task = store.get("multi_turn_miss_param_0")
    ep = BfclEpisode(task, {}, interface=inert)
    while not ep.terminated:
        ep.step(call("pwd") if ep.steps_in_turn == 0 else "next")
    checker = check_episode(ep.model_turns, task.gt_turns, task.entry).to_dict()
    result = ep.evaluate(sparse=False)
    assert {k: result[k] for k in checker} == checker
    assert checker["details"]["differences"] and "does not match" in checker["error_message"]


def test_interface_parts_reach_the_text(store, recording):
    ep = episode(store, recording)
    system = ep.reset()[0]["content"]
    assert "[annotated]" in system and system.endswith("</tool_call>\n\nEXTRA BLOCK ONE\n\nEXTRA BLOCK TWO")
    bad = ep.step("<tool_call>x</tool_call>")
    assert bad.observation.endswith("\n[Hint] tools: " + str(len(ep.offered)))
    assert recording.parse_calls[0][1] == "xml_json"
    out = ep.step(call("cd", folder="missing"))
    assert out.observation.endswith("</tool_response>\n[ToolHint] check the arguments\n")


def test_other_parser_modes_and_lenient_parsing(store, inert):
    ep = episode(store, inert, tool_call_parser="python_list")
    assert "document" in ep.step("[cd(folder='document')]").observation
    lenient = episode(store, inert, strict_tool_parser=False)
    out = lenient.step(call("cd", folder="document") + '<tool_call>{"name": "ls"}</tool_call>')
    assert "document" in out.observation and lenient.events["parse_errors"] == 1


def test_params_validation():
    assert BfclParams().enforce_available_tools is True and BfclParams().max_steps_per_turn == 20
    assert BfclParams(tool_call_parser="toolace_fc").tool_call_parser == "python_list"
    BfclParams.model_validate({"data_path": "x", "model_name": "m", "sparse": True})
    with pytest.raises(ValidationError, match="unknown episode params key\\(s\\): colour"):
        BfclParams.model_validate({"colour": "red"})
    with pytest.raises(ValidationError, match="tool_call_parser"):
        BfclParams(tool_call_parser="yaml")
    with pytest.raises(ValidationError, match="tool_prompt_mode"):
        BfclParams(tool_prompt_mode="llama4_fc")
    with pytest.raises(ValidationError):
        BfclParams(max_steps_per_turn=0)


def test_real_interface_wiring(store):
    pytest.importorskip("seal_shared.interface")
    task = store.get("multi_turn_base_0")
    lite = {"observation_lite": {"enable": True}}
    train = BfclEpisode(task, {**lite, "rollout_mode": "sample"}).reset()[0]["content"]
    val = BfclEpisode(task, {**lite, "rollout_mode": "validate"}).reset()[0]["content"]
    plain = BfclEpisode(task, {}).reset()[0]["content"]
    assert "[required]" in train and "[required]" not in val
    assert val == plain  # validation sees the untouched environment
    assert "[required]" not in json.dumps(task.tools)  # the store's docs are never changed


def test_reset_restarts_with_fresh_backends(store, inert):
    ep = episode(store, inert)
    first = ep.reset()
    ep.step(call("mkdir", dir_name="gone"))
    ep.step("next")
    again = ep.reset()
    assert again == first and ep.turn == 0 and ep.model_turns == [[]] and ep.events["steps"] == 0
    assert "gone" not in ep.step(call("ls")).observation
