"""The ToolACE-2-Llama-3.1-8B rows of Table 1 (exp/backbones/): each is its parent row on the
ToolACE backbone and the release's `toolace_fc` interface, nothing else."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from env_service.bfcl.episode import BfclEpisode, BfclParams
from env_service.bfcl.tasks import load_store
from seal.config import EXP_DIR, compose_config
from seal.config_check import check_config

TOOLACE = "Team-ACE/ToolACE-2-Llama-3.1-8B"  # paper Tables 1 and 2: ToolACE-2-Llama-3.1-8B
INTERFACE = {"env_service.bfcl.tool_prompt_mode": "toolace_fc", "env_service.bfcl.tool_call_parser": "toolace_fc",
             "env_service.bfcl.tool_result_mode": "toolace_official_prompt"}
ROWS = {"backbones/toolace": ("SEAL", "SEAL_toolace2-8b"),
        "backbones/toolace_vanilla_rl": ("ablations/vanilla_rl", "vanilla_rl_toolace2-8b")}


def _leaves(cfg) -> dict[str, object]:
    out: dict[str, object] = {}

    def walk(node, prefix):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}.{k}" if prefix else str(k))
        else:
            out[prefix] = node

    walk(OmegaConf.to_container(cfg, resolve=False), "")
    return out


@pytest.mark.parametrize("row", list(ROWS))
def test_row_is_its_parent_on_the_toolace_backbone(row):
    parent, name = ROWS[row]
    base, cfg = _leaves(compose_config(EXP_DIR / f"{parent}.yaml")), _leaves(compose_config(EXP_DIR / f"{row}.yaml"))
    assert base.keys() == cfg.keys()
    changed = {k: cfg[k] for k in base if base[k] != cfg[k]}
    assert changed == {"actor_rollout_ref.model.path": TOOLACE, **INTERFACE, "trainer.experiment_name": name}


def test_composed_episode_params_give_the_toolace_interface():
    cfg = compose_config(EXP_DIR / "backbones/toolace.yaml")
    check_config(cfg)  # the project's own validation of keys, types and files
    params = BfclParams.model_validate(OmegaConf.to_container(cfg.env_service.bfcl, resolve=True))
    assert (params.tool_call_parser, params.observation_role) == ("python_list", "ipython")
    system, user = BfclEpisode(load_store().get("multi_turn_base_0"), {**params.model_dump(), "rollout_mode": "validate"}).reset()
    assert "[func_name1(param_name1=param_value1" in system["content"] and "<tool_call>" not in system["content"]
    assert "[required]" not in system["content"]  # validation: the untouched interface
