"""The ``notes`` tasks, their store and the episode: the kit's, on a world of the task's apps.

Protocol and interface evolution are :class:`env_service.kit.ToolEpisode`'s (the release's BFCL
protocol: ``<tool_call>`` JSON blocks parsed with the project's parser, ``<tool_response>``
answers, a reply without calls ends the turn); the per-turn check is the kit's replay on fresh
worlds (:mod:`env_service.notes.checker`). Params: the kit's :class:`~env_service.kit.InterfaceParams`
(``rollout_mode``, ``max_steps_per_turn``, the output caps and the three interface-evolution blocks).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from env_service.kit import Task, TaskStore, ToolEpisode, tool_docs
from env_service.notes.checker import World
from env_service.notes.tools import TOOL_CLASSES

TASKS_FILE = Path(__file__).with_name("tasks.jsonl")  # the 100 hand-written tasks (train, val, test)
# The generated test tasks (env_service/notes/generate.py writes it; a test regenerates it byte for byte).
GENERATED_TASKS_FILE = Path(__file__).with_name("tasks_test.jsonl")


@dataclass(frozen=True, kw_only=True)
class NotesTask(Task):
    """A kit task plus the apps involved and their starting state."""

    classes: list[str] = field(default_factory=list)
    initial_state: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> NotesTask:
        """A task from one line of ``tasks.jsonl``."""
        classes = list(record["classes"])
        return cls(id=record["id"], category=record["category"], split=record["split"], classes=classes,
                   initial_state=record["initial_state"], user_turns=[t["user"] for t in record["turns"]],
                   gt_turns=[list(t["gt"]) for t in record["turns"]],
                   tools=tool_docs(TOOL_CLASSES[c] for c in classes))


@functools.cache
def default_store() -> TaskStore:
    """Every task of ``tasks.jsonl`` and then of ``tasks_test.jsonl`` (loaded once per process)."""
    records = [json.loads(line) for path in (TASKS_FILE, GENERATED_TASKS_FILE)
               for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return TaskStore([NotesTask.from_record(r) for r in records], env="notes")


def load_split(split: str) -> list[str]:
    """The ids of a split (``test`` and ``eval`` inside a final evaluation only)."""
    return default_store().load_split(split)


class NotesEpisode(ToolEpisode):
    """One rollout of one notes task: the kit's protocol on the task's apps."""

    task: NotesTask

    def start(self) -> World:
        return World(self.task.classes, self.task.initial_state)
