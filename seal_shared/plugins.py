"""Importing research plug-ins: modules that register failure tags, reweighters or environments on import.

``seal.plugins`` in the experiment config lists them by module name; the config check, the trainers
and every process of the environment service (``--plugin``) import them with :func:`load_plugins`
before anything reads a registry.
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
