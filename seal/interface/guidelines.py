"""Guideline evolution: behavioural guidelines for the failure modes the policy has not solved.

The trainer selects the lines from its capability state each step and sends them with every
training episode (``diagnostic_evolution.lines``); the environment only renders them, so the
trainer and the environment share no file (docs/paper_map.md compares the release's way).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from seal.diagnosis.state import CapabilityState
from seal.tags import default_guidelines, guideline_excluded_tags, known_tags
from seal.types import dataclass_from_mapping

# The keys of a ``diagnostic_evolution`` block that the environment reads; every other key of
# that block is a selection setting of :class:`GuidelineConfig`, used by the trainer.
EPISODE_KEYS = ("enable", "apply_to_validation", "categories", "lines")
GUIDELINES_HEADER = "# Behavioral guidelines (env-evolved from recent failures):"


@dataclass
class GuidelineConfig:
    """Thresholds of guideline selection (the release's defaults).

    ``guidelines`` overrides the default line per tag (each tag's line is registered with it in
    :mod:`seal.tags`); an empty string removes a tag's line.
    ``per_category``: select from each episode's own category's statistics (``category_tags``
    in a ``diagnostic_evolution`` block, the release's name).
    """

    min_tag_count: int = 8
    prevalence_threshold: float = 0.10
    reward_threshold: float = 0.6
    max_lines: int = 3
    per_category: bool = False
    guidelines: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key in ("min_tag_count", "max_lines"):
            value = getattr(self, key)
            if int(value) != value or value < 0:
                raise ValueError(f"seal.interface.guidelines.{key} must be a non-negative integer, got {value}")
        known = known_tags()
        for tag in self.guidelines:
            if tag not in known:
                raise ValueError(f"seal.interface.guidelines.guidelines: unknown tag {tag!r}; known: {sorted(known)}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> GuidelineConfig:
        return dataclass_from_mapping(cls, data, section="seal.interface.guidelines")

    @classmethod
    def from_diagnostic_evolution(cls, block: Mapping[str, Any] | None) -> GuidelineConfig:
        """The selection settings inside a ``diagnostic_evolution`` params block; the block's
        episode keys (``enable``, ``apply_to_validation``, ``categories``, ``lines``) are skipped."""
        block = dict(block or {})
        for key in EPISODE_KEYS:
            block.pop(key, None)
        if "category_tags" in block:
            block["per_category"] = bool(block.pop("category_tags"))
        return dataclass_from_mapping(cls, block, section="diagnostic_evolution")

    def line_for(self, tag: str) -> str:
        return self.guidelines.get(tag, default_guidelines().get(tag, ""))


def _tag_counts(tag_stats: Any, category: str | None) -> dict[str, tuple[float, float]]:
    """``{tag: (count, reward_mean)}`` from a state, its ``to_dict()``, or a plain tag mapping."""
    if isinstance(tag_stats, Mapping) and "version" in tag_stats:
        tag_stats = CapabilityState.from_dict(tag_stats)
    if isinstance(tag_stats, CapabilityState):
        return {t: (s.count, s.reward_mean) for t, s in tag_stats.tag_source(category=category).items()}
    if category is not None:
        raise ValueError("category filtering needs a CapabilityState (or its to_dict()), not a plain tag mapping")
    out = {}
    for tag, s in tag_stats.items():
        count = float(s["count"])
        mean = float(s["reward_mean"]) if "reward_mean" in s else (float(s["reward_sum"]) / count if count else 0.0)
        out[str(tag)] = (count, mean)
    return out


def select_guidelines(tag_stats: CapabilityState | Mapping[str, Any], *, category: str | None = None,
                      cfg: GuidelineConfig | None = None) -> list[str]:
    """The guideline lines for prevalent, unsolved failure tags, best first.

    ``tag_stats``: a :class:`CapabilityState` (or its ``to_dict()``), whose window tags are
    used if non-empty, else its totals; with ``category``, that category's tags. A plain
    ``{tag: {count, reward_mean | reward_sum}}`` mapping is used as given. Prevalence is a
    tag's count over the summed counts of all tags in that source. A tag with a guideline
    line that marks a policy failure (:func:`seal.tags.guideline_excluded_tags` lists the others) is kept when count >= ``min_tag_count``,
    prevalence >= ``prevalence_threshold`` and reward mean < ``reward_threshold``; kept tags
    are ranked by prevalence·(1 − reward mean) (ties: tag name) and the top ``max_lines``
    lines returned.
    """
    cfg = cfg or GuidelineConfig()
    stats = _tag_counts(tag_stats, category)
    total = sum(c for c, _ in stats.values())
    if total <= 0:
        return []
    ranked = []
    never = guideline_excluded_tags()
    for tag, (count, reward_mean) in stats.items():
        line = cfg.line_for(tag)
        if tag in never or not line:
            continue
        prevalence = count / total
        if count >= cfg.min_tag_count and prevalence >= cfg.prevalence_threshold and reward_mean < cfg.reward_threshold:
            ranked.append((-prevalence * (1.0 - reward_mean), tag, line))
    ranked.sort()
    return [line for _, _, line in ranked[: cfg.max_lines]]


def render_guidelines(lines: Sequence[str]) -> str:
    """The system-prompt block for ``lines`` (``""`` when there are none)."""
    if not lines:
        return ""
    return "\n".join([GUIDELINES_HEADER, *(f"- {line}" for line in lines)])


def __getattr__(name: str) -> Any:
    # DEFAULT_GUIDELINES: the registered tags' lines at the time of access (see seal.tags).
    if name == "DEFAULT_GUIDELINES":
        return default_guidelines()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
