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


def compose_config(conf: str | Path, overrides: Sequence[str] = (), *, check: bool = True) -> DictConfig:
    """Compose ``conf`` (an experiment YAML) with Hydra overrides and validate it.

    ``conf`` may live anywhere. Files under the project's ``exp/`` folder are composed with ``exp/``
    as the config root; any file can build on another through ``defaults: [/SEAL, _self_]``. A file
    in a sub-folder (``exp/ablations/x.yaml``) starts with ``# @package _global_`` so that what it
    sets lands at the top level rather than under the folder's name.

    ``check`` runs :func:`seal.config_check.check_config` (keys and types of the whole tree, task
    ids, data files, a local model folder); every failure is one :class:`ConfigError` line.
    """
    from seal import config_check
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
        raise ConfigError(_override_error(exc, overrides)) from exc
    validate_config(cfg)
    if check:
        config_check.check_config(cfg, overrides)
    return cfg


def _override_error(exc: BaseException, overrides: Sequence[str]) -> str:
    """Hydra's composition errors as one line: an unknown key names the nearest existing one."""
    from hydra.errors import OverrideParseException

    from seal import config_check

    text = str(exc)
    if "To append to your config use" in text:
        return config_check.rewrite_hydra_error(text)
    if isinstance(exc, OverrideParseException):
        bad = _unparsable_override(overrides) or "an override"
        return (f"{bad}: not a valid key=value override ({_one_line(exc)}; fix: quote a value holding "
                "brackets, commas or spaces, e.g. 'key=\"a, b\"')")
    return _one_line(exc)


def validate_config(cfg: DictConfig) -> None:
    """Check the SEAL blocks of a composed config against ``exp/seal_base.yaml``."""
    base = OmegaConf.load(BASE_YAML)
    _load_plugins(cfg)
    for top in ("env_service", "seal"):
        if top not in cfg:
            raise ConfigError(f"{top}: block missing; compose the experiment on exp/seal_base.yaml")
    _add_environment_blocks(cfg, base)
    for top in ("env_service", "seal"):
        _check_node(cfg[top], base[top], top)
    backend = OmegaConf.select(cfg, "trainer.backend")
    if backend not in BACKENDS:
        raise ConfigError(f"trainer.backend={backend!r}: choose one of {list(BACKENDS)}")


def _add_environment_blocks(cfg: DictConfig, base: DictConfig) -> None:
    """``env_service.env`` must name a registered environment; a params block of an environment
    that exp/seal_base.yaml does not hold (``env_service.notes``) is the environment's to check
    (:func:`seal.config_check.check_environment`), so it joins the reference tree as it is."""
    from env_service.registry import get_environment, known_environments, unknown_environment_message
    from seal import config_check

    known = known_environments()
    name = OmegaConf.select(cfg, "env_service.env")
    if name not in known:  # seal.plugins were imported first (_load_plugins), so a plug-in's name is known
        raise ConfigError(f"env_service.env={name!r}: {unknown_environment_message(name)}")
    block = cfg.env_service.get(name)
    if isinstance(block, DictConfig):  # here too, for the callers that skip the full check (seal eval --conf)
        config_check.check_interface(to_plain(block), get_environment(name))
    for env in known:
        if env not in base.env_service and env in cfg.env_service:
            base.env_service[env] = cfg.env_service[env]


def _load_plugins(cfg: DictConfig) -> None:
    """Import the ``seal.plugins`` modules first: they may register tags and reweighters the
    rest of the config names."""
    from seal.plugins import load_plugins

    modules = to_plain(OmegaConf.select(cfg, "seal.plugins")) or []
    if not isinstance(modules, list) or not all(isinstance(m, str) for m in modules):
        raise ConfigError(f"seal.plugins={modules!r}: expected a list of module names")
    try:
        load_plugins(modules)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def _check_node(node: Any, ref: Any, path: str) -> None:
    if path in OPEN_MAPS:
        _check_open_map(node, path)
        return
    if path == "seal.advantage" and isinstance(node, DictConfig):
        ref = _with_plugin_reweighter_blocks(node, ref)
    if isinstance(ref, DictConfig):
        if not isinstance(node, DictConfig):
            raise ConfigError(f"{path}: expected a mapping, got {type(node).__name__}")
        for key in node:
            if key not in ref:
                from seal.config_check import nearest

                near = nearest(str(key), [str(k) for k in ref])
                hint = f"did you mean {path}.{near}?" if near else f"known: {', '.join(str(k) for k in ref)}"
                raise ConfigError(f"{path}.{key}: unknown key ({hint})")
            _check_node(node[key], ref[key], f"{path}.{key}")
        return
    from seal.config_check import show, type_problem

    value = to_plain(node)
    problem = type_problem(value, to_plain(ref), path, strict_strings=True)
    if problem:
        raise ConfigError(f"{path}={show(value)}: expected {problem}")


def _with_plugin_reweighter_blocks(node: DictConfig, ref: DictConfig) -> DictConfig:
    """``seal.advantage.<name>`` blocks of registered reweighters that exp/seal_base.yaml does not
    hold are checked by the reweighter's own config class, then join the reference tree as they are."""
    from seal.advantage import get_reweighter_spec

    ref = ref.copy()
    for key in node:
        if key in ref:
            continue
        try:
            spec = get_reweighter_spec(str(key))
        except KeyError:
            continue  # reported as an unknown key by the caller
        try:
            spec.build_config(to_plain(node[key]))
        except (ValueError, TypeError) as exc:
            raise ConfigError(str(exc)) from exc
        ref[key] = node[key]
    return ref


def _check_open_map(node: Any, path: str) -> None:
    from seal.tags import known_tags

    if not isinstance(node, DictConfig):
        raise ConfigError(f"{path}: expected a mapping of tag -> weight")
    known = known_tags()
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


def _unparsable_override(overrides: Sequence[str]) -> str | None:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for o in overrides:
        try:
            parser.parse_override(o)
        except Exception:  # the grammar raises its own error types; any of them marks the culprit
            return o
    return None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
