"""The ``notes`` checker: the kit's replay check on the notes apps, in BFCL's evaluation shape.

:class:`World` holds one episode's app instances (a :class:`env_service.kit.ToolBox`, which runs the
call strings safely and answers JSON text, as the model sees it).

:func:`check_episode` replays the model's accepted calls and the ground truth on two fresh worlds,
turn by turn (:func:`env_service.kit.replay_turns`), and answers what the BFCL checker answers
(:func:`env_service.kit.build_evaluation`: ``valid``, ``error_type``, one failure tag per
ground-truth turn from :mod:`seal_shared.tags`, turn counts and progress):

* a turn with ground-truth calls fails when the model made none (``empty_turn_model_response``),
  when the apps' public state differs from the ground truth's afterwards (``state_mismatch``), or
  when a ground-truth result is missing from the model's results so far (``response_mismatch``);
* a turn whose right move is to make no call fails only when the model's calls changed the state
  (stricter than BFCL, which never judges such a turn; here an abstention turn can end a task);
* a model turn count different from the ground truth's is ``multi_turn:force_terminated``.
"""

from __future__ import annotations

import json
from typing import Any

from env_service.kit import ToolBox, build_evaluation, replay_turns
from env_service.notes.tools import TOOL_CLASSES


class World(ToolBox):
    """The app instances of one episode (or one checker replay), built from the task's state."""

    def __init__(self, classes: list[str], initial_state: dict[str, dict[str, Any]]) -> None:
        super().__init__({name: TOOL_CLASSES[name](**json.loads(json.dumps(initial_state.get(name, {}))))
                          for name in classes})


def check_episode(model_turns: list[list[list[str]]], task: Any) -> dict[str, Any]:
    """Judge one episode: ``model_turns`` is turn -> step -> call strings; ``task`` a NotesTask."""
    checks = replay_turns(model_turns, task.gt_turns, lambda: World(task.classes, task.initial_state))
    return build_evaluation(checks, played_turns=len(model_turns))
