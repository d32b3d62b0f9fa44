"""Every config value is checked in the one pass, before anything starts.

Each key of the SEAL schema (enumerated from the schema, so a new key is walked too) refuses a
value outside its rule, a value of another type and a null its field does not allow; so do the
verl keys a run reads, and verl's batch-size arithmetic. Each refusal is one ``error:`` line
naming the key and the value, exit code 2, no experiment folder and no trainer.

The walk runs ``launcher.main`` in-process on exp/quickstart.yaml. Hydra composes it once; each
value is then set as Hydra parses the override, on the composition with its interpolations
resolved (resolving verl's tree on every check would make the walk take minutes).
:func:`test_the_walk_refuses_as_hydra_composition_does` holds that shortcut to a real
composition. A few keys run the real launcher in a subprocess, which must fail before any model
or tokenizer loads.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from omegaconf import Container, DictConfig, OmegaConf

import launcher
from seal import schema
from seal.config import ConfigError, compose_config
from seal.config_base import FieldSpec, Rule, show
from seal.config_check import check_config, reference_tree
from seal.config_values import LOCAL_RULES, VERL_RULES

QUICK = str(launcher.REPO_ROOT / "exp" / "quickstart.yaml")
ILL_TYPED = {bool: "maybe", int: "abc", float: "abc", str: 123, list: "abc", dict: "abc"}
SCHEMA_KEYS = schema.leaf_specs()


def outside(rule: Rule, kind: type) -> Any:
    """A value of the key's type (``kind``) that ``rule`` refuses."""
    if rule.choices is not None:
        numbers = [c for c in rule.names() if isinstance(c, (int, float))]
        return max(numbers) + 1 if numbers else "bogus"
    if rule.pattern is not None:
        return "bad/"
    if rule.le is not None:
        return rule.le + 1
    if rule.gt is not None:
        return rule.gt
    return rule.ge - (1 if kind is int else 0.5)


def bad_values(key: str, spec: FieldSpec) -> list[tuple[str, Any]]:
    """``(key, value)`` pairs the schema key must refuse: a value outside its rule (a mapping's rule:
    one of its entries), one of another type, and null where its field does not allow it."""
    out = []
    if spec.rule is not None and spec.kind is dict:
        out.append((f"{key}.{next(iter(schema.schema_default(key)))}", outside(spec.rule, float)))
    elif spec.rule is not None:
        out.append((key, outside(spec.rule, spec.kind)))
    out.append((key, ILL_TYPED[spec.kind]))
    if not spec.nullable:
        out.append((key, None))
    return out


def verl_bad_values() -> list[tuple[str, Any]]:
    """A value outside the rule of each verl key a run reads (the local trainer's too), of the
    type of verl's default (an integer where verl's default is null)."""
    reference = OmegaConf.create(reference_tree())
    return [(key, outside(rule, float if isinstance(OmegaConf.select(reference, key), float) else int))
            for key, rule in {**VERL_RULES, **LOCAL_RULES}.items()]


def _parse(override: str) -> tuple[str, Any]:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_override(override)
    return parsed.key_or_group, parsed.value()


@pytest.fixture(scope="module")
def composed() -> DictConfig:
    """exp/quickstart.yaml as Hydra composes it (the pass accepts it), interpolations resolved."""
    cfg = OmegaConf.create(OmegaConf.to_container(compose_config(QUICK), resolve=True))
    OmegaConf.set_struct(cfg, True)
    return cfg


@contextlib.contextmanager
def overridden(cfg: DictConfig, overrides: Sequence[str]) -> Iterator[DictConfig]:
    """``cfg`` with the overrides set as Hydra parses them, restored afterwards."""
    saved = []
    try:
        for override in overrides:
            key, value = _parse(override)
            old = OmegaConf.select(cfg, key)
            saved.append((key, OmegaConf.to_container(old) if isinstance(old, Container) else old))
            OmegaConf.update(cfg, key, value, merge=False)
        yield cfg
    finally:
        for key, old in reversed(saved):
            OmegaConf.update(cfg, key, old, merge=False)


@pytest.fixture
def walk(composed, monkeypatch, tmp_path, capsys):
    """``run(override) -> (exit code, stderr lines)`` of ``launcher.main`` in ``tmp_path``, Hydra's
    composition replaced by ``composed`` plus the override. Nothing after the pass may run."""
    import hydra

    stack = contextlib.ExitStack()

    def compose(config_name: str, overrides: list[str]) -> DictConfig:
        return stack.enter_context(overridden(composed, [o for o in overrides if not o.startswith("hydra.")]))

    def after_the_pass(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the config pass let the value through")

    monkeypatch.setattr(hydra, "compose", compose)
    monkeypatch.setattr(launcher, "choose_service", after_the_pass)
    monkeypatch.setattr(launcher, "dispatch", after_the_pass)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SEAL_DEBUG", "")

    def run(override: str) -> tuple[int, list[str]]:
        with stack:
            code = launcher.main(["--conf", QUICK, "--", override])
        assert not (tmp_path / "experiments").exists()
        return code, capsys.readouterr().err.strip().splitlines()

    return run


def _assert_refused(run, key: str, value: Any) -> str:
    override = f"{key}={show(value)}"
    code, lines = run(override)
    assert code == 2, (override, lines)
    assert len(lines) == 1 and lines[0].startswith("error: "), (override, lines)
    assert key in lines[0] and show(value) in lines[0], (override, lines)
    return lines[0]


def test_the_walk_covers_every_key_of_the_schema():
    assert list(SCHEMA_KEYS) == [key for key, _, _ in schema.entries()] and len(SCHEMA_KEYS) > 70


@pytest.mark.parametrize("key", list(SCHEMA_KEYS))
def test_every_schema_key_refuses_a_bad_value_in_one_line(walk, key):
    """The launcher, for every key: its first bad value (outside the rule where it has one)."""
    _assert_refused(walk, *bad_values(key, SCHEMA_KEYS[key])[0])


def test_every_schema_key_refuses_each_of_its_bad_values(composed):
    """The pass, for every bad value of every key: the rule, the type, null."""
    refused = 0
    for key, spec in SCHEMA_KEYS.items():
        for bad_key, value in bad_values(key, spec):
            with overridden(composed, [f"{bad_key}={show(value)}"]) as cfg, pytest.raises(ConfigError) as info:
                check_config(cfg)
            line = str(info.value)
            assert "\n" not in line and bad_key in line and show(value) in line, (bad_key, value, line)
            refused += 1
    assert refused > 2 * len(SCHEMA_KEYS)


@pytest.mark.parametrize(("key", "value"), verl_bad_values(), ids=lambda v: v if isinstance(v, str) else show(v))
def test_every_verl_key_a_run_reads_refuses_a_value_outside_its_rule(walk, key, value):
    assert ": expected " in _assert_refused(walk, key, value)


@pytest.mark.parametrize("override", ["seal.reward.mode=bogus", "actor_rollout_ref.actor.optim.lr=-1",
                                      "data.max_response_length=0"])
def test_the_walk_refuses_as_hydra_composition_does(walk, override):
    """The shortcut gives Hydra's composition's line, for a value a verl interpolation reads too
    (``rollout.response_length`` is ``${data.max_response_length}``)."""
    with pytest.raises(ConfigError) as hydra_composed:
        compose_config(QUICK, [override])
    assert walk(override) == (2, [f"error: {hydra_composed.value}"])


def _refused(composed: DictConfig, overrides: Sequence[str]) -> str:
    with overridden(composed, overrides) as cfg, pytest.raises(ConfigError) as info:
        check_config(cfg)
    assert "\n" not in str(info.value)
    return str(info.value)


@pytest.mark.parametrize(("overrides", "line"), [
    (["actor_rollout_ref.actor.ppo_mini_batch_size=3"],
     "actor_rollout_ref.actor.ppo_mini_batch_size=3: expected a divisor of data.train_batch_size=4"),
    (["seal.advantage.apatch.min_scale=3.0"],
     "seal.advantage.apatch.min_scale=3: expected a number <= seal.advantage.apatch.max_scale=2"),
    (["seal.advantage.apatch.budget.min_scale=3.0"],
     "seal.advantage.apatch.budget.min_scale=3: expected a number <= "),
    (["actor_rollout_ref.rollout.max_model_len=512"],
     "actor_rollout_ref.rollout.max_model_len=512: expected an integer > "
     "actor_rollout_ref.rollout.response_length"),
    (["trainer.save_best_checkpoint=true", "trainer.max_actor_ckpt_to_keep=2"],
     "trainer.max_actor_ckpt_to_keep=2: expected null with trainer.save_best_checkpoint=true"),
])
def test_rules_between_keys_fail_in_the_pass(composed, overrides, line):
    assert _refused(composed, overrides).startswith(line)


@pytest.mark.parametrize(("overrides", "line"), [
    (["trainer.n_gpus_per_node=3"], "data.train_batch_size=4: expected data.train_batch_size x "
                                    "actor_rollout_ref.rollout.n (4 x 4) divisible by the 3 GPUs"),
    (["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=2", "trainer.n_gpus_per_node=16"],
     "actor_rollout_ref.actor.ppo_mini_batch_size=2: expected ppo_mini_batch_size x actor_rollout_ref.rollout.n "
     "(2 x 4) divisible by the 16 data-parallel ranks"),
    (["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null"],
     "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null: expected an integer >= 1"),
    (["actor_rollout_ref.rollout.log_prob_micro_batch_size=2"],
     "actor_rollout_ref.rollout.log_prob_micro_batch_size=2: expected null next to"),
    (["trainer.critic_warmup=2"], "trainer.critic_warmup=2: verl skips the actor update"),
])
def test_the_verl_backend_needs_verls_batch_arithmetic_in_the_pass(composed, overrides, line):
    assert _refused(composed, ["trainer.backend=verl", *overrides]).startswith(line)
    # The local trainer has no GPUs to spread over, no micro-batches, no critic: the values pass there.
    with overridden(composed, overrides) as cfg:
        check_config(cfg)


def test_the_settings_classes_state_the_schemas_rules():
    """Built in code, a settings class refuses what the pass refuses, in the same words."""
    from seal.advantage.weights import APatchConfig, DynamicConfig
    from seal.diagnosis.stats import DiagnosisConfig
    from seal.rewards import RewardConfig
    from seal.rollout.settings import RolloutSettings
    from seal.warm_start.settings import WarmStartSettings

    for build, line in [
        (lambda: RewardConfig(mode="dense"), "seal.reward.mode=dense: expected one of binary, capped, progress"),
        (lambda: RewardConfig(partial_credit_cap=1.5),
         "seal.reward.partial_credit_cap=1.5: expected a number >= 0 and <= 1"),
        (lambda: APatchConfig(warmup_steps=-1), "seal.advantage.apatch.warmup_steps=-1: expected an integer >= 0"),
        (lambda: APatchConfig(tag_weights={"pass": -1.0}),
         "seal.advantage.apatch.tag_weights.pass=-1.0: expected a number >= 0"),
        (lambda: DynamicConfig(ema_beta=float("nan")),
         "seal.advantage.apatch.dynamic.ema_beta=nan: expected a number >= 0 and <= 1"),
        (lambda: RolloutSettings(max_llm_calls=0), "seal.rollout.max_llm_calls=0: expected an integer >= 1"),
        (lambda: RolloutSettings(episode_budget="turns"),
         "seal.rollout.episode_budget=turns: expected one of context, response"),
        (lambda: WarmStartSettings(lr=0.0), "seal.warm_start.lr=0.0: expected a number > 0"),
        (lambda: DiagnosisConfig(save_every_n_steps=-2),
         "seal.diagnosis.save_every_n_steps=-2: expected an integer >= 0"),
    ]:
        with pytest.raises(ConfigError) as info:
            build()
        assert str(info.value) == line


def test_the_built_in_reweighters_are_named_without_torch():
    """The pass lists them without importing their torch module; importing it registers those."""
    from seal.advantage import BUILTIN_REWEIGHTERS, get_reweighter_spec

    assert [get_reweighter_spec(name).name for name in BUILTIN_REWEIGHTERS] == list(BUILTIN_REWEIGHTERS)


# The launcher itself, one process per value: the four values that used to fail late (or not at
# all), and a rule between keys. TRANSFORMERS_VERBOSITY=info makes a tokenizer or model load write
# to stderr, and the launcher logs its experiment folder: one line means neither happened.
REAL = {
    "seal.reward.mode=bogus": "error: seal.reward.mode=bogus: expected one of binary, capped, progress",
    "actor_rollout_ref.actor.optim.lr=-1": "error: actor_rollout_ref.actor.optim.lr=-1: expected a number > 0",
    "seal.rollout.max_llm_calls=0": "error: seal.rollout.max_llm_calls=0: expected an integer >= 1",
    "trainer.total_epochs=-3": "error: trainer.total_epochs=-3: expected an integer >= 1",
    "actor_rollout_ref.actor.ppo_mini_batch_size=3": "error: actor_rollout_ref.actor.ppo_mini_batch_size=3: "
                                                     "expected a divisor of data.train_batch_size=4",
}


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> dict[str, tuple[int, str, Path]]:
    """``override -> (exit code, stderr, its working folder)``; the processes run side by side."""
    env = {**os.environ, "SEAL_DEBUG": "", "TRANSFORMERS_VERBOSITY": "info", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(launcher.REPO_ROOT)}
    procs = {}
    for override in REAL:
        cwd = tmp_path_factory.mktemp("run")
        cmd = [sys.executable, str(launcher.REPO_ROOT / "launcher.py"), "--conf", QUICK, "--", override]
        procs[override] = (subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.PIPE, text=True), cwd)
    out = {}
    for override, (proc, cwd) in procs.items():
        _, err = proc.communicate(timeout=300)
        out[override] = (proc.returncode, err, cwd)
    return out


@pytest.mark.parametrize("override", list(REAL))
def test_the_launcher_refuses_a_bad_value_before_anything_starts(launched, override):
    code, err, cwd = launched[override]
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith(REAL[override]), err
    assert list(cwd.iterdir()) == []  # no experiments/ folder, nothing else either
