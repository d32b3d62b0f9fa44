"""Reward modes: binary, capped (with decay), progress (T3RL); explicit zeros are honoured."""

import pytest

from seal.rewards import RewardConfig, compute_reward, effective_cap

FAILED = {
    "valid": False,
    "accuracy": 0.0,
    "failure_tags": ["pass", "state_mismatch", "correct_abstention", "empty_turn_model_response"],
    "per_turn_valid": [True, False, None, False],
    "passed_turns": 1,
    "scorable_turns": 3,
    "irrelevance_turns": 1,
    "passed_irrelevance_turns": 1,
    "progress": 1 / 3,
    "progress_with_irrelevance": 0.5,
}
PASSED = {**FAILED, "valid": True, "accuracy": 1.0}


def test_binary_default() -> None:
    cfg = RewardConfig()
    assert cfg.mode == "binary"
    r = compute_reward(FAILED, cfg=cfg)
    assert r.score == 0.0
    assert r.meta["tags"] == FAILED["failure_tags"] and r.meta["per_turn_valid"] == FAILED["per_turn_valid"]
    assert r.meta["progress"] == pytest.approx(1 / 3)
    assert compute_reward(PASSED, cfg=cfg).score == 1.0
    assert compute_reward({"valid": True}, cfg=cfg).score == 1.0  # binary needs only the verdict
    with pytest.raises(KeyError, match="neither"):
        compute_reward({}, cfg=cfg)


def test_capped() -> None:
    cfg = RewardConfig(mode="capped", partial_credit_cap=0.7, partial_credit_weight=1.5)
    assert compute_reward(FAILED, cfg=cfg).score == pytest.approx(0.5)  # min(0.7, 1.5/3)
    assert compute_reward({**FAILED, "progress": 0.9}, cfg=cfg).score == pytest.approx(0.7)
    assert compute_reward(PASSED, cfg=cfg).score == 1.0
    seal_recipe = RewardConfig(mode="capped", partial_credit_cap=0.0)  # the release's SEAL setting: binary
    assert compute_reward(FAILED, cfg=seal_recipe).score == 0.0
    no_weight = RewardConfig(mode="capped", partial_credit_weight=0.0)
    assert compute_reward(FAILED, cfg=no_weight).score == 0.0


def test_cap_decay_with_floor() -> None:
    cfg = RewardConfig(mode="capped", partial_credit_cap=0.6, cap_decay=True, min_cap=0.1)
    assert effective_cap(cfg, 0, 6) == pytest.approx(0.6)
    assert effective_cap(cfg, 3, 6) == pytest.approx(0.3)
    assert effective_cap(cfg, 5, 6) == pytest.approx(0.1)  # 0.1 by decay, and the floor
    assert effective_cap(cfg, 6, 6) == pytest.approx(0.1)  # floor
    r = compute_reward({**FAILED, "progress": 1.0}, cfg=cfg, epoch=3, total_epochs=6)
    assert r.score == pytest.approx(0.3) and r.meta["cap"] == pytest.approx(0.3)
    with pytest.raises(ValueError, match="total_epochs"):
        effective_cap(cfg, 0, 0)


def test_progress_t3rl() -> None:
    cfg = RewardConfig(mode="progress", irrelevance_weight=0.5)
    assert compute_reward(FAILED, cfg=cfg).score == pytest.approx((1 + 0.5 * 1) / (3 + 0.5 * 1))
    zero_irr = RewardConfig(mode="progress", irrelevance_weight=0.0)  # 0 means 0, not the default
    assert compute_reward(FAILED, cfg=zero_irr).score == pytest.approx(1 / 3)
    floor = RewardConfig(mode="progress", scorable_floor=True)
    assert compute_reward({**FAILED, "passed_turns": 0}, cfg=floor).score == 0.0
    assert compute_reward({**FAILED, "passed_turns": 0}, cfg=cfg).score == pytest.approx(0.5 / 3.5)
    empty = {**FAILED, "scorable_turns": 0, "irrelevance_turns": 0, "passed_turns": 0, "passed_irrelevance_turns": 0}
    assert compute_reward(empty, cfg=zero_irr).score == pytest.approx(0.5)  # falls back to progress_with_irrelevance
    with pytest.raises(KeyError, match="scorable_turns"):
        compute_reward({"valid": False}, cfg=cfg)


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="mode"):
        RewardConfig(mode="dense")
    with pytest.raises(ValueError, match="partial_credit_cap"):
        RewardConfig(partial_credit_cap=1.5)
    with pytest.raises(ValueError, match="irrelevance_weight"):
        RewardConfig(irrelevance_weight=-1)
    with pytest.raises(ValueError, match="unknown key"):
        RewardConfig.from_dict({"cap": 0.5})
