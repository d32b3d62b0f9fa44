"""The trainer's view of the configured environment: its name, its params block, its tasks.

``env_service.env`` names the environment (a name of :mod:`env_service.registry`, ``bfcl`` by
default); its per-episode parameters are the block ``env_service.<env>`` (``env_service.bfcl`` for
BFCL). Task categories come from the environment's task store, never from the spelling of an id.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from env_service.registry import DEFAULT_ENVIRONMENT, Environment, get_environment
from seal.rollout.settings import select


def environment_name(cfg: Any) -> str:
    """``env_service.env`` (``bfcl`` when the config has no such key)."""
    return str(select(cfg, "env_service.env") or DEFAULT_ENVIRONMENT)


def environment(cfg: Any) -> Environment:
    """The registered environment the config names."""
    return get_environment(environment_name(cfg))


def env_params_block(cfg: Any) -> dict[str, Any]:
    """The environment's per-episode params, ``env_service.<env>`` ({} when absent)."""
    name = environment_name(cfg)
    block = select(cfg, f"env_service.{name}")
    if block is None:
        return {}
    if not isinstance(block, Mapping):
        raise ValueError(f"env_service.{name}: expected a mapping of episode params")
    return dict(block)


def task_categories(cfg: Any, task_ids: Iterable[str]) -> dict[str, str]:
    """``task_id -> category`` as the environment's task store records it."""
    env = environment(cfg)
    try:
        return env.categories_of(list(task_ids))
    except KeyError as err:
        raise ValueError(f"env_service.env={env.name}: {err.args[0]}") from None
