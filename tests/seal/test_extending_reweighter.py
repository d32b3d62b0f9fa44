"""docs/extending.md, "Adding a reweighter": a reweighter registered by a plug-in module, selected
by config and built from its own ``seal.advantage.<name>`` block, changes the advantages."""

from __future__ import annotations

import json

import pytest
import torch

from seal.advantage import APatchConfig
from seal.config import REPO_ROOT, ConfigError, compose_config
from seal.trainer.coevolution import CoEvolution

SEAL_YAML = REPO_ROOT / "exp" / "SEAL.yaml"
PLUGIN = ["seal.plugins=[example_plugins]", "seal.advantage.reweighter=failure_boost"]


def test_selected_by_config_with_its_own_block(plugins, tmp_path) -> None:
    cfg = compose_config(SEAL_YAML, [*PLUGIN, "+seal.advantage.failure_boost.factor=3.0"], check=False)
    hooks = CoEvolution(cfg, tmp_path)
    assert hooks.reweighter_cfg == plugins.FailureBoostConfig(factor=3.0)
    adv = torch.tensor([[-1.0, 0.5], [-1.0, 0.5], [-2.0, 0.0]])
    out, metrics = hooks.reweight(adv, [["missed_tool", "pass"], ["state_mismatch"], None], step=1)
    assert out.tolist() == [[-3.0, 0.5], [-1.0, 0.5], [-2.0, 0.0]]  # only the tagged row's negative entry
    assert metrics == {"seal/failure_boost/boosted_rows": 1.0}
    assert hooks.reweighter_state == {"runs": 1}  # its own state; A-Patch's weight update did not run


def test_defaults_without_a_block_and_errors_name_the_key(plugins, tmp_path) -> None:
    hooks = CoEvolution(compose_config(SEAL_YAML, PLUGIN, check=False), tmp_path)
    out, _ = hooks.reweight(torch.tensor([[-1.0]]), [["missed_tool"]], step=1)
    assert out.item() == -2.0  # FailureBoostConfig.factor's default
    with pytest.raises(ConfigError, match=r"seal.advantage.failure_boost: unknown key\(s\) \['factr'\]"):
        compose_config(SEAL_YAML, [*PLUGIN, "+seal.advantage.failure_boost.factr=3.0"], check=False)
    with pytest.raises(ConfigError, match=r"^seal.advantage.failure_boost.factor=-1.0: expected a number >= 0$"):
        compose_config(SEAL_YAML, [*PLUGIN, "+seal.advantage.failure_boost.factor=-1.0"], check=False)


def test_apatch_stays_the_default_with_its_block(tmp_path) -> None:
    hooks = CoEvolution(compose_config(SEAL_YAML, check=False), tmp_path)
    assert hooks.reweighter.name == "apatch" and hooks.reweighter_cfg == APatchConfig()
    out, metrics = hooks.reweight(torch.ones(1, 2), [["spurious_tool_call"]], step=1)
    assert out.tolist() == [[2.0, 2.0]] and metrics["seal/apatch/enabled"] == 1.0


def test_its_state_is_kept_and_resumed_with_the_checkpoint(plugins, tmp_path) -> None:
    cfg = compose_config(SEAL_YAML, [*PLUGIN, "+seal.advantage.failure_boost.ramp_steps=3"], check=False)
    hooks = CoEvolution(cfg, tmp_path / "a")

    def boost(h, step):
        return h.reweight(torch.tensor([[-1.0]]), [["missed_tool"]], step=step)[0].item()

    assert boost(hooks, 1) == pytest.approx(-(1 + 1 / 3))  # factor 2, a third of the way
    hooks.save(tmp_path / "ckpt")
    resumed = CoEvolution(cfg, tmp_path / "b")
    resumed.load(tmp_path / "ckpt")
    assert resumed.reweighter_state == hooks.reweighter_state == {"runs": 1}
    assert boost(resumed, 2) == boost(hooks, 2) == pytest.approx(-(1 + 2 / 3))  # the ramp goes on
    assert boost(hooks, 3) == boost(hooks, 4) == -2.0
    assert "runs" not in json.dumps(hooks.state.to_dict())  # the capability state holds only the diagnosis
