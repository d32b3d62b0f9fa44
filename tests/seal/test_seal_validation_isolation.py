"""Validation isolation: with rollout_mode="validate", every interface part on or off gives a
byte-identical prompt and byte-identical observations; in training the prompt does change.

Drives real ``BfclEpisode`` objects with the same scripted assistant messages: the ground-truth
calls of every turn, plus a malformed tool call, a call to a tool that is not offered, a call
that makes the backend return an error, and (miss_func) the turn that reveals held-out tools.
"""

from __future__ import annotations

import ast
import json

import pytest

from env_service.bfcl.episode import BfclEpisode
from env_service.bfcl.tasks import default_store
from seal_shared.interface import GUIDELINES_HEADER, OBSERVATION_INSTRUCTION

TASKS = ["multi_turn_base_0", "multi_turn_miss_func_0", "multi_turn_miss_param_1", "multi_turn_long_context_2"]
GUIDELINE = "Check every argument before calling."


def _params(mode: str, on: bool) -> dict:
    return {
        "rollout_mode": mode,
        "observation_lite": {"enable": on, "add_type_hint": True},
        "tool_feedback_evolution": {"enable": on},
        "diagnostic_evolution": {"enable": on, "lines": [GUIDELINE]},
    }


def _as_tool_call(call: str) -> str:
    node = ast.parse(call, mode="eval").body
    assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
    return "<tool_call>\n" + json.dumps({"name": node.func.id, "arguments": args}) + "\n</tool_call>"


def _script(task_id: str) -> list[str]:
    """Assistant messages: error probes in the first turn, then each turn's ground truth."""
    task = default_store().get(task_id)
    messages = [
        '<tool_call>{"name": "ls", "arguments": {"a": tru</tool_call>',  # parse error
        '<tool_call>{"name": "no_such_tool", "arguments": {}}</tool_call>',  # not offered
        _as_tool_call("cd(folder='no_such_directory_xyz')"),  # backend error
    ]
    for turn in task.gt_turns:
        messages += [_as_tool_call(c) for c in turn]
        messages.append("Done.")  # no tool call: next turn (or the end)
    return messages


def _transcript(task_id: str, params: dict) -> list[str]:
    episode = BfclEpisode(default_store().get(task_id), params)
    texts = [m["content"] for m in episode.reset()]
    for content in _script(task_id):
        out = episode.step(content)
        texts.append(out.observation)
        if out.terminated:
            break
    texts.append(json.dumps(episode.evaluate(sparse=False), sort_keys=True, default=str))
    return texts


@pytest.mark.parametrize("task_id", TASKS)
def test_validation_is_byte_identical_with_interface_on_or_off(task_id: str) -> None:
    on = _transcript(task_id, _params("validate", True))
    off = _transcript(task_id, _params("validate", False))
    assert len(on) == len(off)
    for i, (a, b) in enumerate(zip(on, off)):
        assert a.encode() == b.encode(), f"message {i} differs"


@pytest.mark.parametrize("task_id", TASKS)
def test_script_exercises_the_error_paths(task_id: str) -> None:
    """Guards the test above: the script really produces each kind of error observation."""
    texts = _transcript(task_id, _params("sample", True))
    assert texts[2].startswith("[ERROR] Invalid tool call format:") and "[Hint]" in texts[2]
    assert "is not available" in texts[3] and "[Hint] Call only tools" in texts[3]
    assert "[ToolHint]" in texts[4]
    held_out = default_store().get(task_id).held_out
    assert bool(held_out) == ("miss_func" in task_id)
    for docs in held_out.values():  # the reveal turn was reached and its docs shown
        assert any(all(repr(d["name"]) in t for d in docs) for t in texts[5:-1])


@pytest.mark.parametrize("task_id", TASKS)
def test_training_prompt_and_observations_change(task_id: str) -> None:
    train = _transcript(task_id, _params("sample", True))
    val_on = _transcript(task_id, _params("validate", True))
    assert OBSERVATION_INSTRUCTION in train[0] and GUIDELINES_HEADER in train[0] and GUIDELINE in train[0]
    assert "[required]" in train[0]
    for text in (val_on[0], val_on[2], val_on[3], val_on[4]):
        assert "[Hint]" not in text and "[ToolHint]" not in text
    assert OBSERVATION_INSTRUCTION not in val_on[0] and "[required]" not in val_on[0]
    assert train[0] != val_on[0]
    assert train[1] == val_on[1]  # the user's request itself is never changed
    assert train[2] != val_on[2] and train[4] != val_on[4]  # recovery feedback only in training
