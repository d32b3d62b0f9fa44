"""What every config reader needs and nothing else: the project's paths, :class:`ConfigError`,
and :func:`select` / :func:`to_plain` over a composed config or a nested dict.

It imports nothing of SEAL, so any module (a settings class the schema reuses included) may
import it without a cycle. The schema is :mod:`seal.schema`; composing is :mod:`seal.config`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

REPO_ROOT = Path(__file__).resolve().parent.parent
EXP_DIR = REPO_ROOT / "exp"
BASE_YAML = EXP_DIR / "seal_base.yaml"


class ConfigError(ValueError):
    """A bad experiment config; the message names the key and what to do."""


def to_plain(node: Any) -> Any:
    """A resolved, plain-Python copy of a config node (dicts, lists, scalars)."""
    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_container(node, resolve=True)
    return node


def select(cfg: Any, key: str, default: Any = None) -> Any:
    """``cfg``'s value at dotted ``key`` as plain Python (``default`` when absent or null)."""
    if cfg is None:
        return default
    if isinstance(cfg, (DictConfig, ListConfig)):
        value = OmegaConf.select(cfg, key, default=None)
    else:
        value = cfg
        for part in key.split("."):
            if not isinstance(value, Mapping) or part not in value:
                return default
            value = value[part]
    return default if value is None else to_plain(value)
