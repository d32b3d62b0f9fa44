"""A-Patch configuration and its torch-free trajectory scale (the dynamic tag-weight update is
:mod:`seal.advantage.dynamic`).

This module imports no torch, so the environment service, which imports the core, stays
torch-free. The tensor parts of A-Patch live in :mod:`seal.advantage.apatch`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from seal_shared.tags import default_tag_weights, excluded_tags, known_tags
from seal_shared.types import dataclass_from_mapping

__all__ = ["APPLY_MODES", "APatchConfig", "BudgetConfig", "DynamicConfig", "trajectory_scale"]

APPLY_MODES = ("all", "positive_advantage", "negative_advantage")


def _check_scale_range(section: str, min_scale: float, max_scale: float) -> None:
    if not (math.isfinite(min_scale) and math.isfinite(max_scale)):
        raise ValueError(f"{section}: min_scale/max_scale must be finite, got {min_scale}, {max_scale}")
    if min_scale < 0 or min_scale > max_scale:
        raise ValueError(f"{section}: need 0 <= min_scale <= max_scale, got min_scale={min_scale}, "
                         f"max_scale={max_scale}")


@dataclass
class DynamicConfig:
    """Closed-loop (EMA) update of the tag weights from the capability state."""

    enable: bool = True
    ema_beta: float = 0.25
    prevalence_alpha: float = 1.0
    confidence_samples: int = 32

    def __post_init__(self) -> None:
        if not 0.0 <= self.ema_beta <= 1.0:
            raise ValueError(f"seal.advantage.apatch.dynamic.ema_beta must be in [0, 1], got {self.ema_beta}")
        if self.prevalence_alpha < 0:
            raise ValueError("seal.advantage.apatch.dynamic.prevalence_alpha must be >= 0, "
                             f"got {self.prevalence_alpha}")
        if int(self.confidence_samples) != self.confidence_samples or self.confidence_samples < 0:
            raise ValueError("seal.advantage.apatch.dynamic.confidence_samples must be a non-negative integer, "
                             f"got {self.confidence_samples}")


@dataclass
class BudgetConfig:
    """Optional squeeze of the scales toward 1 and renormalisation of their mean (off in SEAL)."""

    enable: bool = False
    min_scale: float = 0.5
    max_scale: float = 2.0
    strength: float = 1.0
    normalize_mean: bool = False
    target_mean: float = 1.0

    def __post_init__(self) -> None:
        _check_scale_range("seal.advantage.apatch.budget", self.min_scale, self.max_scale)
        if self.strength < 0:
            raise ValueError(f"seal.advantage.apatch.budget.strength must be >= 0, got {self.strength}")
        if self.target_mean < 0:
            raise ValueError(f"seal.advantage.apatch.budget.target_mean must be >= 0, got {self.target_mean}")


def _default_weights() -> dict[str, float]:
    return {str(t): w for t, w in default_tag_weights().items()}


@dataclass
class APatchConfig:
    """A-Patch settings; defaults are the release's SEAL recipe.

    ``tag_weights`` given as a partial mapping is merged over the registered tags' default
    weights (:func:`seal_shared.tags.default_tag_weights`; the release lets each tag be overridden on
    its own). Keys must be registered tags or ``"unknown"``; a misspelled tag is an error rather
    than a silently ignored weight.
    """

    enable: bool = True
    min_scale: float = 0.5
    max_scale: float = 2.0
    apply_to: str = "all"
    warmup_steps: int = 0
    metric_prefix: str = "seal/apatch"
    tag_weights: dict[str, float] = field(default_factory=_default_weights)
    dynamic: DynamicConfig = field(default_factory=DynamicConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)

    def __post_init__(self) -> None:
        _check_scale_range("seal.advantage.apatch", self.min_scale, self.max_scale)
        if self.apply_to not in APPLY_MODES:
            raise ValueError(f"seal.advantage.apatch.apply_to must be one of {list(APPLY_MODES)}, got {self.apply_to!r}")
        if int(self.warmup_steps) != self.warmup_steps or self.warmup_steps < 0:
            raise ValueError(f"seal.advantage.apatch.warmup_steps must be a non-negative integer, got {self.warmup_steps}")
        if not self.metric_prefix or self.metric_prefix.endswith("/"):
            raise ValueError("seal.advantage.apatch.metric_prefix must be non-empty without a trailing '/', "
                             f"got {self.metric_prefix!r}")
        self.dynamic = dataclass_from_mapping(DynamicConfig, self.dynamic, section="seal.advantage.apatch.dynamic")
        self.budget = dataclass_from_mapping(BudgetConfig, self.budget, section="seal.advantage.apatch.budget")
        self.tag_weights = _merge_tag_weights(self.tag_weights)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> APatchConfig:
        return dataclass_from_mapping(cls, data, section="seal.advantage.apatch")


def _merge_tag_weights(overrides: Mapping[str, float] | None) -> dict[str, float]:
    known = known_tags()
    merged = _default_weights()
    for tag, weight in (overrides or {}).items():
        if str(tag) not in known:
            raise ValueError(f"seal.advantage.apatch.tag_weights: unknown tag {tag!r}; known tags: {sorted(known)}")
        weight = float(weight)
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"seal.advantage.apatch.tag_weights.{tag} must be finite and >= 0, got {weight}")
        merged[str(tag)] = weight
    return merged


def _clip(x: float, lo: float, hi: float) -> float:
    return min(max(x, lo), hi)


def trajectory_scale(tags: Iterable[str], weights: Mapping[str, float], *, min_scale: float,
                     max_scale: float) -> float:
    """A-Patch scale of one episode: the mean tag weight over its turns, clipped.

    Excluded tags (:func:`seal_shared.tags.excluded_tags`) are dropped first (they judge the checker, not the policy);
    a tag missing from ``weights`` counts as 1.0. With no tag left the scale is exactly 1.0.
    ``pass`` turns count (weight 1.0 by default), so a mostly-passing episode stays near 1,
    as in the release.
    """
    excluded = excluded_tags()
    kept = [weights.get(t, 1.0) for t in tags if t not in excluded]
    if not kept:
        return 1.0
    return _clip(sum(kept) / len(kept), min_scale, max_scale)
