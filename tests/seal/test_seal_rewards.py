"""Reward modes: binary, capped (with decay), progress (T3RL); explicit zeros are honoured."""

import pytest

from seal.episode import EpisodeResult, Evaluation, WireFormatError
from seal.rewards import RewardConfig, compute_reward, effective_cap, episode_reward


def reward(wire: dict, **kwargs):
    """compute_reward on the environment's wire result, parsed as every consumer parses it."""
    return compute_reward(Evaluation.from_wire(wire), **kwargs)

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
    r = reward(FAILED, cfg=cfg)
    assert r.score == 0.0
    assert r.meta["tags"] == FAILED["failure_tags"] and r.meta["per_turn_valid"] == FAILED["per_turn_valid"]
    assert r.meta["progress"] == pytest.approx(1 / 3)
    assert reward(PASSED, cfg=cfg).score == 1.0
    assert reward({"valid": True, "failure_tags": []}, cfg=cfg).score == 1.0  # binary needs only the verdict
    with pytest.raises(WireFormatError, match="lacks"):
        Evaluation.from_wire({})


def test_capped() -> None:
    cfg = RewardConfig(mode="capped", partial_credit_cap=0.7, partial_credit_weight=1.5)
    assert reward(FAILED, cfg=cfg).score == pytest.approx(0.5)  # min(0.7, 1.5/3)
    assert reward({**FAILED, "progress": 0.9}, cfg=cfg).score == pytest.approx(0.7)
    assert reward(PASSED, cfg=cfg).score == 1.0
    seal_recipe = RewardConfig(mode="capped", partial_credit_cap=0.0)  # the release's SEAL setting: binary
    assert reward(FAILED, cfg=seal_recipe).score == 0.0
    no_weight = RewardConfig(mode="capped", partial_credit_weight=0.0)
    assert reward(FAILED, cfg=no_weight).score == 0.0


def test_cap_decay_with_floor() -> None:
    cfg = RewardConfig(mode="capped", partial_credit_cap=0.6, cap_decay=True, min_cap=0.1)
    assert effective_cap(cfg, 0, 6) == pytest.approx(0.6)
    assert effective_cap(cfg, 3, 6) == pytest.approx(0.3)
    assert effective_cap(cfg, 5, 6) == pytest.approx(0.1)  # 0.1 by decay, and the floor
    assert effective_cap(cfg, 6, 6) == pytest.approx(0.1)  # floor
    r = reward({**FAILED, "progress": 1.0}, cfg=cfg, epoch=3, total_epochs=6)
    assert r.score == pytest.approx(0.3) and r.meta["cap"] == pytest.approx(0.3)
    with pytest.raises(ValueError, match="total_epochs"):
        effective_cap(cfg, 0, 0)


def test_progress_t3rl() -> None:
    cfg = RewardConfig(mode="progress", irrelevance_weight=0.5)
    assert reward(FAILED, cfg=cfg).score == pytest.approx((1 + 0.5 * 1) / (3 + 0.5 * 1))
    zero_irr = RewardConfig(mode="progress", irrelevance_weight=0.0)  # 0 means 0, not the default
    assert reward(FAILED, cfg=zero_irr).score == pytest.approx(1 / 3)
    floor = RewardConfig(mode="progress", scorable_floor=True)
    assert reward({**FAILED, "passed_turns": 0}, cfg=floor).score == 0.0
    assert reward({**FAILED, "passed_turns": 0}, cfg=cfg).score == pytest.approx(0.5 / 3.5)
    empty = {**FAILED, "scorable_turns": 0, "irrelevance_turns": 0, "passed_turns": 0, "passed_irrelevance_turns": 0}
    assert reward(empty, cfg=zero_irr).score == pytest.approx(0.5)  # falls back to progress_with_irrelevance
    with pytest.raises(KeyError, match="scorable_turns"):
        reward({"valid": False, "failure_tags": []}, cfg=cfg)


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="mode"):
        RewardConfig(mode="dense")
    with pytest.raises(ValueError, match="partial_credit_cap"):
        RewardConfig(partial_credit_cap=1.5)
    with pytest.raises(ValueError, match="irrelevance_weight"):
        RewardConfig(irrelevance_weight=-1)
    with pytest.raises(ValueError, match="unknown key"):
        RewardConfig.from_dict({"cap": 0.5})


def test_episode_reward_is_the_one_rule() -> None:
    """Excluded or unevaluated episodes score 0; validation scores the verdict; training the mode."""
    cfg = RewardConfig(mode="capped", partial_credit_cap=0.7, partial_credit_weight=1.5)
    played = EpisodeResult("multi_turn_base_1", "multi_turn_base", evaluation=Evaluation.from_wire(FAILED))
    assert episode_reward(played, cfg=cfg, train=True).score == pytest.approx(0.5)
    val = episode_reward(played, cfg=cfg, train=False)
    assert val.score == 0.0 and val.meta["mode"] == "binary"
    passed = EpisodeResult("multi_turn_base_1", "multi_turn_base", evaluation=Evaluation.from_wire(PASSED))
    assert episode_reward(passed, cfg=cfg, train=False).score == 1.0
    faulted = EpisodeResult("multi_turn_base_1", "multi_turn_base", evaluation=Evaluation.from_wire(PASSED),
                            llm_fault=True)
    assert episode_reward(faulted, cfg=cfg, train=True).score == 0.0
    unevaluated = EpisodeResult("multi_turn_base_1", "multi_turn_base")
    assert episode_reward(unevaluated, cfg=cfg, train=True).score == 0.0
