"""Best-validation-step checkpoints on the verl backend: ``SealPPOTrainer._validate`` after
verl's validation pass, verl's own V1 ``_save_checkpoint`` / ``_load_checkpoint`` on a stand-in
worker group. verl's validation pass (rollouts through TransferQueue) is replaced by scripted
scores in verl's metric names (``val-core/<category>/reward/mean@1``), as ``fit()`` would receive them."""

from __future__ import annotations

import json
import os

import pytest
from verl_testkit import make_trainer

pytest.importorskip("verl")

from omegaconf import OmegaConf  # noqa: E402
from verl.trainer.ppo.v1.trainer_base import PPOTrainer  # noqa: E402

from seal.config import ConfigError  # noqa: E402


def _cfg(seal_cfg, root, **trainer):
    cfg = OmegaConf.create(OmegaConf.to_container(seal_cfg, resolve=True))
    cfg.trainer.default_local_dir = str(root)
    for key, value in trainer.items():
        cfg.trainer[key] = value
    return cfg


@pytest.fixture
def scripted_validation(monkeypatch):
    """verl's ``_validate`` returns the next scores: (multi_turn_base, multi_turn_miss_func)."""
    scores: list[tuple[float, float]] = []

    def validate(self):
        base, miss = scores.pop(0)
        return {"val-core/multi_turn_miss_func/reward/mean@1": miss, "val-core/multi_turn_base/reward/mean@1": base,
                "val-aux/multi_turn_base/reward/std@1": 0.0, "val-aux/num_turns/mean": 3.0}

    monkeypatch.setattr(PPOTrainer, "_validate", validate)
    return scores


def _steps(root) -> list[int]:
    return sorted(int(p.name.rsplit("_", 1)[1]) for p in root.glob("global_step_*"))


def _fit(trainer, *, first: int, last: int, test_freq: int, save_freq: int) -> dict[int, dict]:
    """verl's fit() order: validation before training, then per step the periodic save (after the
    actor update) and the validation."""
    logged = {}
    trainer.global_steps = first - 1
    logged[trainer.global_steps] = trainer._validate()
    for step in range(first, last + 1):
        trainer.global_steps = step
        if save_freq > 0 and (step == last or step % save_freq == 0):
            trainer._save_checkpoint()
        if step == last or step % test_freq == 0:
            logged[step] = trainer._validate()
    return logged


def test_best_step_kept_with_the_latest(seal_cfg, tmp_path, scripted_validation):
    root = tmp_path / "ckpt"
    cfg = _cfg(seal_cfg, root)  # exp/SEAL.yaml: save_freq 10, test_freq 10, best kept
    assert cfg.trainer.save_best_checkpoint and cfg.trainer.keep_only_best_checkpoint
    trainer = make_trainer(cfg, tmp_path / "run", step=0, total_steps=30)
    # base per validation (steps 0, 10, 20, 30): 0.2, 0.5, 0.5 (a tie), 0.4; miss_func peaks at 20.
    scripted_validation[:] = [(0.2, 0.1), (0.5, 0.1), (0.5, 0.9), (0.4, 0.1)]
    logged = _fit(trainer, first=1, last=30, test_freq=10, save_freq=10)

    marker = json.loads((root / "best_checkpoint.json").read_text())
    assert marker["global_step"] == 10 and marker["metric_name"] == "val-core/multi_turn_base/reward/mean@1"
    assert os.readlink(root / "best") == "global_step_10"
    assert _steps(root) == [10, 30] and (root / "latest_checkpointed_iteration.txt").read_text() == "30"
    assert (root / "global_step_10" / "seal").is_dir() and (root / "global_step_10" / "data.pt").is_file()
    # The initial model was the first best (saved at step 0, like the release), then replaced.
    assert logged[0]["best_checkpoint/saved"] == 1.0 and logged[10]["best_checkpoint/removed_non_best"] == 1.0
    assert logged[20]["best_checkpoint/saved"] == 0.0 and logged[20]["best_checkpoint/best_step"] == 10.0
    # Step 10 was saved once (periodic save), not again for being the best.
    saved = [s for _, s in trainer.actor_rollout_wg.saved]
    assert saved == [0, 10, 20, 30]


def test_resume_restores_the_best(seal_cfg, tmp_path, scripted_validation):
    root = tmp_path / "ckpt"
    cfg = _cfg(seal_cfg, root)
    first = make_trainer(cfg, tmp_path / "run", step=0, total_steps=30)
    scripted_validation[:] = [(0.2, 0.0), (0.6, 0.0), (0.3, 0.0)]
    _fit(first, first=1, last=20, test_freq=10, save_freq=10)  # interrupted after step 20
    assert _steps(root) == [10, 20]

    resumed = make_trainer(cfg, tmp_path / "run", step=0, total_steps=30)
    resumed._load_checkpoint()
    assert resumed.global_steps == 20
    # val_before_train re-validates step 20 (0.3), then step 30 scores 0.5: neither beats 0.6.
    scripted_validation[:] = [(0.3, 0.0), (0.5, 0.0)]
    _fit(resumed, first=21, last=30, test_freq=10, save_freq=10)
    assert json.loads((root / "best_checkpoint.json").read_text())["global_step"] == 10
    assert _steps(root) == [10, 30]
    assert [s for _, s in resumed.actor_rollout_wg.saved] == [30]  # step 20 was not saved again


def test_off_saves_nothing_extra(seal_cfg, tmp_path, scripted_validation):
    root = tmp_path / "ckpt"
    trainer = make_trainer(_cfg(seal_cfg, root, save_best_checkpoint=False), tmp_path / "run", step=0)
    scripted_validation[:] = [(0.2, 0.0), (0.6, 0.0)]
    logged = _fit(trainer, first=1, last=10, test_freq=10, save_freq=-1)
    assert _steps(root) == [] and not (root / "best_checkpoint.json").exists()
    assert not any(k.startswith("best_checkpoint/") for k in logged[10])


def test_unknown_metric_names_the_reported_ones(seal_cfg, tmp_path, scripted_validation):
    cfg = _cfg(seal_cfg, tmp_path / "ckpt", best_checkpoint_metric="val-core/overall/reward/mean@1")
    trainer = make_trainer(cfg, tmp_path / "run", step=0)
    scripted_validation[:] = [(0.2, 0.0)]
    with pytest.raises(ConfigError, match="reported: .*val-core/multi_turn_base/reward/mean@1"):
        trainer._validate()
