"""Environments as named plug-ins: what the service, the client and the trainer pick by name.

An environment is a package that builds an :class:`Environment` and registers it with
:func:`register_environment` when it is imported (an environment built on :mod:`env_service.kit`
calls :func:`env_service.kit.register_tool_environment`, which fills every field below). It brings

* ``host_factory``: a ``"module:function"`` path to a zero-argument function returning the
  :class:`~env_service.host.EpisodeHost` of one process (each worker process of the service
  calls it; its episode class implements the :class:`~env_service.host.Episode` protocol, its
  ``evaluate(sparse=False)`` the checker's result: ``valid``, ``accuracy``, ``error_type``,
  ``failure_tags`` one per ground-truth turn, ``category``, turn counts);
* ``task_store``: the loaded task store (``get(task_id).category``, ``ids()``, ``in``), from which
  every consumer reads a task's category;
* ``load_split``: the task ids of ``train`` / ``val`` / ``test`` / ``eval``;
* ``check_params`` (optional): validates a params block (raises ``ValueError`` naming the key), so
  a config with a misspelt key fails before anything starts;
* ``interface_blocks``: the interface-evolution blocks its episodes apply (``observation_lite``,
  ``tool_feedback_evolution``, ``diagnostic_evolution``; :mod:`seal_shared.interface.blocks`). A config
  or a ``/create`` that turns on any other block is refused with one line instead of being a
  silent no-op; the default, none, suits an environment without interface evolution;
* ``episode`` (an environment built on the kit): its :class:`~env_service.kit.ToolEpisode` subclass,
  whose hooks give the catalogue's tool parameter order, a task's oracle and the offline judge.

Its per-episode parameters live in the experiment config under ``env_service.<name>``;
``env_service.env`` names the environment.

The environments shipped with the project (:data:`BUILTIN`) are imported the first time their name is
asked for. Any other registers itself when its module is imported, which ``seal.plugins`` in the
experiment config or ``--plugin`` of ``python -m env_service`` does before any environment name is read.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from seal_shared import DEFAULT_ENVIRONMENT

# name -> the module that registers it on import.
BUILTIN: dict[str, str] = {
    "bfcl": "env_service.bfcl.plugin",
    "notes": "env_service.notes",
}

_LOCK = threading.Lock()
_REGISTERED: dict[str, Environment] = {}
_CHANGES = [0]  # registrations and removals so far: what a cache of an environment's answers is keyed by


class TaskRecord(Protocol):
    id: str
    category: str


class TaskIndex(Protocol):
    """What consumers read from an environment's task store."""

    def get(self, task_id: str) -> TaskRecord: ...
    def ids(self) -> list[str]: ...
    def __contains__(self, task_id: object) -> bool: ...


@dataclass(frozen=True)
class Environment:
    """One environment plug-in (see the module docstring)."""

    name: str
    host_factory: str
    task_store: Callable[[], TaskIndex]
    load_split: Callable[[str], list[str]]
    description: str = ""
    example_task_id: str = ""
    check_params: Callable[[dict[str, Any]], None] | None = None
    interface_blocks: tuple[str, ...] = ()
    episode: type | None = None

    def __post_init__(self) -> None:
        from seal_shared.interface.blocks import check_block_names

        if not self.name.isidentifier():
            raise ValueError(f"environment name {self.name!r} must be an identifier (it is a config key)")
        # A tuple even when given a list or set: frozen, hashable, in a stable order.
        object.__setattr__(self, "interface_blocks", check_block_names(
            self.interface_blocks, owner=f"environment {self.name!r}: interface_blocks"))
        module, sep, attr = self.host_factory.partition(":")
        if not sep or not module or not attr:
            raise ValueError(f"environment {self.name!r}: host_factory must look like 'package.module:function', "
                             f"got {self.host_factory!r}")


def register_environment(env: Environment, *, replace: bool = False) -> Environment:
    """Make ``env`` known by its name; a second registration of a name fails unless ``replace``."""
    with _LOCK:
        if env.name in _REGISTERED and not replace and _REGISTERED[env.name] != env:
            raise ValueError(f"environment {env.name!r} is already registered")
        if _REGISTERED.get(env.name) is not env:
            _CHANGES[0] += 1
        _REGISTERED[env.name] = env
    return env


def unregister_environment(name: str) -> None:
    """Forget a registered environment (tests and notebooks that register one for a while)."""
    with _LOCK:
        if _REGISTERED.pop(name, None) is not None:
            _CHANGES[0] += 1


def registry_changes() -> int:
    """How many times an environment was registered or removed in this process (a cache key: an
    answer cached under an older count may describe an environment since replaced)."""
    with _LOCK:
        return _CHANGES[0]


def known_environments() -> list[str]:
    """Every name that :func:`get_environment` accepts (built-in and registered)."""
    with _LOCK:
        return sorted(set(BUILTIN) | set(_REGISTERED))


def unknown_environment_message(name: object) -> str:
    """The one line for a name no environment is registered under, with the fix: the plug-in route."""
    return (f"unknown environment {name!r} (known: {', '.join(known_environments())}; fix: name one of them, or "
            "load the module that registers yours first: seal.plugins: [my_module] in the experiment config, "
            "--plugin my_module for python -m env_service)")


def get_environment(name: str) -> Environment:
    """The environment registered as ``name`` (importing its built-in package on first use)."""
    with _LOCK:
        env = _REGISTERED.get(name)
    if env is not None:
        return env
    module = BUILTIN.get(name)
    if module is None:
        raise ValueError(unknown_environment_message(name))
    importlib.import_module(module)
    with _LOCK:
        env = _REGISTERED.get(name)
    if env is None:
        raise ValueError(f"environment package {module} did not register {name!r} (it must call "
                         "env_service.registry.register_environment when imported)")
    return env
