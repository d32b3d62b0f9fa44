"""The config schema (seal/schema.py) is the one statement of every SEAL key and its default.

* Every key an experiment file sets (``exp/**/*.yaml``, ablations and examples included) is a
  field of the schema, a key of verl's installed ``ppo_trainer`` config, or a key of the named
  environment's params block (its own params model judges it).
* No default is stated in Python outside the schema. The checkable rule: (a) no call in ``seal/``
  reads a leaf key of the schema with a literal fallback (other than None):
  ``select(cfg, "<schema key>", <literal>)``, ``OmegaConf.select(cfg, "<schema key>",
  default=<literal>)``, or ``<x>.get("<leaf name of a schema key>", <literal>)`` (the leaf name
  ``enable`` is left out of the last form: every interface block has one too); (b) the settings classes built from the config (``RolloutSettings``,
  ``WarmStartSettings``, ``DiagnosisConfig``, ``GuidelineConfig`` against the recipe's
  ``diagnostic_evolution`` block) have no field default that differs from the schema's.
* ``seal config --show`` lists every key with its default and a doc.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from seal import schema
from seal.config_base import EXP_DIR, REPO_ROOT

OPEN_MAPS = ("seal.advantage.apatch.tag_weights", "ray_kwargs.ray_init")
LITERALS = (ast.Constant, ast.List, ast.Dict, ast.Tuple)


@functools.lru_cache(maxsize=1)
def verl_tree() -> dict[str, Any]:
    from hydra import compose, initialize_config_module

    with initialize_config_module("verl.trainer.config", version_base=None):
        return OmegaConf.to_container(compose(config_name="ppo_trainer"), resolve=False)


def _has(tree: Any, key: str) -> bool:
    for part in key.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return False
        tree = tree[part]
    return True


def _is_field(key: str) -> bool:
    """Whether the dotted ``key`` is a block or a leaf of the schema."""
    try:
        schema.schema_default(key)
    except KeyError:
        return False
    return True


def _leaves(node: Any, prefix: str = "") -> list[str]:
    if isinstance(node, dict) and node:
        return [k for key, value in node.items() for k in _leaves(value, f"{prefix}.{key}" if prefix else str(key))]
    return [prefix]


def stray_keys(tree: dict[str, Any]) -> list[str]:
    """The keys of a raw experiment file that neither the schema, verl nor the environment knows."""
    from env_service.registry import get_environment, known_environments

    from seal.config_check import check_interface

    stray = []
    for env in set(tree.get("env_service") or {}) & set(known_environments()):
        block = tree["env_service"][env]
        environment = get_environment(env)
        try:
            check_interface(block, environment)
            if environment.check_params is not None:
                environment.check_params(dict(block))
        except ValueError:
            stray.append(f"env_service.{env}")
    for key in _leaves({k: v for k, v in tree.items() if k != "defaults"}):
        parts = key.split(".")
        if parts[0] == "env_service" and len(parts) > 2 and parts[1] in known_environments():
            continue
        if key.startswith(OPEN_MAPS) or _is_field(key) or _has(verl_tree(), key):
            continue
        stray.append(key)
    return stray


EXP_FILES = sorted(EXP_DIR.rglob("*.yaml"))


@pytest.mark.parametrize("path", EXP_FILES, ids=lambda p: str(p.relative_to(EXP_DIR)))
def test_every_key_of_an_experiment_file_is_a_schema_verl_or_environment_key(path: Path):
    assert stray_keys(OmegaConf.to_container(OmegaConf.load(path))) == []


def test_a_misspelt_key_is_found():
    assert EXP_FILES and any(p.parent.name == "ablations" for p in EXP_FILES)
    assert stray_keys({"seal": {"rollout": {"max_llm_cals": 3}}, "data": {"seed": 1}}) == ["seal.rollout.max_llm_cals"]
    assert stray_keys({"env_service": {"bfcl": {"strict_tool_parsr": True}}}) == ["env_service.bfcl"]


def _schema_leaf_names() -> set[str]:
    """Leaf names of the schema's keys and of the guideline thresholds of a ``diagnostic_evolution``
    block (:class:`~seal_shared.interface.guidelines.GuidelineConfig` is that block's schema)."""
    from seal_shared.interface.guidelines import GuidelineConfig

    guideline = {f.name for f in dataclasses.fields(GuidelineConfig)} | {"category_tags"}
    return ({key.rsplit(".", 1)[-1] for key, _, _ in schema.entries()} | guideline) - {"enable"}


def _is_leaf(key: str) -> bool:
    return _is_field(key) and not isinstance(schema.schema_default(key), dict)


def literal_fallbacks(source: str) -> list[str]:
    """Config reads of a schema key with a literal fallback (the rule in the module docstring)."""
    names = _schema_leaf_names()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        key = node.args[1] if name == "select" and len(node.args) > 1 else node.args[0]
        if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
            continue
        fallback = [k.value for k in node.keywords if k.arg == "default"]
        fallback += node.args[2:3] if name == "select" else node.args[1:2] if name == "get" else []
        literal = [f for f in fallback if isinstance(f, LITERALS) and not (isinstance(f, ast.Constant) and f.value is None)]
        if not literal:
            continue
        if (name == "select" and _is_leaf(key.value)) or (name == "get" and key.value in names):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_no_schema_default_is_restated_in_python():
    hits = {}
    for path in sorted((REPO_ROOT / "seal").rglob("*.py")):
        if path.name != "schema.py":
            found = literal_fallbacks(path.read_text(encoding="utf-8"))
            if found:
                hits[str(path.relative_to(REPO_ROOT))] = found
    assert hits == {}


def test_the_rule_catches_a_restated_default():
    assert literal_fallbacks('x = select(cfg, "seal.rollout.max_llm_calls", 20)')
    assert literal_fallbacks('x = OmegaConf.select(cfg, "env_service.timeout_s", default=60.0)')
    assert literal_fallbacks('x = block.get("max_llm_calls", 20)')
    assert literal_fallbacks('x = evo.get("prevalence_threshold", 0.10)')
    assert not literal_fallbacks('x = select(cfg, "seal.rollout.max_llm_calls")')
    assert not literal_fallbacks('x = select(cfg, "data.max_prompt_length", 12288)')


def test_settings_classes_default_to_the_schema():
    from seal.diagnosis.stats import DiagnosisConfig
    from seal.rollout.settings import RolloutSettings
    from seal.warm_start.settings import WarmStartSettings
    from seal_shared.interface.guidelines import GuidelineConfig

    for cls, prefix in ((RolloutSettings, "seal.rollout"), (WarmStartSettings, "seal.warm_start"),
                        (DiagnosisConfig, "seal.diagnosis")):
        for f in dataclasses.fields(cls):
            if _is_field(f"{prefix}.{f.name}"):
                assert getattr(cls(), f.name) == schema.schema_default(f"{prefix}.{f.name}"), (cls, f.name)
    recipe = schema.default_config().env_service.bfcl.diagnostic_evolution
    defaults = GuidelineConfig()
    for key in ("min_tag_count", "prevalence_threshold", "reward_threshold", "max_lines"):
        assert recipe[key] == getattr(defaults, key), key
    assert recipe.category_tags == defaults.per_category


def test_every_key_is_listed_with_a_doc(capsys):
    from seal.cli import main

    assert main(["config", "--show"]) == 0
    out = capsys.readouterr().out
    keys = [key for key, _, _ in schema.entries()]
    assert len(keys) > 70 and all(f"{key} = " in out for key in keys)
    assert "(no doc)" not in out
    assert all(doc for _, _, doc in schema.entries())
    assert "seal.reward.mode = \"binary\"\n    binary (the paper's recipe) | capped | progress.\n" \
           "    allowed: one of binary, capped, progress\n" in out
