"""``instance_mismatch`` fires where the release fires it: no model call of the turn executed on a
backend (the release's model instances of such a turn are ``{}``), never on a turn that ran one."""

from __future__ import annotations

from env_service.bfcl.checker import check_episode
from env_service.bfcl.episode import BfclEpisode
from env_service.kit.oracle import ORACLE_REPLY, tool_call_message
from seal_shared.tags import TurnEvidence, classify_turn
from seal_shared.types import FailureTag

_OK = dict(gt_error=False, gt_empty=False, model_called=True, model_empty=False, instances_match=True,
           state_valid=True, response_valid=True)


def tag_turn(**evidence) -> str:
    return classify_turn(TurnEvidence(**evidence))


def _play(task, params, inert, messages):
    ep = BfclEpisode(task, params, interface=inert)
    ep.reset()
    outs = [ep.step(m) for m in messages]
    return ep, outs


def test_rule_priority():
    assert tag_turn(**_OK) == FailureTag.PASS
    assert tag_turn(**_OK, model_executed=False) == FailureTag.INSTANCE_MISMATCH
    # after the empty-turn and ground-truth rules, before the state check
    assert tag_turn(**{**_OK, "model_empty": True}, model_executed=False) == FailureTag.EMPTY_TURN_MODEL_RESPONSE
    assert tag_turn(**{**_OK, "gt_empty": True}, model_executed=False) == FailureTag.SPURIOUS_TOOL_CALL
    assert tag_turn(**{**_OK, "state_valid": False}, model_executed=False) == FailureTag.INSTANCE_MISMATCH


def test_turn_whose_only_call_is_refused_before_running(store, inert):
    """Default params: the model calls an offered tool with arguments over this environment's
    limits, so no backend method runs in turn 0; then it stops."""
    task = store.get("multi_turn_base_15")
    ep, outs = _play(task, {}, inert, [
        tool_call_message(["power(base=10, exponent=1000000000000)"], BfclEpisode.tool_parameters()), ORACLE_REPLY])
    assert outs[0].info["bfcl_error_type"] == "tool_error" and ep.model_turns[0] == [["power(base=10, exponent=1000000000000)"]]
    result = ep.evaluate(sparse=False)
    assert result["failure_tags"][0] == "instance_mismatch"
    assert result["valid"] is False and result["error_type"] == "multi_turn:force_terminated"


def test_unknown_tool_without_enforcement(store, inert):
    """With enforce_available_tools off, a call to a name no backend has reaches the executor and
    fails there (BFCL: NameError); the turn never touched an instance."""
    task = store.get("multi_turn_base_0")
    gt = task.gt_turns
    parameters = BfclEpisode.tool_parameters()
    messages = ['<tool_call>{"name": "frobnicate", "arguments": {"level": 1}}</tool_call>', ORACLE_REPLY]
    for calls in gt[1:]:
        messages += [tool_call_message(calls, parameters), ORACLE_REPLY] if calls else [ORACLE_REPLY]
    ep, outs = _play(task, {"enforce_available_tools": False}, inert, messages)
    assert "name 'frobnicate' is not defined" in outs[0].observation and outs[-1].terminated
    tags = ep.evaluate(sparse=False)["failure_tags"]
    assert tags[0] == "instance_mismatch"
    assert "instance_mismatch" not in tags[1:]  # later turns ran their calls


def test_one_executed_call_is_enough(store, inert):
    """A refused call next to one that ran: the turn has instances, so the state/response checks tag it."""
    task = store.get("multi_turn_base_0")
    check = check_episode([[["frobnicate(level=1)", "cd(folder='document')"]], [], [], []], task.gt_turns, task.entry)
    assert check.tags[0] in {FailureTag.STATE_MISMATCH, FailureTag.RESPONSE_MISMATCH}
    refused = check_episode([[["frobnicate(level=1)"], ["_private()"]], [], [], []], task.gt_turns, task.entry)
    assert refused.tags[0] == FailureTag.INSTANCE_MISMATCH
    assert refused.error_type == check.error_type  # BFCL's verdict is untouched by the tag rule
