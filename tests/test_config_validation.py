"""The config composer: experiment YAMLs compose on verl's tree and bad keys fail naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from seal.config import ConfigError, compose_config
from seal.config_check import check_config

SEAL_YAML = "exp/SEAL.yaml"


@pytest.fixture(scope="module")
def seal_cfg():
    return compose_config(SEAL_YAML)


def test_composes_on_verl_tree(seal_cfg):
    # verl's own keys are present (composed from the installed package) next to ours.
    assert seal_cfg.algorithm.adv_estimator == "grpo"
    assert "critic" in seal_cfg and "actor_rollout_ref" in seal_cfg
    assert seal_cfg.seal.advantage.reweighter == "apatch"
    assert seal_cfg.env_service.bfcl.enforce_available_tools is True


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("seal.advantage.apatch.min_scal=1", "seal.advantage.apatch.min_scal"),
        ("seal.reward.mode=3", "seal.reward.mode"),
        ("trainer.backend=tpu", "trainer.backend"),
        ("seal.enable=maybe", "seal.enable"),
        ("seal.advantage.apatch.tag_weights.not_a_tag=2.0", "not_a_tag"),
    ],
)
def test_bad_override_names_the_key(override, fragment):
    with pytest.raises(ConfigError) as info:
        compose_config(SEAL_YAML, [override])
    message = str(info.value)
    assert fragment in message
    assert "\n" not in message


def test_typo_inside_a_yaml_file_is_caught(tmp_path: Path):
    bad = tmp_path / "typo.yaml"
    bad.write_text(
        "defaults:\n  - /SEAL\n  - _self_\nseal:\n  advantage:\n    apatch:\n      max_sacle: 3.0\n"
    )
    with pytest.raises(ConfigError, match=r"seal\.advantage\.apatch\.max_sacle: unknown key"):
        compose_config(bad)


def test_missing_file_is_a_clear_error(tmp_path: Path):
    with pytest.raises(ConfigError, match="expected an existing .yaml file"):
        compose_config(tmp_path / "nope.yaml")


def test_validate_accepts_nulls_for_nullable_knobs(seal_cfg):
    from omegaconf import OmegaConf

    cfg = OmegaConf.merge(seal_cfg, {"env_service": {"url": None}, "seal": {"diagnosis": {"state_dir": "x"}}})
    check_config(cfg, full=False)
