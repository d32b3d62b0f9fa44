"""Research plug-ins: modules that register failure tags, reweighters or environments on import.

``seal.plugins`` in the experiment config lists them by module name; the config check and the
trainer's SEAL hooks import them before anything reads the registries, so a config may name a
plug-in's reweighter or weight a plug-in's tag. The environment's checker must see a plug-in tag
too: with the in-process environment (the local backend's default) it is the same process; a
separately started environment service imports the module itself (see ``docs/extending.md``).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterable

logger = logging.getLogger(__name__)


def load_plugins(modules: Iterable[str]) -> None:
    """Import each module of ``modules`` (importing one twice is a no-op, as for any import)."""
    for name in modules:
        try:
            importlib.import_module(str(name))
        except ImportError as exc:
            raise ValueError(f"seal.plugins: cannot import {name!r} ({exc}); list importable module names, "
                             "e.g. a module of your package or one on PYTHONPATH") from exc
        logger.debug("plug-in module %s imported", name)
