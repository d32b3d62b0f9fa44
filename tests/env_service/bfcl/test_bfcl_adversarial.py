"""Hostile tool-call strings execute nothing; concurrent episodes never share state."""

from __future__ import annotations

import json
import threading

from env_service.bfcl.episode import BfclEpisode
from env_service.bfcl.executor import Executor


def _payloads(marker: str) -> list[str]:
    write = f"__import__('pathlib').Path({marker!r}).write_text('x')"
    return [
        write,
        f"pwd({write})",
        f"ls(a={write})",
        "ls(a=(lambda: 1)())",
        f"ls(a=[open({marker!r}, 'w') for _ in range(1)])",
        "ls(a=9**9**9)",
        "ls(a=10**100)",
        f"ls(a={'9' * 400})",
        "os.system('echo hacked')",
        "ls.__class__()",
        "x.__class__.__bases__[0].__subclasses__()",
        "__class__()",
        "__import__('os')",
        "globals()",
        "getattr(ls, '__globals__')",
        "eval('1+1')",
        "exec('import os')",
        "victim_multi_turn_base_0_GorillaFileSystem_instance.pwd()",
        "ls()[0]",
        "ls(); pwd()",
        "ls(a=f'{1}')",
    ]


def test_hostile_call_strings_execute_nothing(store, tmp_path):
    marker = str(tmp_path / "INJECTED")
    task = store.get("multi_turn_base_0")
    ex = Executor(task.involved_classes, task.entry["initial_config"], task.long_context)
    before = ex.execute(["pwd()", "ls()"])
    for payload in _payloads(marker):
        (result,) = ex.execute([payload])
        assert result.startswith("Error during execution: "), (payload, result)
    assert not (tmp_path / "INJECTED").exists()
    assert ex.execute(["pwd()", "ls()"]) == before  # no state change either


def test_hostile_messages_through_the_episode(store, inert, tmp_path):
    marker = str(tmp_path / "INJECTED")
    task = store.get("multi_turn_base_0")
    py = BfclEpisode(task, {"tool_call_parser": "python_list"}, interface=inert)
    listing = py.executor.execute(["ls()"])
    for payload in _payloads(marker):
        out = py.step(f"[{payload}]")
        assert out.observation.startswith(("[ERROR] Invalid tool call format", "<tool_response>\nError during")) \
            or "Error during execution" in out.observation, (payload, out.observation)
        assert not out.terminated
    xml = BfclEpisode(task, {"enforce_available_tools": False}, interface=inert)
    for name, args in [("__import__", {"name": "os"}), ("os.system", {"command": "ls"}),
                       ("ls(); __import__('os').system", {"a": 1}), ("ls", {"a=1, b": 2}),
                       ("ls", {"__class__": 1}), ("eval", {"source": "1"})]:
        out = xml.step("<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>")
        assert "Error" in out.observation or out.observation.startswith("[ERROR]"), (name, out.observation)
    assert not (tmp_path / "INJECTED").exists()
    assert py.executor.execute(["ls()"]) == listing == xml.executor.execute(["ls()"])


def test_concurrent_episodes_of_the_same_task_are_isolated(store, inert):
    task = store.get("multi_turn_base_0")
    rounds = 15  # steps per turn stay under the 20-step limit
    results: dict[str, list[str]] = {}
    errors: list[BaseException] = []

    def drive(tag: str) -> None:
        try:
            for _ in range(8):
                ep = BfclEpisode(task, {}, interface=inert)
                ep.step('<tool_call>{"name": "cd", "arguments": {"folder": "document"}}</tool_call>')
                for i in range(rounds):
                    ep.step('<tool_call>' + json.dumps({"name": "mkdir", "arguments": {"dir_name": f"{tag}{i}"}})
                            + '</tool_call>')
                results[tag] = [ep.step('<tool_call>{"name": "ls", "arguments": {}}</tool_call>').observation,
                                json.dumps(ep.evaluate(sparse=False)["model_turns"])]
        except BaseException as e:  # surfaced in the main thread below
            errors.append(e)

    threads = [threading.Thread(target=drive, args=(tag,)) for tag in ("alpha", "beta")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for mine, other in (("alpha", "beta"), ("beta", "alpha")):
        listing, turns = results[mine]
        assert f"{mine}0" in listing and f"{mine}{rounds - 1}" in listing
        assert other not in listing and other not in turns
