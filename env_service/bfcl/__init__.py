"""The BFCL multi-turn environment, on the environment kit (:mod:`env_service.kit`), without HTTP.

Modules: ``tasks`` (the tasks as kit tasks, their store and SEAL's splits), ``executor`` (safe
per-episode backends), ``limits`` (what keeps one call cheap), ``checker`` (BFCL's verdict plus
per-turn failure tags), ``episode`` (the kit's protocol with BFCL's world, parsing, check and hooks),
``plugin`` (the registration as ``bfcl``). The names below are re-exported lazily, so importing this
package costs nothing until used.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "BfclTask": "tasks", "default_store": "tasks", "load_store": "tasks", "load_split": "tasks",
    "CATEGORIES": "tasks",
    "Executor": "executor",
    "check_episode": "checker", "check_turns": "checker", "EpisodeCheck": "checker",
    "BfclEpisode": "episode", "BfclParams": "episode", "BfclWorld": "episode",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'env_service.bfcl' has no attribute {name!r}")
    return getattr(importlib.import_module(f"env_service.bfcl.{module}"), name)
