"""Tasks and the task store of a kit environment, and :func:`ground_truth_replies` (a check that every
task can pass).

The store answers the ids of the held-out splits (``test``, ``eval``) only inside a final evaluation
(:func:`seal_shared.held_out.final_evaluation`); see :meth:`TaskStore.ids`.

An environment subclasses :class:`Task` for its own fields: it is a frozen, keyword-only dataclass
(``@dataclass(frozen=True, kw_only=True)``), so each new field has a default or is given by name.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seal_shared.calls import parse_call
from seal_shared.held_out import check_split_read

SPLITS = ("train", "val", "test", "eval")


@dataclass(frozen=True, kw_only=True)
class Task:
    """One task: a user message and the ground-truth calls per turn, the tool docs offered, and
    the ``category`` every consumer groups by (subclass it for the environment's own fields)."""

    id: str
    category: str
    split: str | None  # train, val or test ("eval" is val and test); None: the store's split rule decides
    user_turns: Sequence[str]
    gt_turns: Sequence[Sequence[str]]  # call strings per turn; [] where the right move is no call
    tools: Sequence[Mapping[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.user_turns or len(self.user_turns) != len(self.gt_turns):
            raise ValueError(f"task {self.id!r}: {len(self.user_turns)} user turns and {len(self.gt_turns)} "
                             "ground-truth turns (one of each per turn, at least one turn)")
        if self.split is not None and self.split not in SPLITS[:3]:
            raise ValueError(f"task {self.id!r}: split {self.split!r} is not one of train, val, test")


class TaskStore:
    """Every task of an environment, by id, in file order (read-only). ``splits``, when given, is the
    store's split rule (name -> ids, in its own order) in place of the tasks' ``split`` fields."""

    def __init__(self, tasks: Iterable[Task], *, env: str, splits: Callable[[str], list[str]] | None = None) -> None:
        self.env = env
        self._splits = splits
        self._tasks: dict[str, Task] = {}
        for task in tasks:
            if task.id in self._tasks:
                raise ValueError(f"{env} task id {task.id!r} appears twice")
            self._tasks[task.id] = task

    @classmethod
    def from_jsonl(cls, path: Path, make_task: Callable[[dict[str, Any]], Task], *, env: str) -> TaskStore:
        """One task per non-empty line of ``path``, built by ``make_task`` from the line's object."""
        with path.open(encoding="utf-8") as fh:
            return cls([make_task(json.loads(line)) for line in fh if line.strip()], env=env)

    def get(self, task_id: str) -> Task:
        try:
            return self._tasks[task_id]
        except KeyError:
            example = next(iter(self._tasks), "")
            raise KeyError(f"unknown {self.env} task id {task_id!r} (ids look like {example!r})") from None

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._tasks

    def __len__(self) -> int:
        return len(self._tasks)

    def ids(self, split: str | None = None, *, category: str | None = None) -> list[str]:
        """Every id (``None``) or those of one split (``eval`` is val and test), optionally of one
        category only; in store order, or in the order of the store's split rule. A held-out split
        (``test``, ``eval``) is answered only inside a final evaluation, and the read is recorded
        (:func:`seal_shared.held_out.check_split_read`): nothing that chooses may see it."""
        if split is not None:
            check_split_read(self.env, split)
        if split is not None and self._splits is not None:
            ids = self._splits(split)
        else:
            wanted = {"val", "test"} if split == "eval" else {split}
            ids = [t.id for t in self._tasks.values() if split is None or t.split in wanted]
        return ids if category is None else [i for i in ids if self._tasks[i].category == category]

    def load_split(self, split: str) -> list[str]:
        """:meth:`ids` of a named split (``ValueError`` for another name; ``HeldOutSplitError`` for
        ``test`` or ``eval`` outside a final evaluation)."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
        return self.ids(split)


def ground_truth_replies(task: Task, *, reply: str = "Done.") -> list[str]:
    """The assistant messages that play ``task``'s ground truth through the kit's protocol: per turn,
    one message with the turn's calls as ``<tool_call>`` JSON blocks (none on a no-call turn), then
    ``reply``, which ends the turn. Ground-truth calls must use keyword arguments."""
    messages: list[str] = []
    for k, calls in enumerate(task.gt_turns):
        blocks = []
        for call in calls:
            parsed = parse_call(call)
            if parsed.args:
                raise ValueError(f"task {task.id!r} turn {k}: {call!r} uses positional arguments; name them")
            blocks.append(f"<tool_call>\n{json.dumps({'name': parsed.name, 'arguments': parsed.kwargs})}\n</tool_call>")
        messages += ["\n".join(blocks), reply] if blocks else [reply]
    return messages
