"""One config tree: compose an experiment YAML on verl's config and the SEAL schema, then check it.

Every ``exp/*.yaml`` composes verl's installed ``ppo_trainer`` config (the composer puts verl's
config folder, :func:`~seal.config_base.verl_config_dir`, and ``exp/`` on Hydra's search path)
plus ``exp/seal_base.yaml``, which names the SEAL schema (:mod:`seal.schema`, every SEAL key with
its default) first in its defaults list and holds the recipe's environment params. An experiment
file changes only what it needs. The one validation pass is :mod:`seal.config_check`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig

from seal import config_check, config_values, schema
from seal.config_base import BASE_YAML, EXP_DIR, REPO_ROOT, ConfigError, rule_error, to_plain, verl_config_dir

__all__ = ["BASE_YAML", "EXP_DIR", "REPO_ROOT", "ConfigError", "compose_config", "experiment_dir", "to_plain"]


def compose_config(conf: str | Path, overrides: Sequence[str] = (), *, check: bool = True) -> DictConfig:
    """Compose ``conf`` (an experiment YAML) with Hydra overrides and validate it.

    ``conf`` may live anywhere. Files under the project's ``exp/`` folder are composed with ``exp/``
    as the config root; any file can build on another through ``defaults: [/SEAL, _self_]``. A file
    in a sub-folder (``exp/ablations/x.yaml``) starts with ``# @package _global_`` so that what it
    sets lands at the top level rather than under the folder's name.

    The SEAL blocks are always checked; ``check`` adds the rest of :func:`seal.config_check.check_config`
    (verl's keys and types, task ids, data files, a local model folder). Every failure is one
    :class:`ConfigError` line.
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
    searchpath = f"hydra.searchpath=[file://{verl_config_dir()},file://{EXP_DIR}]"
    schema.register()
    try:
        with initialize_config_dir(config_dir=str(root), version_base=None):
            cfg = compose(config_name=name, overrides=[searchpath, *overrides])
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(_override_error(exc, overrides)) from exc
    config_check.check_config(cfg, overrides, full=check)
    return cfg


def _override_error(exc: BaseException, overrides: Sequence[str]) -> str:
    """Hydra's composition errors as one line: an unknown key names the nearest existing one."""
    from hydra.errors import OverrideParseException

    text = str(exc)
    if "To append to your config use" in text:
        return config_check.rewrite_hydra_error(text)
    if isinstance(exc, OverrideParseException):
        bad = _unparsable_override(overrides) or "an override"
        return (f"{bad}: not a valid key=value override ({_one_line(exc)}; fix: quote a value holding "
                "brackets, commas or spaces, e.g. 'key=\"a, b\"')")
    return _one_line(exc)


def experiment_dir(cfg: DictConfig) -> Path:
    """``experiments/<trainer.experiment_name>`` under the current directory."""
    name = str(cfg.trainer.experiment_name)
    rule = config_values.VERL_RULES["trainer.experiment_name"]
    if rule.breaks(name):
        raise rule_error("trainer.experiment_name", name, rule.allowed())
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
