"""``notes``: a small multi-turn function-calling benchmark, the worked example of an environment.

Three stateful apps (:mod:`~env_service.notes.tools`: a notes app, a to-do list, a calendar), 100
tasks of two or three user turns each (``tasks.jsonl``: the apps' starting state, the user's
messages and the ground-truth calls per turn; 60 train, 30 val, 10 test), in three categories
(``single_app``, ``cross_app``, ``abstain``: a turn whose right move is no call). The checker
(:mod:`~env_service.notes.checker`) answers in BFCL's evaluation shape, so the reward, the
failure tags, the capability state, A-Patch and the interface evolution work on it unchanged.

Importing this package registers it as ``notes``; serve it with ``python -m env_service --env
notes`` and train on it with ``launcher.py --conf exp/examples/notes.yaml``.
"""

from __future__ import annotations

from typing import Any

from env_service.registry import Environment, TaskIndex, register_environment


def task_store() -> TaskIndex:
    from env_service.notes.episode import default_store

    return default_store()


def load_split(split: str) -> list[str]:
    from env_service.notes.episode import load_split as notes_split

    return notes_split(split)


def check_params(block: dict[str, Any]) -> None:
    from env_service.notes.episode import NotesParams

    NotesParams.model_validate(block)


ENVIRONMENT = register_environment(Environment(
    name="notes",
    host_factory="env_service.notes.episode:notes_host",
    task_store=task_store,
    load_split=load_split,
    description="a notes app, a to-do list and a calendar: 30 multi-turn tasks (the worked example)",
    example_task_id="notes_000",
    check_params=check_params,
    interface_blocks=("observation_lite", "tool_feedback_evolution", "diagnostic_evolution"),
))
