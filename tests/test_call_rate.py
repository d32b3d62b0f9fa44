"""scripts/call_rate.py: calls made where a turn needs one, closing lines said instead, abstentions."""

from __future__ import annotations

import importlib.util
import sys
from types import SimpleNamespace

from seal.config import REPO_ROOT

_spec = importlib.util.spec_from_file_location("call_rate", REPO_ROOT / "scripts" / "call_rate.py")
cr = sys.modules["call_rate"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cr)

CALL = '<tool_call>\n{"name": "add_item", "arguments": {"text": "x"}}\n</tool_call>'


def _messages(*turns: tuple[str, list[str]]) -> list[dict]:
    out = [{"role": "system", "content": "tools"}]
    for user, replies in turns:
        out.append({"role": "user", "content": user})
        for r in replies:
            out.append({"role": "assistant", "content": r})
            if "<tool_call>" in r:
                out.append({"role": "user", "content": "<tool_response>\n{}\n</tool_response>"})
    return out


def test_turns_are_split_at_the_tasks_user_messages():
    task = SimpleNamespace(user_turns=["Add x.", "Thanks!", "Add y."], gt_turns=[["add_item(text='x')"], [],
                                                                               ["add_item(text='y')"]])
    record = {"messages": _messages(("Add x.", [CALL, "Done."]), ("Thanks!", ["Done."]), ("Add y.", ["Done."]))}
    assert cr.turns_of(record["messages"], task.user_turns) == [[CALL, "Done."], ["Done."], ["Done."]]
    counts = cr.TurnCounts()
    cr.count_episode(counts, record, task)
    summary = counts.as_dict()
    assert summary["call_rate"] == 0.5 and summary["closed_instead"] == 0.5 and summary["abstained"] == 1.0
    assert counts.first_words["Done."] == 1


def test_turns_never_reached_are_counted_apart():
    task = SimpleNamespace(user_turns=["Add x.", "Add y."], gt_turns=[["a()"], ["b()"]])
    counts = cr.TurnCounts()
    cr.count_episode(counts, {"messages": _messages(("Add x.", ["Sure!"]))}, task)
    assert counts.unplayed == 1 and counts.needs_call == 1 and counts.called == 0 and counts.closed_first == 1
