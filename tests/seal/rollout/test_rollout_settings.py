"""The runner's settings from the config: defaults, validation messages, episode params."""

from __future__ import annotations


import pytest
from omegaconf import OmegaConf

from seal.environment import episode_params
from seal.rollout.settings import RolloutSettings
from seal.schema import default_config

BASE = default_config()


def test_release_defaults_from_the_base_config() -> None:
    s = RolloutSettings.from_config(BASE)
    assert (s.max_llm_calls, s.max_llm_calls_per_turn, s.max_env_tokens, s.few_shot, s.env_retries) == (
        20, None, 4096, False, 1)
    assert s.per_call_tokens == s.response_length  # null max_tokens_per_call = response_length


def test_lengths_come_from_verl_keys() -> None:
    cfg = OmegaConf.merge(BASE, {"data": {"max_prompt_length": 100, "max_response_length": 50}})
    s = RolloutSettings.from_config(cfg)
    assert (s.prompt_length, s.response_length, s.max_model_len) == (100, 50, 150)
    cfg = OmegaConf.merge(cfg, {"actor_rollout_ref": {"rollout": {"prompt_length": 70, "response_length": 30,
                                                                   "max_model_len": 90}}})
    s = RolloutSettings.from_config(cfg)
    assert (s.prompt_length, s.response_length, s.max_model_len) == (70, 30, 90)


@pytest.mark.parametrize("key,value", [("max_llm_calls", 0), ("max_env_tokens", -1), ("env_retries", -1),
                                       ("max_llm_calls_per_turn", 0), ("few_shot", "yes")])
def test_bad_values_name_the_key(key: str, value: object) -> None:
    cfg = OmegaConf.merge(BASE, {"seal": {"rollout": {key: value}}})
    with pytest.raises(ValueError, match=f"seal.rollout.{key}"):
        RolloutSettings.from_config(cfg)


def test_episode_params_merge() -> None:
    params = episode_params(BASE, "validate", {"observation_lite": {"enable": False}, "terminate_on_parse_error": True})
    assert params["rollout_mode"] == "validate" and params["terminate_on_parse_error"] is True
    assert params["observation_lite"]["enable"] is False
    assert params["observation_lite"]["add_enum_hint"] is True  # nested keys merge, not replace
    assert BASE.env_service.bfcl.observation_lite.enable is True  # the config is untouched
    with pytest.raises(ValueError, match="env_params"):
        episode_params(BASE, "sample", ["not", "a", "mapping"])  # type: ignore[arg-type]
