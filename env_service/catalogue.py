"""What a trainer asks of an environment without an episode: its catalogue (splits, task
categories, interface blocks, tool parameter order), whether it accepts a params block, a task's
oracle and an offline judgement of given calls. The service answers these (``/v1/catalogue``,
``/v1/check_params``, ``/v1/oracle``, ``/v1/judge``) from the environment's registration.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from env_service.host import OpError, validation_summary
from env_service.kit.environment import kit_environment
from env_service.kit.episode import ToolEpisode
from env_service.kit.tasks import SPLITS
from env_service.registry import Environment, get_environment
from seal_shared.held_out import HELD_OUT_SPLITS

# The splits a catalogue lists: the held-out ones (test, eval) are read by a final evaluation only.
LISTED_SPLITS = tuple(s for s in SPLITS if s not in HELD_OUT_SPLITS)


def _task(env: Environment, task_id: str) -> Any:
    try:
        return env.task_store().get(task_id)
    except KeyError as err:
        raise OpError("not_found", str(err.args[0])) from None


def catalogue(name: str) -> dict[str, Any]:
    """What a trainer reads of environment ``name`` without an episode (``schemas.CatalogueResponse``'s
    fields): its interface blocks, its ``train`` and ``val`` splits (never the held-out ones, which
    only a final evaluation reads), task categories and tool parameter order (from its registration;
    the episode class of a kit environment gives the parameter order)."""
    env = get_environment(name)
    store = env.task_store()
    tasks = [store.get(tid) for tid in store.ids()]
    # Registered without an episode class: the parameter order of its tool docs.
    episode = env.episode or ToolEpisode
    return {"env": name, "description": env.description, "example_task_id": env.example_task_id,
            "interface_blocks": list(env.interface_blocks),
            "splits": {split: list(env.load_split(split)) for split in LISTED_SPLITS},
            "categories": {str(t.id): str(t.category) for t in tasks},
            "tool_parameters": episode.tool_parameters(tasks)}


def params_problem(name: str, block: dict[str, Any]) -> str | None:
    """Why environment ``name`` refuses the params block ``block``, in one line (``None``: accepted)."""
    check = get_environment(name).check_params
    if check is None:
        return None
    try:
        check(dict(block))
    except ValidationError as err:
        return validation_summary(err)
    except ValueError as err:
        return str(err)
    return None


def oracle(name: str, task_id: str, parser: str) -> tuple[list[list[str]], list[str]]:
    """A task's ground truth as call strings per turn, and as the assistant messages that play it
    through the protocol in ``parser``'s call syntax (the environment's :meth:`ToolEpisode.oracle`)."""
    env = kit_environment(name)
    task = _task(env, task_id)
    return [list(calls) for calls in task.gt_turns], env.episode.oracle(task, parser=parser)


def judge(name: str, task_id: str, model_turns: list[list[list[str]]]) -> dict[str, Any]:
    """The environment's evaluation of ``model_turns`` for ``task_id``, offline (:meth:`ToolEpisode.judge_turns`)."""
    env = kit_environment(name)
    return env.episode.judge_turns(_task(env, task_id), model_turns)
