"""What prepare_config decides for a GPU run: attention without flash-attn, where checkpoints go."""

from __future__ import annotations

import logging

from omegaconf import OmegaConf

from seal.config import compose_config
from seal.trainer.verl.main import flash_attn_installed, prepare_config
from verl.utils.config import omega_conf_to_dataclass


def _model_fields(out):
    model = out.actor_rollout_ref.model
    return (OmegaConf.select(model, "override_config.attn_implementation"), model.use_remove_padding,
            out.actor_rollout_ref.actor.use_remove_padding)


def test_without_flash_attn_the_models_use_sdpa_without_padding_removal(seal_cfg, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="seal.trainer.verl.main"):
        out = prepare_config(seal_cfg, base=tmp_path, exp_dir=tmp_path, flash_attn=False)
    assert _model_fields(out) == ("sdpa", False, False)
    assert out.critic.model.override_config.attn_implementation == "sdpa"
    assert out.critic.model.use_remove_padding is False
    lines = [r.getMessage() for r in caplog.records if "flash-attn" in r.getMessage()]
    assert len(lines) == 1 and "attn_implementation=sdpa" in lines[0]
    assert seal_cfg.actor_rollout_ref.model.use_remove_padding is True  # the input is not modified
    # verl's own model config reads the key where the workers will: HFModelConfig's override_config.
    model = OmegaConf.to_container(out.actor_rollout_ref.model)
    assert model["override_config"] == {"attn_implementation": "sdpa"}


def test_with_flash_attn_the_recipe_is_untouched(seal_cfg, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="seal.trainer.verl.main"):
        out = prepare_config(seal_cfg, base=tmp_path, exp_dir=tmp_path, flash_attn=True)
    assert _model_fields(out) == (None, True, True)
    assert not [r for r in caplog.records if "flash-attn" in r.getMessage()]


def test_an_explicit_attention_setting_wins(tmp_path):
    cfg = compose_config("exp/SEAL.yaml", ["+actor_rollout_ref.model.override_config.attn_implementation=eager",
                                           "actor_rollout_ref.model.use_remove_padding=true"])
    out = prepare_config(cfg, base=tmp_path, exp_dir=tmp_path, flash_attn=False)
    assert _model_fields(out) == ("eager", True, True)


def test_the_installed_flash_attn_is_detected(seal_cfg, tmp_path):
    out = prepare_config(seal_cfg, base=tmp_path, exp_dir=tmp_path)
    expected = (None, True, True) if flash_attn_installed() else ("sdpa", False, False)
    assert _model_fields(out) == expected


def test_the_sdpa_config_builds_verls_actor_config(seal_cfg, tmp_path):
    out = prepare_config(seal_cfg, base=tmp_path, exp_dir=tmp_path, flash_attn=False)
    actor = omega_conf_to_dataclass(out.actor_rollout_ref.actor)
    assert actor.use_remove_padding is False


def test_checkpoints_default_to_the_experiment_folder(tmp_path):
    cfg = compose_config("exp/SEAL.yaml", ["trainer.experiment_name=run7"])
    out = prepare_config(cfg, base=tmp_path, exp_dir=tmp_path / "experiments" / "run7")
    assert out.trainer.default_local_dir == str(tmp_path / "experiments" / "run7" / "checkpoints")


def test_an_explicit_checkpoint_folder_wins(tmp_path):
    cfg = compose_config("exp/SEAL.yaml", [f"trainer.default_local_dir={tmp_path / 'elsewhere'}"])
    out = prepare_config(cfg, base=tmp_path, exp_dir=tmp_path / "experiments" / "SEAL")
    assert out.trainer.default_local_dir == str(tmp_path / "elsewhere")


def test_every_experiment_config_keeps_checkpoints_in_its_folder():
    from pathlib import Path

    from seal.config import REPO_ROOT

    for path in sorted((REPO_ROOT / "exp").rglob("*.yaml")):
        rel = str(path.relative_to(REPO_ROOT))
        if rel == "exp/seal_base.yaml":
            continue  # the framework's blocks, composed by the others
        cfg = compose_config(rel)
        expected = Path("experiments") / str(cfg.trainer.experiment_name) / "checkpoints"
        assert Path(str(cfg.trainer.default_local_dir)) == expected, rel
