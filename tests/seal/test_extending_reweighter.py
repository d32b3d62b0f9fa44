"""docs/extending.md, "Adding a reweighter": a reweighter registered by a plug-in module, selected
by config and built from its own ``seal.advantage.<name>`` block, changes the advantages."""

from __future__ import annotations

import pytest
import torch

from seal.config import REPO_ROOT, ConfigError, compose_config
from seal.trainer.hooks import SealHooks

SEAL_YAML = REPO_ROOT / "exp" / "SEAL.yaml"
PLUGIN = ["seal.plugins=[example_plugins]", "seal.advantage.reweighter=failure_boost"]


def test_selected_by_config_with_its_own_block(plugins, tmp_path) -> None:
    cfg = compose_config(SEAL_YAML, [*PLUGIN, "+seal.advantage.failure_boost.factor=3.0"], check=False)
    hooks = SealHooks(cfg, tmp_path)
    assert hooks.reweighter_cfg == plugins.FailureBoostConfig(factor=3.0)
    adv = torch.tensor([[-1.0, 0.5], [-1.0, 0.5], [-2.0, 0.0]])
    out, metrics = hooks.reweight(adv, [["missed_tool", "pass"], ["state_mismatch"], None], step=1)
    assert out.tolist() == [[-3.0, 0.5], [-1.0, 0.5], [-2.0, 0.0]]  # only the tagged row's negative entry
    assert metrics == {"seal/failure_boost/boosted_rows": 1.0}
    assert hooks.state.dynamic_tag_weights == {}  # A-Patch's weight update is A-Patch's, not the hook's


def test_defaults_without_a_block_and_errors_name_the_key(plugins, tmp_path) -> None:
    hooks = SealHooks(compose_config(SEAL_YAML, PLUGIN, check=False), tmp_path)
    out, _ = hooks.reweight(torch.tensor([[-1.0]]), [["missed_tool"]], step=1)
    assert out.item() == -2.0  # FailureBoostConfig.factor's default
    with pytest.raises(ConfigError, match=r"seal.advantage.failure_boost: unknown key\(s\) \['factr'\]"):
        compose_config(SEAL_YAML, [*PLUGIN, "+seal.advantage.failure_boost.factr=3.0"], check=False)
    with pytest.raises(ConfigError, match="factor must be >= 0"):
        compose_config(SEAL_YAML, [*PLUGIN, "+seal.advantage.failure_boost.factor=-1.0"], check=False)


def test_apatch_stays_the_default_with_its_block(tmp_path) -> None:
    hooks = SealHooks(compose_config(SEAL_YAML, check=False), tmp_path)
    assert hooks.reweighter.name == "apatch" and hooks.reweighter_cfg is hooks.apatch_cfg
    out, metrics = hooks.reweight(torch.ones(1, 2), [["spurious_tool_call"]], step=1)
    assert out.tolist() == [[2.0, 2.0]] and metrics["seal/apatch/enabled"] == 1.0
