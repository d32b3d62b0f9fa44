"""``home``: an environment written outside the project, plugged in through ``seal.plugins`` only.

A smart-home app (rooms with a temperature and a light), six two-turn tasks, its own tool-call
parser, executor and checker, and one :func:`env_service.registry.register_environment` call. It
imports nothing private of the project: the registry, the host, and the tag rules of
:mod:`seal.tags`. Tests load it with ``seal.plugins: [home_env]`` / ``--plugin home_env``.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from typing import Any

from env_service.host import EpisodeHost, OpError
from env_service.registry import Environment, register_environment
from seal.tags import TurnEvidence, classify_turn

ROOMS = {"kitchen": {"temp": 19, "light": False}, "bedroom": {"temp": 21, "light": True}}
TOOLS = [
    {"name": "get_room", "description": "Read a room's temperature and light.",
     "parameters": {"type": "dict", "properties": {"room": {"type": "string"}}, "required": ["room"]}},
    {"name": "set_temperature", "description": "Set a room's temperature in degrees Celsius.",
     "parameters": {"type": "dict", "properties": {"room": {"type": "string"}, "degrees": {"type": "integer"}},
                    "required": ["room", "degrees"]}},
    {"name": "set_light", "description": "Switch a room's light on or off.",
     "parameters": {"type": "dict", "properties": {"room": {"type": "string"}, "on": {"type": "boolean"}},
                    "required": ["room", "on"]}},
]


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


@dataclass(frozen=True)
class HomeTask:
    id: str
    category: str
    split: str
    users: tuple[str, ...]
    gt: tuple[tuple[dict[str, Any], ...], ...]


TASKS = {t.id: t for t in [
    HomeTask("home_0", "climate", "train", ("Make the kitchen 22 degrees.", "And turn its light on."),
             ((_call("set_temperature", room="kitchen", degrees=22),), (_call("set_light", room="kitchen", on=True),))),
    HomeTask("home_1", "climate", "train", ("Set the bedroom to 18.", "Thanks, that's all."),
             ((_call("set_temperature", room="bedroom", degrees=18),), ())),
    HomeTask("home_2", "lights", "train", ("Lights off in the bedroom.", "Kitchen light on too."),
             ((_call("set_light", room="bedroom", on=False),), (_call("set_light", room="kitchen", on=True),))),
    HomeTask("home_3", "lights", "train", ("Is the bedroom light on?", "Switch it off."),
             ((_call("get_room", room="bedroom"),), (_call("set_light", room="bedroom", on=False),))),
    HomeTask("home_4", "climate", "val", ("Kitchen to 20 degrees please.", "Bedroom to 20 as well."),
             ((_call("set_temperature", room="kitchen", degrees=20),),
              (_call("set_temperature", room="bedroom", degrees=20),))),
    HomeTask("home_5", "lights", "val", ("Turn on the kitchen light.", "No, nothing else."),
             ((_call("set_light", room="kitchen", on=True),), ())),
]}
SPLITS = {"train": ["home_0", "home_1", "home_2", "home_3"], "val": ["home_4", "home_5"], "test": ["home_5"],
          "eval": ["home_4", "home_5"]}
_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


class Home:
    """The app: every method returns JSON text; ``{"error": ...}`` on a bad call."""

    def __init__(self) -> None:
        self.rooms = copy.deepcopy(ROOMS)

    def run(self, call: dict[str, Any]) -> tuple[str, bool]:
        """``(result text, executed)``; only the three tools with well-typed arguments execute."""
        name, args = call.get("name"), call.get("arguments") or {}
        room = self.rooms.get(args.get("room")) if isinstance(args, dict) else None
        if room is None:
            return json.dumps({"error": f"{name}: unknown room"}), False
        if name == "get_room" and set(args) == {"room"}:
            return json.dumps(room), True
        if name == "set_temperature" and type(args.get("degrees")) is int and set(args) == {"room", "degrees"}:
            room["temp"] = args["degrees"]
            return json.dumps(room), True
        if name == "set_light" and type(args.get("on")) is bool and set(args) == {"room", "on"}:
            room["light"] = args["on"]
            return json.dumps(room), True
        return json.dumps({"error": f"{name}: bad call"}), False


def parse(content: str) -> list[dict[str, Any]] | str:
    """The calls of an assistant message, or the reason it does not parse (JSON only, never code)."""
    calls = []
    for block in _BLOCK.findall(content):
        try:
            call = json.loads(block)
        except ValueError as err:
            return f"bad tool call JSON: {err}"
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return 'a tool call needs {"name": ..., "arguments": {...}}'
        calls.append(call)
    return calls


@dataclass
class Outcome:
    observation: str
    terminated: bool
    info: dict[str, Any]


class HomeEpisode:
    """One rollout: the protocol of the project's episodes (``reset``, ``step``, ``evaluate``, ``info``)."""

    def __init__(self, task: HomeTask) -> None:
        self.task, self.home, self.turn, self.done = task, Home(), 0, False
        self.model_turns: list[list[list[str]]] = [[]]

    def reset(self) -> list[dict[str, str]]:
        system = ("You control a smart home. Tools:\n<tools>\n" + "\n".join(json.dumps(t) for t in TOOLS)
                  + '\n</tools>\nCall a tool with <tool_call>{"name": ..., "arguments": {...}}</tool_call>; '
                  "reply without a call when the request is done.")
        return [{"role": "system", "content": system}, {"role": "user", "content": self.task.users[0]}]

    def step(self, content: str) -> Outcome:
        if self.done:
            raise ValueError("the episode has ended; create a new one")
        calls = parse(content)
        if isinstance(calls, str):
            return Outcome(f"[ERROR] {calls}", False, {"error_type": "parse_error"})
        if calls:
            self.model_turns[self.turn].append([json.dumps(c, sort_keys=True) for c in calls])
            results = [self.home.run(c)[0] for c in calls]
            return Outcome("\n".join(f"<tool_response>\n{r}\n</tool_response>" for r in results), False, {})
        if self.turn + 1 == len(self.task.users):
            self.done = True
            return Outcome("[CONVERSATION_COMPLETED]", True, {"turn_advanced": True})
        self.turn += 1
        self.model_turns.append([])
        return Outcome(self.task.users[self.turn], False, {"turn_advanced": True})

    def evaluate(self, sparse: bool = True) -> float | dict[str, Any]:
        result = check(self.task, self.model_turns)
        return result["accuracy"] if sparse else {**result, "category": self.task.category,
                                                  "terminated_reason": "completed" if self.done else None}

    def info(self) -> dict[str, Any]:
        return {"task_id": self.task.id, "category": self.task.category, "turn": self.turn}


def check(task: HomeTask, model_turns: list[list[list[str]]]) -> dict[str, Any]:
    """Replay both sides turn by turn on fresh homes; one :mod:`seal.tags` tag per ground-truth turn."""
    mine, truth, tags, passed, scorable = Home(), Home(), [], 0, 0
    for k, gt in enumerate(task.gt):
        calls = [json.loads(c) for step in (model_turns[k] if k < len(model_turns) else []) for c in step]
        executed = [mine.run(c)[1] for c in calls]
        gt_ok = all(truth.run(c)[1] for c in gt)
        evidence = TurnEvidence(gt_error=not gt_ok, gt_empty=not gt, model_called=bool(calls),
                                model_empty=not calls, instances_match=True, model_executed=any(executed),
                                state_valid=mine.rooms == truth.rooms, response_valid=True)
        tags.append(classify_turn(evidence))
        scorable += bool(gt)
        passed += bool(gt) and evidence.passed
    valid = len(model_turns) == len(task.gt) and all(t in ("pass", "correct_abstention") for t in tags)
    return {"valid": valid, "accuracy": float(valid), "error_type": None if valid else "home:mismatch",
            "failure_tags": tags, "passed_turns": passed, "scorable_turns": scorable,
            "progress": passed / scorable if scorable else 0.0}


def make_episode(task_id: str, params: dict[str, Any]) -> HomeEpisode:
    if params.keys() - {"rollout_mode"}:
        raise ValueError(f"unknown home params {sorted(params.keys() - {'rollout_mode'})}; known: rollout_mode")
    if task_id not in TASKS:
        raise OpError("not_found", f"task {task_id!r} not found (ids look like 'home_0')")
    return HomeEpisode(TASKS[task_id])


def home_host() -> EpisodeHost:
    return EpisodeHost(make_episode)


class _Store:
    def get(self, task_id: str) -> HomeTask:
        return TASKS[task_id]

    def ids(self) -> list[str]:
        return list(TASKS)

    def __contains__(self, task_id: object) -> bool:
        return task_id in TASKS


def oracle_replies(task_id: str) -> list[str]:
    """The assistant messages that play a task's ground truth (calls, then a plain reply, per turn)."""
    out = []
    for gt in TASKS[task_id].gt:
        out += [f"<tool_call>{json.dumps(c)}</tool_call>" for c in gt] + ["Done."]
    return out


ENVIRONMENT = register_environment(Environment(
    name="home", host_factory="home_env:home_host", task_store=_Store, load_split=lambda s: list(SPLITS[s]),
    description="a smart home (tests' plug-in environment)", example_task_id="home_0",
    check_params=lambda block: make_episode("home_0", dict(block)) and None))
