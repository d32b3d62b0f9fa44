"""``notes``: a small multi-turn function-calling benchmark, the worked example of the environment kit.

Three stateful apps (:mod:`~env_service.notes.tools`: a notes app, a to-do list, a calendar), 210
tasks of two or three user turns each (the apps' starting state, the user's messages and the
ground-truth calls per turn): 100 hand-written in ``tasks.jsonl`` (60 train, 30 val, 10 test) and 110
generated test tasks in ``tasks_test.jsonl`` (:mod:`~env_service.notes.generate`), so the test split
holds 120, read by a final evaluation only (:mod:`seal_shared.held_out`). Three categories
(``single_app``, ``cross_app``, ``abstain``: a turn whose right move is no call). Everything else is
:mod:`env_service.kit`'s: the episode's protocol loop and interface evolution, the replay check
(:mod:`~env_service.notes.checker`) and the evaluation in BFCL's shape, so the reward, the failure
tags, the capability state and A-Patch work on it unchanged.

Importing this package registers it as ``notes``; serve it with ``python -m env_service --env
notes`` and train on it with ``launcher.py --conf exp/examples/notes.yaml``.
"""

from __future__ import annotations

from env_service.kit import register_tool_environment
from env_service.notes.episode import NotesEpisode, default_store

ENVIRONMENT = register_tool_environment(
    "notes", episode=NotesEpisode, tasks=default_store, example_task_id="notes_000",
    description="a notes app, a to-do list and a calendar: 210 multi-turn tasks (the worked example)")
