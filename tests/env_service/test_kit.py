"""The environment kit (``env_service.kit``): an environment that is only its tools, its tasks, its
per-turn check and one registration; its own parser and tool-error rule; a world with its own
executor, check and verdict (``tests/plugins/ledger_env.py``); the evaluation builder's verdicts and
tags; the tool box's safety; the registration's derived params check and blocks."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from env_service.client import EnvClient, EnvServiceError
from env_service.kit import (
    RESPONSE_MISMATCH, EpisodeParams, InterfaceParams, ParseResult, Task, TaskStore, ToolBox, ToolCall, ToolEpisode,
    TurnCheck, build_evaluation, ground_truth_replies, register_tool_environment, tool_docs,
)
from env_service.registry import Environment, get_environment, register_environment, unregister_environment


class Counter:
    """A counter that reports its failures as text starting with ``FAILED``."""

    def __init__(self) -> None:
        self.value = 0

    def state(self) -> dict[str, int]:
        return {"value": self.value}

    def add(self, amount: int, tags: list[str] | None = None) -> str:
        """Add to the counter.

        Args:
            amount: how much to add (positive).
            tags: labels, ignored.
        """
        if amount <= 0:
            return "FAILED: amount must be positive"
        self.value += amount
        return f"value={self.value}"

    def read(self) -> int:
        """Read the counter."""
        return self.value

    def crash(self) -> int:
        """A tool with a bug."""
        return 1 // 0


TASKS = [Task(id="count_0", category="add", split="train", user_turns=["Add 2.", "Thanks."],
              gt_turns=[["add(amount=2)"], []], tools=tool_docs([Counter])),
         Task(id="count_1", category="read", split="val", user_turns=["Read it.", "Add 1."],
              gt_turns=[["read()"], ["add(amount=1)"]], tools=tool_docs([Counter]))]
CALL = re.compile(r"CALL (\w+)\s*(\{.*?\})?$", re.M)


class CounterEpisode(ToolEpisode):
    """Calls are lines ``CALL name {json args}`` (the environment's own parser); the counter's
    ``FAILED`` texts are its tool errors (its own rule)."""

    params_model = InterfaceParams

    def start(self) -> ToolBox:
        return ToolBox({"counter": Counter()}, is_error=lambda value: str(value).startswith("FAILED"))

    def parse(self, content: str) -> ParseResult:
        try:
            calls = [ToolCall(name, json.loads(args or "{}")) for name, args in CALL.findall(content)]
        except ValueError as err:
            return ParseResult(errors=[f"bad arguments: {err}"])
        return ParseResult(calls=calls)


@pytest.fixture
def counter() -> Iterator[str]:
    register_tool_environment("counter", episode=CounterEpisode, tasks=TaskStore(TASKS, env="counter"))
    try:
        yield "counter"
    finally:
        unregister_environment("counter")


def test_an_environment_is_its_tools_tasks_check_and_one_registration(counter: str) -> None:
    env = get_environment(counter)
    assert env.load_split("val") == ["count_1"] and env.task_store().get("count_0").category == "add"
    assert env.interface_blocks == ("observation_lite", "tool_feedback_evolution", "diagnostic_evolution")
    with pytest.raises(ValueError, match="bogus"):
        env.check_params({"bogus": 1})
    with EnvClient.in_process(env=counter) as client:
        created = client.create("count_1", {"rollout_mode": "validate"})
        assert "Read the counter." in created.messages[0]["content"]
        assert client.step(created.instance_id, 'CALL read').observation == "<tool_response>\n0\n</tool_response>\n"
        client.step(created.instance_id, "Zero.")
        client.step(created.instance_id, 'CALL add {"amount": 1}')
        done = client.step(created.instance_id, "Done.")
        assert done.terminated and done.reward == 1.0
        result = client.evaluate(created.instance_id)
        assert result["failure_tags"] == ["pass", "pass"] and result["model_turns"] == [[["read()"]], [["add(amount=1)"]]]
        with pytest.raises(EnvServiceError, match="unknown counter task id 'count_9'"):
            client.create("count_9")


def test_the_oracle_names_positional_arguments_with_the_environments_own_tools(counter: str) -> None:
    """A ground-truth call with positional arguments is played as keyword JSON named by the
    episode's ``tool_parameters`` (the counter's tool docs), through ``/v1/oracle`` as well."""
    task = Task(id="count_p", category="add", split="train", user_turns=["Add 2."], gt_turns=[["add(2)"]],
                tools=tool_docs([Counter]))
    played = {"name": "add", "arguments": {"amount": 2}}
    assert CounterEpisode.oracle(task) == [f"<tool_call>\n{json.dumps(played)}\n</tool_call>", "Done."]
    with EnvClient.in_process(env=counter) as client:
        gt, messages = client.oracle("count_0", "xml_json")
    assert messages == CounterEpisode.oracle(get_environment(counter).task_store().get("count_0")) and gt[0]
    with pytest.raises(KeyError, match="no tool 'sub'"):
        CounterEpisode.oracle(Task(id="x", category="add", split="train", user_turns=["?"], gt_turns=[["sub(1)"]],
                                   tools=tool_docs([Counter])))


def test_the_registry_is_the_one_record_of_a_kit_environment(counter: str) -> None:
    """The oracle and the judge find the episode class in the registration itself: a name
    registered again without one answers neither (no second table keeps the old class)."""
    from dataclasses import replace

    from env_service.catalogue import judge, oracle

    assert get_environment(counter).episode is CounterEpisode and oracle(counter, "count_1", "xml_json")[0]
    register_environment(replace(get_environment(counter), episode=None), replace=True)
    for ask in (lambda: oracle(counter, "count_1", "xml_json"), lambda: judge(counter, "count_1", [])):
        with pytest.raises(ValueError, match="was not registered with env_service.kit.register_tool_environment"):
            ask()


def test_the_declared_tool_error_rule_drives_the_counts_and_hints(counter: str) -> None:
    with EnvClient.in_process(env=counter) as client:
        created = client.create("count_0", {"rollout_mode": "sample", "tool_feedback_evolution": {"enable": True}})
        out = client.step(created.instance_id, 'CALL add {"amount": -1}\nCALL crash\nCALL add {"amount": 2, "tags": ["x"]}')
        assert out.info["tool_errors"] == 2 and out.observation.count("[ToolHint]") == 2
        assert "ZeroDivisionError" in out.observation and "value=2" in out.observation
        refused = client.step(created.instance_id, 'CALL add {"amount": "2"}')
        assert "argument 'amount' must be int" in refused.observation and refused.info["tool_errors"] == 1
        bad = client.step(created.instance_id, "CALL add {nope}")
        assert bad.observation.startswith("[ERROR] Invalid tool call format: bad arguments") and "[Hint]" in bad.observation


@pytest.fixture
def ledger(import_plugin) -> ModuleType:
    """``tests/plugins/ledger_env.py`` imported fresh (it registers ``ledger``), unregistered after."""
    return import_plugin("ledger_env", "ledger")


def _call(name: str, **arguments: object) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def test_a_world_with_its_own_executor_declares_its_tool_errors(ledger: ModuleType) -> None:
    with EnvClient.in_process(env="ledger") as client:
        for task in ledger.TASKS:
            created = client.create(task.id, {"rollout_mode": "validate"})
            for reply in ground_truth_replies(task):
                out = client.step(created.instance_id, reply)
            assert out.terminated and out.reward == 1.0, task.id
        created = client.create("ledger_0", {"rollout_mode": "sample", "tool_feedback_evolution": {"enable": True}})
        declined = client.step(created.instance_id, _call("transfer", source="bob", target="alice", amount=500))
        # status 2 in plain text: a tool error because the engine said so, with the recovery hint
        assert declined.info["tool_errors"] == 1 and declined.info["bfcl_error_type"] == "tool_error"
        assert "declined: bob holds 20" in declined.observation and "[ToolHint]" in declined.observation
        moved = client.step(created.instance_id, _call("transfer", source="alice", target="bob", amount=30))
        assert moved.info["tool_errors"] == 0 and "[ToolHint]" not in moved.observation
        result = client.evaluate(created.instance_id)
        assert result["turns"][0]["errors"] == ["declined: bob holds 20"] and result["events"]["tool_errors"] == 1
    world = ledger.LedgerWorld({"bob": 1})
    assert world.run("audit()").error == "unknown" and world.run("balance('bob')").error == "unknown"
    assert world.run("balance(account=bob)").error == "parse" and world.run("deposit(account='bob')").error == "arguments"


def test_the_verdict_hook_and_model_turns(ledger: ModuleType) -> None:
    """The ledger's own check reads ``model_turns``; its verdict hook passes a turn whose balances are
    right though the model read back the wrong account (the default rule fails it)."""
    episode = ledger.LedgerEpisode(ledger.TASKS[0], {})
    for reply in [_call("transfer", source="alice", target="bob", amount=30), "Done.",
                  _call("balance", account="alice"), "Done."]:
        episode.step(reply)
    assert episode.model_turns == [[["transfer(source='alice', target='bob', amount=30)"]],
                                   [["balance(account='alice')"]]]
    result = episode.evaluate(sparse=False)
    assert result["valid"] and result["failure_tags"] == ["pass", "response_mismatch"]
    default = build_evaluation(episode.checks(), played_turns=2)
    assert not default["valid"] and default["error_type"] == RESPONSE_MISMATCH and default["failed_turn"] == 1
    assert ledger.LedgerTask(id="x", category="c", split=None, user_turns=["a"], gt_turns=[[]]).balances == {}


def test_plain_episode_params_honour_no_interface_block() -> None:
    class Plain(CounterEpisode):
        params_model = EpisodeParams

    assert Plain.interface_blocks() == ()
    with pytest.raises(ValueError, match="observation_lite"):
        Plain.check_params({"observation_lite": {"enable": True}})


def _check(gt: list[str], model: list[str], state: bool | None, response: bool | None = None) -> TurnCheck:
    return TurnCheck.of(gt_calls=gt, model_calls=model, state_valid=state, response_valid=response)


def test_build_evaluation_verdicts_and_tags() -> None:
    ok = _check(["f()"], ["f()"], True, True)
    result = build_evaluation([ok, _check([], ["g()"], True)], played_turns=2)
    assert result["valid"] and result["failure_tags"] == ["pass", "spurious_tool_call"]  # read-only: tagged, passes
    assert result["per_turn_valid"] == [True, None] and result["irrelevance_per_turn"] == [None, False]
    changed = build_evaluation([ok, _check([], ["g()"], False)], played_turns=2)
    assert changed["error_type"] == "multi_turn:instance_state_mismatch" and changed["failed_turn"] == 1
    missing = build_evaluation([_check(["f()"], ["f()"], True, False), _check(["f()"], [], None)], played_turns=2)
    assert missing["error_type"] == "multi_turn:execution_response_mismatch" and missing["failed_turn"] == 0
    assert missing["failure_tags"] == ["response_mismatch", "empty_turn_model_response"]
    short = build_evaluation([ok, ok], played_turns=1)
    assert short["error_type"] == "multi_turn:force_terminated" and short["failed_turn"] is None
    assert short["passed_turns"] == 2 and short["progress"] == 1.0
    custom = build_evaluation([ok], played_turns=1, judge=lambda check, k: ("mine", f"turn {k}", {"calls": 1}))
    assert custom["error_message"] == "turn 0" and not custom["valid"] and custom["details"] == {"calls": 1}


def test_tasks_and_tool_boxes_refuse_mistakes() -> None:
    with pytest.raises(ValueError, match="2 user turns and 1 ground-truth turns"):
        Task(id="x", category="c", split="train", user_turns=["a", "b"], gt_turns=[[]])
    with pytest.raises(ValueError, match="split 'dev'"):
        Task(id="x", category="c", split="dev", user_turns=["a"], gt_turns=[[]])
    with pytest.raises(ValueError, match="appears twice"):
        TaskStore(TASKS + TASKS[:1], env="counter")
    with pytest.raises(ValueError, match="unknown split"):
        TaskStore(TASKS, env="counter").load_split("dev")
    with pytest.raises(TypeError, match="needs a state"):
        ToolBox({"x": object()})
    box = ToolBox({"counter": Counter()})
    assert box.run("__import__('os').system('true')").error == "parse"
    assert box.run("state()").error == "unknown" and box.state() == {"counter": {"value": 0}}
    task = Task(id="p", category="c", split="val", user_turns=["a"], gt_turns=[["add(2)"]])
    with pytest.raises(ValueError, match="positional"):
        ground_truth_replies(task)
    assert ground_truth_replies(TASKS[0]) == ['<tool_call>\n{"name": "add", "arguments": {"amount": 2}}\n</tool_call>',
                                              "Done.", "Done."]


def test_the_kit_host_path_names_only_kit_environments() -> None:
    from env_service.host import EpisodeHost, load_host_factory

    assert get_environment("bfcl").host_factory == "env_service.kit.hosts:bfcl"  # BFCL is a kit environment
    assert isinstance(load_host_factory("env_service.kit.hosts:bfcl")(), EpisodeHost)
    register_environment(Environment(name="plain", host_factory="elsewhere:host", load_split=lambda split: [],
                                     task_store=lambda: TaskStore(TASKS, env="plain")))
    try:
        with pytest.raises(ValueError, match="not registered with env_service.kit"):
            load_host_factory("env_service.kit.hosts:plain")()
    finally:
        unregister_environment("plain")
    with pytest.raises(ValueError, match="unknown environment 'nowhere'"):
        load_host_factory("env_service.kit.hosts:nowhere")()
    import env_service.kit.hosts as hosts

    assert not hasattr(hosts, "__all__")



def test_the_extending_guide_walks_through_the_plugin_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every code block of docs/extending.md's environment walk-through is code of tests/plugins/home_env.py
    or ledger_env.py (``...`` marks a cut), and its experiment config composes with home_env as its plug-in."""
    from seal.config import compose_config

    root = Path(__file__).resolve().parents[2]
    guide = (root / "docs" / "extending.md").read_text()
    section = guide[guide.index("## Adding an environment"):guide.index("## Adding a failure tag")]
    source = "".join((root / "tests" / "plugins" / name).read_text() for name in ("home_env.py", "ledger_env.py"))
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) >= 4
    for block in blocks:
        for chunk in re.split(r"^\s*\.\.\.\n", block, flags=re.M):
            assert chunk in source, chunk
    (yaml,) = re.findall(r"```yaml\n(.*?)```", section, re.S)
    (tmp_path / "home.yaml").write_text(yaml)
    monkeypatch.syspath_prepend(str(root / "tests" / "plugins"))
    try:
        cfg = compose_config(str(tmp_path / "home.yaml"), [])
        assert cfg.env_service.env == "home" and cfg.env_service.home.max_steps_per_turn == 5
    finally:
        unregister_environment("home")
        sys.modules.pop("home_env", None)


def test_the_trainers_view_follows_a_replaced_registration(counter: str) -> None:
    """``seal.environment`` caches the catalogue an in-process service gives; registering the name
    again with other tasks is seen at once (the cache is keyed by the registry's changes)."""
    from seal.environment import catalogue_of, check_env_params, standing_client

    assert catalogue_of(counter).categories == {"count_0": "add", "count_1": "read"}
    assert catalogue_of(counter).tool_parameters["add"] == ["amount", "tags"]
    assert "bogus" in (check_env_params(counter, {"bogus": 1}) or "")
    first = standing_client(counter)
    assert first.judge("count_0", [[["add(amount=2)"]], []])["valid"] is True
    assert standing_client(counter) is first
    renamed = [Task(id="tally_0", category="sum", split="train", user_turns=["Add 3."], gt_turns=[["add(amount=3)"]],
                    tools=tool_docs([Counter]))]
    unregister_environment(counter)
    register_tool_environment(counter, episode=CounterEpisode, tasks=TaskStore(renamed, env=counter))
    assert catalogue_of(counter).categories == {"tally_0": "sum"}
    # The stale service is stopped, not left with a loop thread idling for the process's life.
    assert standing_client(counter) is not first and not first._local._thread.is_alive()


def test_evicted_and_stale_standing_services_are_closed(counter: str) -> None:
    """Every standing in-process service built before a registration change is stopped at the next
    request for any of them, and the least recently used one beyond the few kept is stopped when
    another is made: none is left with a loop thread idling for the process's life."""
    from dataclasses import replace

    from seal.environment import standing_client

    def alive(client: EnvClient) -> bool:
        return client._local._thread.is_alive()

    stale = standing_client(counter, ("json",))
    register_environment(replace(get_environment(counter)), replace=True)  # a registration change
    kept = [standing_client(counter, (module,)) for module in ("math", "string", "textwrap", "random", "sys")]
    assert not alive(stale), "a service of an older registry, never asked for again, still runs"
    assert not alive(kept[0]) and all(alive(c) for c in kept[1:])
    assert standing_client(counter, ("sys",)) is kept[-1]
