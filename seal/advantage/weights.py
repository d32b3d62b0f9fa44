"""A-Patch configuration and its torch-free trajectory scale (the dynamic tag-weight update is
:mod:`seal.advantage.dynamic`).

This module imports no torch, so the environment service, which imports the core, stays
torch-free. The tensor parts of A-Patch live in :mod:`seal.advantage.apatch`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from seal.config_base import ConfigError, allows, check_fields
from seal_shared.tags import default_tag_weights, excluded_tags, known_tags
from seal_shared.types import dataclass_from_mapping

__all__ = ["APPLY_MODES", "APatchConfig", "BudgetConfig", "DynamicConfig", "trajectory_scale"]

APPLY_MODES = ("all", "positive_advantage", "negative_advantage")


def _check_scale_range(section: str, min_scale: float, max_scale: float) -> None:
    if min_scale > max_scale:
        raise ConfigError(f"{section}.min_scale={min_scale:g}: expected a number <= "
                          f"{section}.max_scale={max_scale:g}")


@dataclass
class DynamicConfig:
    """Closed-loop (EMA) update of the tag weights from the capability state."""

    enable: bool = True
    ema_beta: float = field(default=0.25, metadata=allows(ge=0, le=1))
    prevalence_alpha: float = field(default=1.0, metadata=allows(ge=0))
    confidence_samples: int = field(default=32, metadata=allows(ge=0))

    def __post_init__(self) -> None:
        check_fields(self, "seal.advantage.apatch.dynamic")


@dataclass
class BudgetConfig:
    """Optional squeeze of the scales toward 1 and renormalisation of their mean (off in SEAL)."""

    enable: bool = False
    min_scale: float = field(default=0.5, metadata=allows(ge=0))
    max_scale: float = field(default=2.0, metadata=allows(ge=0))
    strength: float = field(default=1.0, metadata=allows(ge=0))
    normalize_mean: bool = False
    target_mean: float = field(default=1.0, metadata=allows(ge=0))

    def __post_init__(self) -> None:
        check_fields(self, "seal.advantage.apatch.budget")
        _check_scale_range("seal.advantage.apatch.budget", self.min_scale, self.max_scale)


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
    min_scale: float = field(default=0.5, metadata=allows(ge=0))
    max_scale: float = field(default=2.0, metadata=allows(ge=0))
    apply_to: str = field(default="all", metadata=allows(choices=APPLY_MODES))
    warmup_steps: int = field(default=0, metadata=allows(ge=0))
    metric_prefix: str = field(default="seal/apatch", metadata=allows(
        pattern=r".*[^/]", means="a non-empty metric prefix without a trailing '/'"))
    tag_weights: dict[str, float] = field(default_factory=_default_weights, metadata=allows(ge=0))
    dynamic: DynamicConfig = field(default_factory=DynamicConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)

    def __post_init__(self) -> None:
        self.dynamic = dataclass_from_mapping(DynamicConfig, self.dynamic, section="seal.advantage.apatch.dynamic")
        self.budget = dataclass_from_mapping(BudgetConfig, self.budget, section="seal.advantage.apatch.budget")
        self.tag_weights = _merge_tag_weights(self.tag_weights)
        check_fields(self, "seal.advantage.apatch")
        self.tag_weights = {tag: float(weight) for tag, weight in self.tag_weights.items()}
        _check_scale_range("seal.advantage.apatch", self.min_scale, self.max_scale)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> APatchConfig:
        return dataclass_from_mapping(cls, data, section="seal.advantage.apatch")


def _merge_tag_weights(overrides: Mapping[str, float] | None) -> dict[str, float]:
    known = known_tags()
    merged = _default_weights()
    for tag, weight in (overrides or {}).items():
        if str(tag) not in known:
            raise ValueError(f"seal.advantage.apatch.tag_weights: unknown tag {tag!r}; known tags: {sorted(known)}")
        merged[str(tag)] = weight
    return merged


def clip(x: float, lo: float, hi: float) -> float:
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
    return clip(sum(kept) / len(kept), min_scale, max_scale)
