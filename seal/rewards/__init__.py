"""Episode rewards from the environment's evaluation (:class:`seal.episode.Evaluation`).

``binary`` (default, the paper's recipe): 1 iff BFCL's multi-turn checker passes. The dense
modes give partial credit to failed episodes: ``capped`` (turn progress, weighted and capped,
the cap optionally decaying by epoch) and ``progress`` (the T3RL turn ratio with irrelevance
turns weighted). Every knob is used as given; an explicit 0 means 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from seal.config_base import allows, check_fields
from seal.episode import EpisodeResult, Evaluation
from seal_shared.types import dataclass_from_mapping

REWARD_MODES = ("binary", "capped", "progress")


@dataclass
class RewardConfig:
    """``seal.reward``. Defaults: binary reward; the dense knobs hold the release's defaults."""

    mode: str = field(default="binary", metadata=allows(choices=REWARD_MODES))
    partial_credit_cap: float = field(default=0.7, metadata=allows(ge=0, le=1))
    partial_credit_weight: float = field(default=1.0, metadata=allows(ge=0))
    cap_decay: bool = False
    min_cap: float = field(default=0.0, metadata=allows(ge=0, le=1))
    irrelevance_weight: float = field(default=0.5, metadata=allows(ge=0))
    scorable_floor: bool = False

    def __post_init__(self) -> None:
        check_fields(self, "seal.reward")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> RewardConfig:
        return dataclass_from_mapping(cls, data, section="seal.reward")


@dataclass(frozen=True)
class RewardResult:
    """The scalar reward and the diagnosis metadata that travel with the episode."""

    score: float
    meta: dict[str, Any] = field(default_factory=dict)


def _clip01(x: float) -> float:
    return min(max(float(x), 0.0), 1.0)


def _need(evaluation: Evaluation, key: str, mode: str) -> Any:
    value = getattr(evaluation, key)
    if value is None:
        raise KeyError(f"reward mode {mode!r} needs {key!r} in the evaluate result; the environment did not report it")
    return value


def effective_cap(cfg: RewardConfig, epoch: int, total_epochs: int) -> float:
    """The partial-credit cap at ``epoch`` (0-based): with ``cap_decay``,
    max(min_cap, cap·(1 − epoch/total_epochs)); otherwise the cap."""
    if total_epochs < 1:
        raise ValueError(f"total_epochs must be >= 1, got {total_epochs}")
    if not cfg.cap_decay:
        return cfg.partial_credit_cap
    return max(cfg.min_cap, cfg.partial_credit_cap * (1.0 - epoch / total_epochs))


def _progress_score(evaluation: Evaluation, cfg: RewardConfig) -> float:
    m = "progress"
    scorable = float(_need(evaluation, "scorable_turns", m))
    passed = float(_need(evaluation, "passed_turns", m))
    irr = float(_need(evaluation, "irrelevance_turns", m))
    passed_irr = float(_need(evaluation, "passed_irrelevance_turns", m))
    if cfg.scorable_floor and scorable > 0 and passed == 0:
        return 0.0
    w = cfg.irrelevance_weight
    denom = scorable + w * irr
    if denom > 0:
        return _clip01((passed + w * passed_irr) / denom)
    return _clip01(_need(evaluation, "progress_with_irrelevance", m))


def compute_reward(evaluation: Evaluation, *, cfg: RewardConfig, epoch: int = 0,
                   total_epochs: int = 1) -> RewardResult:
    """Score one episode from the environment's typed ``evaluation``.

    ``binary``: 1.0 if passed else 0.0. ``capped``: 1 if passed else
    min(cap, max(0, weight)·clip(progress, 0, 1)) with the cap from :func:`effective_cap`.
    ``progress``: 1 if passed; else 0 when ``scorable_floor`` and no scorable turn passed;
    else clip((passed + w·passed_irr) / (scorable + w·irr), 0, 1), falling back to
    ``progress_with_irrelevance`` when the denominator is 0. "Passed" is the verifier's verdict.
    """
    passed = evaluation.valid
    meta: dict[str, Any] = {
        "mode": cfg.mode,
        "passed": passed,
        "tags": list(evaluation.tags),
        "per_turn_valid": list(evaluation.per_turn_valid or []),
        "progress": evaluation.progress,
        "progress_with_irrelevance": evaluation.progress_with_irrelevance,
    }
    if passed:
        score = 1.0
    elif cfg.mode == "binary":
        score = 0.0
    elif cfg.mode == "capped":
        cap = effective_cap(cfg, epoch, total_epochs)
        meta["cap"] = cap
        score = min(cap, cfg.partial_credit_weight * _clip01(_need(evaluation, "progress", "capped")))
    else:
        score = _progress_score(evaluation, cfg)
    return RewardResult(score=float(score), meta=meta)


def episode_reward(result: EpisodeResult, *, cfg: RewardConfig, train: bool, epoch: int = 0,
                   total_epochs: int = 1) -> RewardResult:
    """The one reward of an episode, for every trainer and log.

    An excluded or unevaluated episode scores 0 (it is never trained on). A validation episode
    (``train=False``) scores the binary verdict whatever ``cfg.mode``, as the paper's tables
    report pass rates; a training episode scores ``cfg``'s mode at ``epoch``.
    """
    if result.excluded or result.evaluation is None:
        return RewardResult(score=0.0, meta={})
    mode_cfg = cfg if train else dataclasses.replace(cfg, mode="binary")
    return compute_reward(result.evaluation, cfg=mode_cfg, epoch=epoch, total_epochs=total_epochs)


__all__ = ["REWARD_MODES", "RewardConfig", "RewardResult", "compute_reward", "effective_cap", "episode_reward"]
