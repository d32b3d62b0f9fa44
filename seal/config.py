"""One config tree: compose an experiment YAML on verl's config and validate the SEAL blocks.

Every ``exp/*.yaml`` composes verl's installed ``ppo_trainer`` config (the composer puts
``pkg://verl.trainer.config`` and ``exp/`` on Hydra's search path) plus ``exp/seal_base.yaml``, which holds the SEAL blocks
(``trainer.backend``, ``env_service.*``, ``seal.*``) with the release's defaults. An experiment file
changes only what it needs.

Hydra already rejects command-line overrides of unknown keys. A typo inside a YAML file, however,
would silently add a key; :func:`validate_config` therefore checks the SEAL blocks against the base
tree — every key must exist there and keep its type — and fails with one line naming the key.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
EXP_DIR = REPO_ROOT / "exp"
BASE_YAML = EXP_DIR / "seal_base.yaml"
VERL_SEARCHPATH = "pkg://verl.trainer.config"
BACKENDS = ("verl", "local")

# Keys under these paths are open maps (their keys are data, not schema).
OPEN_MAPS = ("seal.advantage.apatch.tag_weights",)


class ConfigError(ValueError):
    """A bad experiment config; the message names the key and what to do."""


def compose_config(conf: str | Path, overrides: Sequence[str] = ()) -> DictConfig:
    """Compose ``conf`` (an experiment YAML) with Hydra overrides and validate it.

    ``conf`` may live anywhere. Files under the project's ``exp/`` folder are composed with ``exp/``
    as the config root; any file can build on another through ``defaults: [/SEAL, _self_]``. A file
    in a sub-folder (``exp/ablations/x.yaml``) starts with ``# @package _global_`` so that what it
    sets lands at the top level rather than under the folder's name.
    """
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    path = Path(conf).resolve()
    if path.suffix != ".yaml" or not path.is_file():
        raise ConfigError(f"--conf {conf}: expected an existing .yaml file")
    root = EXP_DIR if path.is_relative_to(EXP_DIR) else path.parent
    name = path.relative_to(root).with_suffix("").as_posix()
    # The search path is set here rather than in the YAML files: Hydra accepts `hydra.searchpath`
    # only in the primary config, and exp/SEAL.yaml is also composed as a parent of other files.
    searchpath = f"hydra.searchpath=[{VERL_SEARCHPATH},file://{EXP_DIR}]"
    try:
        with initialize_config_dir(config_dir=str(root), version_base=None):
            cfg = compose(config_name=name, overrides=[searchpath, *overrides])
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(_one_line(exc)) from exc
    validate_config(cfg)
    return cfg


def validate_config(cfg: DictConfig) -> None:
    """Check the SEAL blocks of a composed config against ``exp/seal_base.yaml``."""
    base = OmegaConf.load(BASE_YAML)
    for top in ("env_service", "seal"):
        if top not in cfg:
            raise ConfigError(f"{top}: block missing; compose the experiment on exp/seal_base.yaml")
        _check_node(cfg[top], base[top], top)
    backend = OmegaConf.select(cfg, "trainer.backend")
    if backend not in BACKENDS:
        raise ConfigError(f"trainer.backend={backend!r}: choose one of {list(BACKENDS)}")


def _check_node(node: Any, ref: Any, path: str) -> None:
    if path in OPEN_MAPS:
        _check_open_map(node, path)
        return
    if isinstance(ref, DictConfig):
        if not isinstance(node, DictConfig):
            raise ConfigError(f"{path}: expected a mapping, got {type(node).__name__}")
        for key in node:
            if key not in ref:
                known = ", ".join(str(k) for k in ref)
                raise ConfigError(f"{path}.{key}: unknown key (known under {path}: {known})")
            _check_node(node[key], ref[key], f"{path}.{key}")
        return
    value = node
    if value is None or ref is None:
        return  # nullable knobs: null in the base means "unset", any value may replace it
    if isinstance(ref, ListConfig):
        if not isinstance(value, ListConfig):
            raise ConfigError(f"{path}={value!r}: expected a list")
        return
    if isinstance(ref, bool) and not isinstance(value, bool):
        raise ConfigError(f"{path}={value!r}: expected true or false")
    if isinstance(ref, (int, float)) and not isinstance(ref, bool):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}={value!r}: expected a number")
    if isinstance(ref, str) and not isinstance(value, str):
        raise ConfigError(f"{path}={value!r}: expected a string")


def _check_open_map(node: Any, path: str) -> None:
    from seal.types import FailureTag

    if not isinstance(node, DictConfig):
        raise ConfigError(f"{path}: expected a mapping of tag -> weight")
    known = {t.value for t in FailureTag}
    for key, value in node.items():
        if key not in known:
            raise ConfigError(f"{path}.{key}: unknown failure tag (known: {', '.join(sorted(known))})")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}.{key}={value!r}: expected a number")


def to_plain(node: Any) -> Any:
    """A resolved, plain-Python copy of a config node (dicts, lists, scalars)."""
    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_container(node, resolve=True)
    return node


def experiment_dir(cfg: DictConfig) -> Path:
    """``experiments/<trainer.experiment_name>`` under the current directory."""
    name = str(cfg.trainer.experiment_name)
    if not name or "/" in name or name.startswith("."):
        raise ConfigError(f"trainer.experiment_name={name!r}: use a plain folder name")
    return Path("experiments") / name


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
