"""docs/extending.md, "Adding a failure tag": a tag registered by a plug-in module fires on a real
checked episode and shows in the diagnosis counts, the A-Patch weights and the guidelines."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from env_service.bfcl.checker import check_episode
from env_service.bfcl.tasks import load_store
from seal.advantage import APatchConfig, apatch_reweight, prepare_tag_weights
from seal.config import REPO_ROOT, ConfigError, compose_config
from seal.config_check import check_config
from seal.diagnosis import CapabilityState, DiagnosisStats
from seal.interface.guidelines import select_guidelines
from seal_shared.interface.guidelines import GuidelineConfig
from seal_shared.tags import known_tags

# Turn 0 of multi_turn_base_0 needs cd, mkdir and mv; the model only makes the folder.
MISSED = [[["mkdir(dir_name='temp')"]], [], [], []]


@pytest.fixture(scope="module")
def task():
    return load_store().get("multi_turn_base_0")


def test_without_the_plugin_the_turn_is_a_state_mismatch(task) -> None:
    check = check_episode(MISSED, task.gt_turns, task.entry)
    assert check.tags[0] == "state_mismatch" and "missed_tool" not in known_tags()


def test_a_plugin_tag_fires_and_flows_into_counts_weights_and_guidelines(plugins, task) -> None:
    check = check_episode(MISSED, task.gt_turns, task.entry)
    assert check.tags == ["missed_tool", "empty_turn_model_response", "empty_turn_model_response",
                          "empty_turn_model_response"]
    assert check.error_type == "multi_turn:instance_state_mismatch" and check.turns[0].valid is False  # verdict kept

    state = CapabilityState()
    for i in range(8):
        state.observe("multi_turn_base", f"multi_turn_base_{i}", 0.0, False, check.tags[:1], epoch=0, step=1)
    assert state.window["tags"]["missed_tool"].count == 8
    cfg = APatchConfig()
    assert cfg.tag_weights["missed_tool"] == 1.7  # the tag's default weight
    weights, kept = prepare_tag_weights(cfg, 1, state, {})  # dynamic update: prevalent and unsolved -> up
    assert weights["missed_tool"] > 1.7
    metrics = DiagnosisStats(state).metrics(kept["tag_weights"])
    assert metrics["seal/diagnosis/dynamic_tag_weight/missed_tool"] == weights["missed_tool"]
    out, metrics = apatch_reweight(torch.ones(1, 2), [check.tags[:1]], cfg=cfg, weights=weights, step=1)
    assert out[0, 0].item() == pytest.approx(min(2.0, weights["missed_tool"]))
    assert metrics["seal/apatch/tag_frac/missed_tool"] == 1.0

    lines = select_guidelines(state, cfg=GuidelineConfig(min_tag_count=1))
    assert lines == ["Before ending a turn, check that you called every tool the request needs, in order."]


def test_config_lists_the_plugin_and_weights_its_tag(plugins) -> None:
    cfg = compose_config(REPO_ROOT / "exp" / "SEAL.yaml", ["seal.plugins=[example_plugins]",
                                                          "+seal.advantage.apatch.tag_weights.missed_tool=1.9"],
                         check=False)
    assert APatchConfig.from_dict(OmegaConf.to_container(cfg.seal.advantage.apatch)).tag_weights["missed_tool"] == 1.9
    OmegaConf.update(cfg, "seal.plugins", ["no_such_plugin_module"], merge=False)
    with pytest.raises(ConfigError, match="seal.plugins: cannot import 'no_such_plugin_module'"):
        check_config(cfg, full=False)
