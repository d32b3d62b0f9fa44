"""The one registration of a kit environment, and the host each service process builds from it.

:func:`register_tool_environment` builds the :class:`~env_service.registry.Environment` from the
episode class and the task store, so an environment needs no host function, no params check and no
split function of its own: every service process builds its host with :func:`episode_host`
(reached as ``env_service.kit.hosts:<name>``), the config check validates the params block with the
episode's ``params_model``, and the declared interface blocks are the ones that model has.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from env_service.host import EpisodeHost, OpError
from env_service.kit.episode import ToolEpisode
from env_service.kit.tasks import TaskStore
from env_service.registry import Environment, get_environment, register_environment


def register_tool_environment(name: str, *, episode: type[ToolEpisode], tasks: TaskStore | Callable[[], TaskStore],
                              description: str = "", example_task_id: str = "") -> Environment:
    """Register environment ``name``: episodes of class ``episode`` on the tasks of ``tasks`` (a store,
    or a function returning it, called when the environment is first used). Returns the registered
    :class:`~env_service.registry.Environment`."""
    if not (isinstance(episode, type) and issubclass(episode, ToolEpisode)):
        raise TypeError(f"environment {name!r}: episode must be a ToolEpisode subclass, got {episode!r}")
    if not callable(tasks) and not isinstance(tasks, TaskStore):
        raise TypeError(f"tasks must be a TaskStore or a function returning one, got {type(tasks).__name__}")
    store = tasks if callable(tasks) else lambda: tasks
    return register_environment(Environment(
        name=name, host_factory=f"env_service.kit.hosts:{name}", task_store=store,
        load_split=lambda split: store().load_split(split), description=description,
        example_task_id=example_task_id, check_params=episode.check_params,
        interface_blocks=episode.interface_blocks(), episode=episode))


def kit_environment(name: str) -> Environment:
    """Environment ``name``, registered with :func:`register_tool_environment` (its ``episode`` is set)."""
    env = get_environment(name)
    if env.episode is None:
        raise ValueError(f"environment {name!r} was not registered with env_service.kit.register_tool_environment")
    return env


def episode_host(name: str) -> EpisodeHost:
    """The host of one service process for kit environment ``name`` (its tasks are loaded now,
    not on the first request)."""
    env = kit_environment(name)
    store, episode = env.task_store(), env.episode

    def make_episode(task_id: str, params: dict[str, Any]) -> ToolEpisode:
        try:
            task = store.get(task_id)
        except KeyError as err:
            raise OpError("not_found", str(err.args[0])) from None
        return episode(task, episode.params_model.model_validate(params))

    return EpisodeHost(make_episode)
