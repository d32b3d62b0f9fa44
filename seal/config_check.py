"""The one validation pass over a composed experiment config, before anything heavy starts.

:func:`check_config` reads only YAML, the task store's ids and file names (never a model or
tokenizer) and fails with one :class:`~seal.config_base.ConfigError` line naming the key, the
value and what is allowed (the messages are listed in docs/errors.md). Every composition checks
the SEAL part: ``seal.plugins`` imported first, then every key of :mod:`seal.schema` (its type,
strings strictly, null only where the field allows it, the values its rule allows; the nearest key
named for a typo), a plug-in reweighter's block by its config class, the environment's params
block by the environment. ``full`` adds verl's keys against verl's ``ppo_trainer`` config and the
values a run reads (:mod:`seal.config_values`: ranges, verl's batch-size arithmetic, the rules
between keys), task ids, data files and a local model folder; an id list next to a data file is
one warning saying which one wins.
"""

from __future__ import annotations

import difflib
import functools
import logging
import re
from collections.abc import Iterable, Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf

from seal import config_values, schema
from seal.config_base import ConfigError, looks_local, resolve_path, rule_error, show, to_plain, verl_config_dir
from seal_shared import DEFAULT_ENVIRONMENT

log = logging.getLogger(__name__)

# Keys whose value may be one string or a list of strings (verl reads both).
STR_OR_LIST = ("data.train_files", "data.val_files", "trainer.logger")
# Reference nodes whose keys are data, not schema (besides empty mappings, which are all open).
OPEN_PREFIXES = ("seal.advantage.apatch.tag_weights", "ray_kwargs.ray_init")
SPLITS = ("train", "val")
_NOT_IN_STRUCT = re.compile(r"Could not override '([^']+)'")
# A value of each type, for the type check of a schema key whose default is null.
_EXAMPLES = {bool: True, int: 1, float: 1.0, str: "", list: [], dict: {}}
# The SEAL blocks: checked against the schema (strings strictly), not against verl's tree.
SEAL_BLOCKS = ("env_service", "seal")


@functools.lru_cache(maxsize=1)
def reference_tree() -> dict[str, Any]:
    """verl's installed ``ppo_trainer`` config merged with the SEAL schema and ``exp/seal_base.yaml``."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(verl_config_dir()), version_base=None):
        verl = compose(config_name="ppo_trainer")
    merged = OmegaConf.merge(OmegaConf.to_container(verl, resolve=True, throw_on_missing=False),
                             schema.default_config())
    return OmegaConf.to_container(merged, resolve=True, throw_on_missing=False)


@functools.lru_cache(maxsize=1)
def seal_reference() -> dict[str, Any]:
    """The SEAL blocks' reference: the schema's defaults with exp/seal_base.yaml's recipe values."""
    return OmegaConf.to_container(schema.default_config(), resolve=True)


def all_keys(tree: Any, prefix: str = "") -> list[str]:
    """Every dotted key of a nested dict (inner nodes included), depth first."""
    out: list[str] = []
    if isinstance(tree, dict):
        for key, value in tree.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            out.append(path)
            out.extend(all_keys(value, path))
    return out


def nearest(word: str, candidates: Iterable[str]) -> str | None:
    """The closest candidate to ``word`` (difflib ratio >= 0.6), or None."""
    found = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return found[0] if found else None


def nearest_key(key: str) -> str | None:
    """The existing key closest to ``key``: a sibling first (same parent), then any key."""
    keys = all_keys(reference_tree())
    parent = key.rpartition(".")[0]
    siblings = [k for k in keys if k.rpartition(".")[0] == parent]
    return nearest(key, siblings) or nearest(key, keys)


def unknown_key_message(key: str) -> str:
    near = nearest_key(key)
    hint = f"did you mean {near}?" if near else "check the spelling against `seal config --show` and verl's ppo_trainer.yaml"
    return f"{key}: no such config key ({hint}; to add a new key on purpose, write +{key}=...)"


def rewrite_hydra_error(message: str) -> str:
    """Hydra's ``Could not override 'k'.`` (an unknown key in struct mode) as our one line."""
    m = _NOT_IN_STRUCT.search(message)
    if m:
        return unknown_key_message(m.group(1))
    return message.strip().splitlines()[0] if message.strip() else message


def check_config(cfg: DictConfig, overrides: Sequence[str] = (), *, full: bool = True) -> list[str]:
    """Every check above (``full=False``: the SEAL part only); returns the warnings it logged,
    raises ConfigError on the first error."""
    load_plugins(cfg)
    check_seal_blocks(cfg)
    if not full:
        return []
    added = tuple(o.lstrip("+").split("=", 1)[0] for o in overrides if o.startswith("+"))
    try:
        plain = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    except Exception as exc:  # omegaconf raises several unrelated types for a bad interpolation
        key = getattr(exc, "full_key", "") or "config"
        raise ConfigError(f"{key}: cannot resolve its value ({str(exc).splitlines()[0]})") from exc
    # Types are checked where a value is written: an interpolation (verl's `rollout_n:
    # ${...rollout.n}`) is judged at the key it points to, so the error names the key the user set.
    verl_side = {k: v for k, v in OmegaConf.to_container(cfg, resolve=False).items() if k not in SEAL_BLOCKS}
    check_keys_and_types(verl_side, reference_tree(), added=added)
    backend = str(cfg.trainer.backend)
    config_values.check_verl_values(verl_side, reference_tree(), backend)
    config_values.check_batch_sizes(plain, backend)
    if backend == "verl":
        config_values.check_verl_backend(cfg)
    check_settings(cfg)
    check_model_path(plain)
    return check_tasks(plain)


def check_settings(cfg: DictConfig) -> None:
    """Build the settings classes the trainers build from the config, so the rules between keys
    they state (A-Patch's min_scale <= max_scale, the rollout's max_model_len > response_length,
    best-checkpoint keeping against verl's checkpoint pruning) fail here."""
    from seal.advantage.weights import APatchConfig
    from seal.rollout.settings import RolloutSettings
    from seal.trainer.best_checkpoint import BestCheckpointSettings

    try:
        APatchConfig.from_dict(OmegaConf.to_container(cfg.seal.advantage.apatch, resolve=True))
        RolloutSettings.from_config(cfg)
        BestCheckpointSettings.from_trainer_cfg(cfg.trainer)
    except ValueError as exc:
        raise ConfigError(str(exc).splitlines()[0]) from exc


def load_plugins(cfg: DictConfig) -> None:
    """Import the ``seal.plugins`` modules first: they may register tags, reweighters and
    environments the rest of the config names."""
    from seal.plugins import load_plugins as load

    modules = to_plain(OmegaConf.select(cfg, "seal.plugins")) or []
    if not isinstance(modules, list) or not all(isinstance(m, str) for m in modules):
        raise ConfigError(f"seal.plugins={show(modules)}: expected a list of module names")
    try:
        load(modules)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def check_seal_blocks(cfg: DictConfig) -> None:
    """The SEAL blocks against the schema, the environment's params block by the environment."""
    for top in SEAL_BLOCKS:
        if top not in cfg:
            raise ConfigError(f"{top}: block missing; compose the experiment on exp/seal_base.yaml")
    check_environment(cfg)
    ref = seal_reference()
    for top in SEAL_BLOCKS:
        _check_node(cfg[top], ref[top], top)
    # The schema's keys under verl's trainer block.
    for key in schema.leaf_specs():
        if key.split(".")[0] not in SEAL_BLOCKS:
            _check_leaf(key, to_plain(OmegaConf.select(cfg, key)), schema.schema_default(key))


def _check_node(node: Any, ref: Any, path: str) -> None:
    if path in OPEN_PREFIXES:
        _check_tag_weights(node, path)
        return
    if isinstance(ref, dict):
        if not isinstance(node, DictConfig):
            raise ConfigError(f"{path}: expected a mapping, got {type(node).__name__}")
        for key in node:
            sub = f"{path}.{key}"
            if key in ref:
                _check_node(node[key], ref[key], sub)
            elif path == "env_service" and _is_environment(str(key)):
                continue  # an environment's params block: check_environment judged it
            elif not (path == "seal.advantage" and _check_reweighter_block(str(key), node[key])):
                near = nearest(str(key), [str(k) for k in ref])
                hint = f"did you mean {path}.{near}?" if near else f"known: {', '.join(str(k) for k in ref)}"
                raise ConfigError(f"{sub}: unknown key ({hint})")
        return
    if path.startswith("env_service.") and _is_environment(path.split(".")[1]):
        return
    _check_leaf(path, to_plain(node), ref)


def _check_leaf(path: str, value: Any, ref: Any) -> None:
    """A SEAL key: its type (strings strictly), null only where its field allows it, its rule."""
    spec = schema.leaf_specs().get(path)
    if spec is not None and ref is None:
        ref = _EXAMPLES.get(spec.kind)
    if value is None and spec is not None and not spec.nullable:
        raise rule_error(path, value, spec.allowed())
    problem = type_problem(value, ref, path, strict_strings=True)
    if problem:
        raise ConfigError(f"{path}={show(value)}: expected {problem}")
    problem = spec.problem(value) if spec is not None else None
    if problem:
        raise rule_error(path, value, problem)


def _is_environment(name: str) -> bool:
    from env_service.client import known_environments

    return name in known_environments()


def _check_reweighter_block(name: str, block: Any) -> bool:
    """Whether ``seal.advantage.<name>`` is a registered reweighter's block; its own config
    class checks it."""
    from seal.advantage import get_reweighter_spec

    try:
        spec = get_reweighter_spec(name)
    except KeyError:
        return False
    try:
        spec.build_config(to_plain(block))
    except (ValueError, TypeError) as exc:
        raise ConfigError(str(exc)) from exc
    return True


def _check_tag_weights(node: Any, path: str) -> None:
    from seal_shared.tags import known_tags

    if not isinstance(node, DictConfig):
        raise ConfigError(f"{path}={show(to_plain(node))}: expected a mapping of tag -> weight")
    known = known_tags()
    rule = schema.leaf_specs()[path].rule
    for key, value in node.items():
        if key not in known:
            raise ConfigError(f"{path}.{key}: unknown failure tag (known: {', '.join(sorted(known))})")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}.{key}={show(value)}: expected a number")
        if rule.breaks(value):
            raise rule_error(f"{path}.{key}", value, rule.allowed())


def check_environment(cfg: DictConfig) -> None:
    """``env_service.env`` names an environment the service can serve (``seal.plugins`` were imported
    first, so a plug-in's name is known), whose own checks accept its params block: the interface
    blocks, then its params model (asked of an in-process service, through the client)."""
    from seal.environment import catalogue_of, check_env_params

    name = OmegaConf.select(cfg, "env_service.env")
    try:
        env = catalogue_of(str(name))
    except ValueError as err:  # no environment of that name: the registry's line, with the plug-in route
        raise ConfigError(f"env_service.env={show(name)}: {err}") from None
    block = to_plain(cfg.env_service.get(name))
    if block is None:
        return
    if not isinstance(block, dict):
        raise ConfigError(f"env_service.{name}: expected a mapping of the environment's episode params")
    check_interface(block, env)
    problem = check_env_params(str(name), block)
    if problem:
        raise ConfigError(f"env_service.{name}: {problem}")


def check_interface(block: dict[str, Any], env: Any) -> None:
    """The interface-evolution blocks of the environment's params: each a mapping of known keys with a
    true/false ``enable``, and none turned on that the environment does not honour (it would be a silent
    no-op; :mod:`seal_shared.interface.blocks`)."""
    from seal_shared.interface.blocks import INTERFACE_BLOCKS, block_keys, unhonoured_message

    where = f"env_service.{env.name}"
    for name in INTERFACE_BLOCKS:
        sub = block.get(name)
        if sub is None:
            continue
        if not isinstance(sub, dict):
            raise ConfigError(f"{where}.{name}: expected a mapping of the block's keys (or null), "
                              f"got {type(sub).__name__}")
        known = block_keys(name)
        for key in sub:
            if key not in known:
                near = nearest(str(key), known)
                hint = f"did you mean {near}?; " if near else ""
                raise ConfigError(f"{where}.{name}.{key}: unknown key ({hint}known: {', '.join(known)})")
        enable = sub.get("enable", False)
        if not isinstance(enable, bool):
            raise ConfigError(f"{where}.{name}.enable={enable!r}: expected true or false")
        if enable and name not in env.interface_blocks:
            raise ConfigError(unhonoured_message(name, env.name, tuple(env.interface_blocks), where))


def check_keys_and_types(node: Any, ref: Any, *, path: str = "", added: Sequence[str] = ()) -> None:
    """Walk ``node`` (plain, resolved) against the reference tree ``ref``."""
    if isinstance(ref, dict) and isinstance(node, dict):
        is_open = not ref or path.startswith(OPEN_PREFIXES) or any(path.startswith(a) for a in added if a)
        for key, value in node.items():
            sub = f"{path}.{key}" if path else str(key)
            if key in ref:
                check_keys_and_types(value, ref[key], path=sub, added=added)
            elif not is_open and not any(a == sub or a.startswith(sub + ".") or sub.startswith(a + ".")
                                         for a in added):
                raise ConfigError(unknown_key_message(sub))
        return
    if isinstance(node, str) and "${" in node:
        return
    problem = type_problem(node, ref, path)
    if problem:
        raise ConfigError(f"{path}={show(node)}: expected {problem}")


def type_problem(value: Any, ref: Any, path: str, *, strict_strings: bool = False) -> str | None:
    """What ``value`` should have been (``"int (fix: ...)"``), or None when it fits ``ref``.

    A number where verl expects a string is accepted (Hydra reads ``experiment_name=2024`` as an
    int); ``strict_strings`` refuses it, for SEAL's keys, whose strings are all names of modes.
    """
    if value is None or ref is None or ref == "???":
        return None  # null means "unset" in both trees; ??? is a value verl requires elsewhere
    if path in STR_OR_LIST:
        ok = isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))
        return None if ok else f"a string or a list of strings (fix: e.g. {path}=[{show(ref[0]) if isinstance(ref, list) and ref else 'a'}])"
    if isinstance(ref, dict):
        return None if isinstance(value, dict) else f"a mapping (fix: set its keys, e.g. {path}.<key>=...)"
    if isinstance(ref, list):
        return None if isinstance(value, list) else f"a list (fix: {path}=[a,b])"
    if isinstance(ref, bool):
        return None if isinstance(value, bool) else f"true or false (fix: {path}=true)"
    if isinstance(ref, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
        return None if ok else f"int (fix: a whole number, e.g. {path}={ref})"
    if isinstance(ref, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return None if ok else f"a number (fix: e.g. {path}={ref})"
    if isinstance(ref, str):
        ok = isinstance(value, str) or (not strict_strings and isinstance(value, (int, float))
                                        and not isinstance(value, bool))
        return None if ok else f"a string (fix: e.g. {path}={ref or 'text'})"
    return None


def check_model_path(plain: dict[str, Any]) -> None:
    """A local model folder must exist; checked before any ``from_pretrained`` (which would try
    the hub for about a minute before failing)."""
    model = (plain.get("actor_rollout_ref") or {}).get("model") or {}
    for key in ("path", "tokenizer_path"):
        value = model.get(key)
        if not isinstance(value, str) or not value or not looks_local(value):
            continue
        if resolve_path(value).is_dir():
            continue
        raise ConfigError(f"actor_rollout_ref.model.{key}={value}: no such model folder (fix: run install.sh, "
                     "scripts/prepare_model.py, or give a local folder or a hub id such as Qwen/Qwen2.5-7B-Instruct)")


def check_tasks(plain: dict[str, Any]) -> list[str]:
    """Task ids against the task store, data files on disk; warnings for ids that override files."""
    tasks = (plain.get("seal") or {}).get("tasks") or {}
    data = plain.get("data") or {}
    warnings: list[str] = []
    for split in SPLITS:
        ids = tasks.get(f"{split}_ids")
        files = data.get(f"{split}_files")
        files = [files] if isinstance(files, str) else list(files or [])
        for f in files:
            if not resolve_path(str(f)).is_file():
                wins = f"; seal.tasks.{split}_ids is set and would be used instead" if ids else ""
                raise ConfigError(f"data.{split}_files={f}: file not found (fix: give an existing parquet file, "
                             f"e.g. data/bfcl_{'train' if split == 'train' else 'eval_400'}.parquet{wins})")
        if ids:
            check_task_ids([str(i) for i in ids], f"seal.tasks.{split}_ids",
                           (plain.get("env_service") or {}).get("env"),
                           held_out_allowed=bool(tasks.get("validate_on_test")))
            if files:
                msg = (f"seal.tasks.{split}_ids ({len(ids)} tasks) wins over data.{split}_files="
                       f"{','.join(map(str, files))}, which is not read")
                log.warning(msg)
                warnings.append(msg)
    return warnings


def check_task_ids(ids: Sequence[str], key: str, env_name: str | None = None, *,
                   held_out_allowed: bool = True) -> None:
    """Every id must be a task of the environment (``env_service.env``; BFCL by default) and, unless
    ``held_out_allowed`` (``seal.tasks.validate_on_test``), none of its held-out test split."""
    from seal.environment import catalogue_of, held_out_problem

    env = catalogue_of(env_name or DEFAULT_ENVIRONMENT)
    for tid in ids:
        if tid not in env:
            near = nearest(tid, env.ids())
            hint = f"the nearest is {near}" if near else f"ids look like {env.example_task_id}"
            raise ConfigError(f"{key}: task id {tid!r} does not exist ({hint}; fix: list ids of the {env.name} "
                         "tasks, or leave the key null to use the data file)")
    held, problem = held_out_problem(env, ids, key)
    if held and not held_out_allowed:
        raise ConfigError(problem)
