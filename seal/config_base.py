"""What every config reader needs and nothing else: the project's paths, :class:`ConfigError`,
:func:`select` / :func:`to_plain` over a composed config or a nested dict, and :class:`Rule`, the
values a key allows, declared beside its dataclass field and checked by the config pass and by the
settings class itself (:func:`check_fields`), and whether a model path is a local folder or a hub id
(:func:`looks_local`, :func:`check_hub_model`).

It imports nothing of SEAL, so any module (a settings class the schema reuses included) may
import it without a cycle. The schema is :mod:`seal.schema`; composing is :mod:`seal.config`.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
import os
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

REPO_ROOT = Path(__file__).resolve().parent.parent
EXP_DIR = REPO_ROOT / "exp"
BASE_YAML = EXP_DIR / "seal_base.yaml"


class ConfigError(ValueError):
    """A bad experiment config; the message names the key and what to do."""


@functools.cache
def verl_config_dir() -> Path:
    """verl's installed ``trainer/config`` folder (its ``ppo_trainer`` config), found without
    importing verl: that import pulls in torch, Ray and transformers, seconds of start-up before
    the config pass could report a bad value."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("verl is not installed (fix: run install.sh); its ppo_trainer config is the base of "
                          "every experiment config")
    return Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config"


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


def show(value: Any) -> str:
    """A config value as it is written on the command line (``true``, ``null``, ``bogus``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


@dataclass(frozen=True)
class Rule:
    """The values a config key allows besides its type: choices, a numeric range or a pattern.

    ``choices`` may be a callable returning the names (a registry filled by plug-ins). A range
    (``ge``/``gt``/``le``) also refuses nan and infinity. ``pattern`` must match the whole string;
    ``means`` says in words what it allows.
    """

    choices: tuple[Any, ...] | Callable[[], Iterable[str]] | None = None
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    pattern: str | None = None
    means: str = ""

    def names(self) -> tuple[Any, ...]:
        return tuple(self.choices() if callable(self.choices) else self.choices or ())

    def allowed(self, noun: str = "a number") -> str:
        """What the rule allows, in words: ``one of binary, capped``, ``an integer >= 1``."""
        if self.choices is not None:
            return "one of " + ", ".join(show(c) for c in self.names())
        if self.pattern is not None:
            return self.means
        bounds = [f"{op} {bound:g}" for op, bound in ((">=", self.ge), (">", self.gt), ("<=", self.le))
                  if bound is not None]
        return f"{noun} {' and '.join(bounds)}"

    def breaks(self, value: Any) -> bool:
        """Whether ``value`` is outside the rule."""
        if self.choices is not None:
            return value not in self.names()
        if self.pattern is not None:  # a number stands for its digits (Hydra reads `name=2024` as an int)
            text = str(value) if isinstance(value, (str, int, float)) and not isinstance(value, bool) else None
            return text is None or not re.fullmatch(self.pattern, text)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return True
        return ((self.ge is not None and value < self.ge) or (self.gt is not None and value <= self.gt)
                or (self.le is not None and value > self.le))


def allows(**rule: Any) -> dict[str, Rule]:
    """Field metadata holding a :class:`Rule`: ``field(default=20, metadata=allows(ge=1))``."""
    return {"rule": Rule(**rule)}


@dataclass(frozen=True)
class FieldSpec:
    """What a dataclass field of a config block accepts: its type, whether null, its rule."""

    kind: type
    nullable: bool
    rule: Rule | None

    def noun(self) -> str:
        return {bool: "true or false", int: "an integer", float: "a number", str: "a string", list: "a list",
                dict: "a mapping"}.get(self.kind, self.kind.__name__)

    def allowed(self) -> str:
        text = self.rule.allowed(self.noun()) if self.rule else self.noun()
        return f"{text}, or null" if self.nullable else text

    def fits(self, value: Any) -> bool:
        """Whether ``value`` is of the field's type (an integer is a number; a tuple is a list)."""
        if isinstance(value, bool) or self.kind is bool:
            return isinstance(value, bool) and self.kind is bool
        kinds = {float: (int, float), list: (list, tuple), dict: (Mapping,)}.get(self.kind, (self.kind,))
        return isinstance(value, kinds)

    def problem(self, value: Any) -> str | None:
        """What is allowed, when ``value`` breaks the field (its type, null, its rule); else None."""
        if value is None:
            return None if self.nullable else self.allowed()
        if not self.fits(value) or (self.rule and self.rule.breaks(value)):
            return self.allowed()
        return None


@functools.cache
def field_specs(cls: type) -> dict[str, FieldSpec]:
    """``name -> FieldSpec`` of every field of the dataclass ``cls`` (annotations resolved)."""
    hints = typing.get_type_hints(cls)
    specs = {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        union = isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union
        args = typing.get_args(hint) if union else ()
        base = next((a for a in args if a is not type(None)), hint)
        kind = typing.get_origin(base) or base
        specs[f.name] = FieldSpec(list if kind is tuple else kind, type(None) in args, f.metadata.get("rule"))
    return specs


def rule_error(key: str, value: Any, allowed: str) -> ConfigError:
    """The one line of a value outside what its key allows."""
    return ConfigError(f"{key}={show(value)}: expected {allowed}")


def check_fields(block: Any, section: str) -> None:
    """The rules of the fields of the settings dataclass ``block``; its ``__post_init__`` calls
    this, so a block built in code is held to the rules the config pass applies to the YAML. A
    nested block checks itself; a mapping's rule holds for each of its values."""
    for name, spec in field_specs(type(block)).items():
        value = getattr(block, name)
        if dataclasses.is_dataclass(spec.kind):
            continue
        if spec.kind is dict and isinstance(value, Mapping):
            for key, item in value.items():
                if spec.rule and spec.rule.breaks(item):
                    raise rule_error(f"{section}.{name}.{key}", item, spec.rule.allowed())
            continue
        problem = spec.problem(value)
        if problem:
            raise rule_error(f"{section}.{name}", value, problem)


def looks_local(path: str) -> bool:
    """Whether a model path names a folder on this machine rather than a hub id (``org/name``)."""
    p = Path(os.path.expanduser(path))
    if p.is_absolute() or path.startswith((".", "~")) or len(p.parts) > 2:
        return True
    # `models/X`: the first part is a folder here (or in the project), so this is not `org/name`.
    return len(p.parts) == 2 and any((root / p.parts[0]).is_dir() for root in (Path.cwd(), REPO_ROOT))


def resolve_path(value: str) -> Path:
    """A data file or model folder as the trainers find it: as given, else relative to the project."""
    p = Path(os.path.expanduser(value))
    if not p.is_absolute() and not p.exists() and (REPO_ROOT / p).exists():
        return REPO_ROOT / p
    return p


def check_hub_model(key: str, repo_id: str, *, timeout_s: float = 10.0) -> None:
    """A hub id that is neither in the local hub cache nor reachable fails in one line at once.

    ``from_pretrained`` retries an unreachable hub for about a minute before it gives up; one
    metadata request with a short timeout answers the same question. Called where a model is
    about to be loaded (never in the config check: composing a config needs no network).
    """
    import httpx
    from huggingface_hub import HfApi, constants, try_to_load_from_cache
    from huggingface_hub.errors import RepositoryNotFoundError

    if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        return
    fix = "fix: download it once with network access, or point the key at a local model folder"
    if constants.HF_HUB_OFFLINE:
        raise ConfigError(f"{key}={repo_id}: not in the local hub cache and HF_HUB_OFFLINE is set ({fix})")
    try:
        HfApi().model_info(repo_id, timeout=timeout_s)
    except RepositoryNotFoundError:
        raise ConfigError(f"{key}={repo_id}: no such model on the hub, or a private/gated one this machine is not "
                     "logged in for (fix: check the id, or run `hf auth login`)") from None
    except (httpx.HTTPError, OSError) as exc:
        raise ConfigError(f"{key}={repo_id}: not in the local hub cache and the hub is unreachable "
                     f"({type(exc).__name__}: {exc}; {fix})") from None
