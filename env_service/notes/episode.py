"""One ``notes`` episode, its task store and its per-episode parameters.

Protocol (the BFCL episode's, so the same episode runner, prompt format and interface apply):
``reset()`` gives ``[system, first user message]`` (the task's tool docs in the ``<tools>``
system prompt); ``step(text)`` parses ``<tool_call>{json}</tool_call>`` blocks with the project's
parser, runs the calls on this episode's apps and answers ``<tool_response>`` blocks; a reply
without calls ends the turn (the next user message, or ``[CONVERSATION_COMPLETED]`` after the
last); ``evaluate(sparse)`` replays the accepted calls through :mod:`env_service.notes.checker`.

Interface evolution comes from :class:`seal.interface.EpisodeInterface`, built from the same
``observation_lite`` / ``tool_feedback_evolution`` / ``diagnostic_evolution`` params as BFCL's.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from env_service.bfcl.interface_params import check_block
from env_service.bfcl.parsers import parse_tool_calls
from env_service.bfcl.prompts import (
    CONVERSATION_COMPLETED, call_to_string, render_initial_messages, render_invalid_tool_call,
    render_tool_responses,
)
from env_service.host import EpisodeHost, OpError
from env_service.notes.checker import World, check_episode
from env_service.notes.tools import tool_docs

TASKS_FILE = Path(__file__).with_name("tasks.jsonl")
SPLITS = ("train", "val", "test", "eval")


@dataclass(frozen=True)
class NotesTask:
    """One task: the apps involved, their starting state, a user message and ground truth per turn."""

    id: str
    category: str
    split: str
    classes: list[str]
    initial_state: dict[str, Any]
    user_turns: list[str]
    gt_turns: list[list[str]]
    tools: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> NotesTask:
        return cls(id=record["id"], category=record["category"], split=record["split"],
                   classes=list(record["classes"]), initial_state=record["initial_state"],
                   user_turns=[t["user"] for t in record["turns"]], gt_turns=[list(t["gt"]) for t in record["turns"]],
                   tools=tool_docs(list(record["classes"])))


class NotesStore:
    """Every task of ``tasks.jsonl``, by id (read-only)."""

    def __init__(self, tasks: list[NotesTask]) -> None:
        self._tasks = {t.id: t for t in tasks}

    @classmethod
    def load(cls, path: Path = TASKS_FILE) -> NotesStore:
        with path.open(encoding="utf-8") as fh:
            return cls([NotesTask.from_record(json.loads(line)) for line in fh if line.strip()])

    def get(self, task_id: str) -> NotesTask:
        try:
            return self._tasks[task_id]
        except KeyError:
            raise KeyError(f"unknown notes task id {task_id!r} (ids look like 'notes_000')") from None

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._tasks

    def __len__(self) -> int:
        return len(self._tasks)

    def ids(self, split: str | None = None) -> list[str]:
        wanted = {"val", "test"} if split == "eval" else {split}
        return [t.id for t in self._tasks.values() if split is None or t.split in wanted]


@functools.cache
def default_store() -> NotesStore:
    return NotesStore.load()


def load_split(split: str) -> list[str]:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
    return default_store().ids(split)


class NotesParams(BaseModel):
    """The per-episode ``params`` of a notes episode (``env_service.notes`` in the config)."""

    model_config = ConfigDict(extra="forbid")

    rollout_mode: str = "validate"
    max_steps_per_turn: int = Field(10, ge=1)
    observation_lite: dict[str, Any] | None = None
    tool_feedback_evolution: dict[str, Any] | None = None
    diagnostic_evolution: dict[str, Any] | None = None

    @field_validator("observation_lite", "tool_feedback_evolution", "diagnostic_evolution", mode="before")
    @classmethod
    def _interface_block(cls, v: Any, info: ValidationInfo) -> dict[str, Any] | None:
        return check_block(info.field_name, v)


@dataclass
class StepOutcome:
    observation: str
    terminated: bool
    info: dict[str, Any]


class NotesEpisode:
    """One rollout of one notes task (see the module docstring)."""

    def __init__(self, task: NotesTask, params: NotesParams | dict[str, Any] | None = None) -> None:
        from seal.interface import EpisodeInterface

        self.task = task
        self.params = params if isinstance(params, NotesParams) else NotesParams.model_validate(params or {})
        self.interface = EpisodeInterface.from_params(self.params.model_dump(), category=task.category)
        self.reset()

    def reset(self) -> list[dict[str, str]]:
        self.world = World(self.task.classes, self.task.initial_state)
        self.tools = self.interface.transform_tools(self.task.tools)
        self.offered = [t["name"] for t in self.tools]
        self.model_turns: list[list[list[str]]] = [[]]
        self.turn = self.steps_in_turn = 0
        self.terminated, self.terminated_reason = False, None
        return render_initial_messages("bfcl_qwen_fc", self.tools, self.task.user_turns[0],
                                       self.interface.system_blocks())

    def step(self, content: str) -> StepOutcome:
        if self.terminated:
            raise ValueError(f"episode of {self.task.id} has terminated ({self.terminated_reason}); create a new one")
        parsed = parse_tool_calls(content, "xml_json", strict=True)
        if parsed.errors:
            reason = " ".join(parsed.errors)
            hint = self.interface.parse_error_feedback(reason, parser_mode="xml_json", tool_names=self.offered)
            return self._outcome(render_invalid_tool_call(reason, hint), {"error_type": "parse_error"})
        if not parsed.calls:
            return self._advance()
        unavailable = [c.name for c in parsed.calls if c.name not in self.offered]
        if unavailable:
            reason = f"Tool '{unavailable[0]}' is not available in the current tool list."
            hint = self.interface.parse_error_feedback(reason, parser_mode="xml_json", tool_names=self.offered)
            return self._outcome(render_invalid_tool_call(reason, hint), {"error_type": "unavailable_tool"})
        calls = [call_to_string(c.name, c.arguments) for c in parsed.calls]
        results = [self.world.run(call).text for call in calls]
        self.model_turns[self.turn].append(calls)
        self.steps_in_turn += 1
        failed = [r.startswith("Error") or r.startswith('{"error"') for r in results]
        hints = [self.interface.tool_error_feedback(r, tool_names=self.offered) if bad else ""
                 for r, bad in zip(results, failed)]
        if self.steps_in_turn > self.params.max_steps_per_turn:
            self._end("max_steps_per_turn")
            return self._outcome(CONVERSATION_COMPLETED, {"force_terminated": True})
        return self._outcome(render_tool_responses(results, hints), {"tool_calls": len(calls),
                                                                     "tool_errors": sum(failed)})

    def _advance(self) -> StepOutcome:
        if self.turn + 1 >= len(self.task.gt_turns):
            self._end("completed")
            return self._outcome(CONVERSATION_COMPLETED, {"turn_advanced": True})
        self.turn += 1
        self.steps_in_turn = 0
        self.model_turns.append([])
        return self._outcome(self.task.user_turns[self.turn], {"turn_advanced": True})

    def _end(self, reason: str) -> None:
        self.terminated, self.terminated_reason = True, reason

    def _outcome(self, observation: str, info: dict[str, Any]) -> StepOutcome:
        info.update(turn=self.turn, steps_in_turn=self.steps_in_turn, terminated_reason=self.terminated_reason,
                    observation_role="user")
        return StepOutcome(observation, self.terminated, info)

    def evaluate(self, sparse: bool = True) -> float | dict[str, Any]:
        result = check_episode(self.model_turns, self.task)
        if sparse:
            return result["accuracy"]
        return {**result, "task_id": self.task.id, "test_id": self.task.id, "category": self.task.category,
                "turn_count": self.turn + 1, "num_turns": len(self.task.gt_turns),
                "completed": self.terminated_reason == "completed", "terminated_reason": self.terminated_reason,
                "model_turns": [[list(step) for step in turn] for turn in self.model_turns]}

    def info(self) -> dict[str, Any]:
        return {"task_id": self.task.id, "category": self.task.category, "turn": self.turn,
                "num_turns": len(self.task.gt_turns), "steps_in_turn": self.steps_in_turn,
                "terminated": self.terminated, "terminated_reason": self.terminated_reason,
                "tools": list(self.offered), "observation_role": "user"}


def make_episode(task_id: str, params: dict) -> NotesEpisode:
    try:
        task = default_store().get(task_id)
    except KeyError as err:
        raise OpError("not_found", str(err.args[0])) from None
    return NotesEpisode(task, NotesParams.model_validate(params))


def notes_host() -> EpisodeHost:
    """The host of one service process (the task store is loaded now, not on the first request)."""
    default_store()
    return EpisodeHost(make_episode)
