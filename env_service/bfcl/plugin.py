"""BFCL's registration as the environment named ``bfcl`` (the default one), as any kit environment's.

Its episodes are :class:`~env_service.bfcl.episode.BfclEpisode`; its task store holds the 800
multi-turn tasks plus the retired composite set, so every id a config may name has a category; its
splits are SEAL's parquet files (:func:`env_service.bfcl.tasks.load_split`).
"""

from __future__ import annotations

import functools

from env_service.bfcl.episode import BfclEpisode
from env_service.bfcl.tasks import default_store
from env_service.kit import register_tool_environment

ENVIRONMENT = register_tool_environment(
    "bfcl", episode=BfclEpisode, tasks=functools.partial(default_store, include_composite=True),
    description="BFCL V3/V4 multi-turn function calling (800 tasks, 4 categories)",
    example_task_id="multi_turn_base_0")
