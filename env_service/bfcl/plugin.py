"""BFCL's registration as the environment named ``bfcl`` (the default one).

Its episodes are :class:`~env_service.bfcl.episode.BfclEpisode` (built by
``env_service.host.bfcl_host``); its task store holds the 800 multi-turn tasks plus the retired
composite set, so every id a config may name has a category; its splits are SEAL's parquet files.
"""

from __future__ import annotations

from env_service.registry import Environment, TaskIndex, register_environment


def task_store() -> TaskIndex:
    from env_service.bfcl.tasks import default_store

    return default_store(include_composite=True)


def load_split(split: str) -> list[str]:
    from env_service.bfcl.tasks import load_split as bfcl_split

    return bfcl_split(split)


def check_params(block: dict) -> None:
    """A config's ``env_service.bfcl`` block against the episode's params model (``ValueError`` naming the key)."""
    from env_service.bfcl.episode import EpisodeParams

    EpisodeParams.model_validate(block)


ENVIRONMENT = register_environment(Environment(
    name="bfcl",
    host_factory="env_service.host:bfcl_host",
    task_store=task_store,
    load_split=load_split,
    description="BFCL V3/V4 multi-turn function calling (800 tasks, 4 categories)",
    example_task_id="multi_turn_base_0",
    check_params=check_params,
    interface_blocks=("observation_lite", "tool_feedback_evolution", "diagnostic_evolution"),
))
