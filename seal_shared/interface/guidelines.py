"""Guideline evolution: behavioural guidelines for the failure modes the policy has not solved.

The trainer selects the lines from its capability state each step (``seal.interface.guidelines``)
and sends them with every training episode (``diagnostic_evolution.lines``); the environment only
renders them (:func:`render_guidelines`), so the trainer and the environment share no file
(docs/paper_map.md compares the release's way). The selection settings, :class:`GuidelineConfig`,
travel in the same params block, so both sides read them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from seal_shared.tags import default_guidelines, known_tags
from seal_shared.types import dataclass_from_mapping

# The keys of a ``diagnostic_evolution`` block that the environment reads; every other key of
# that block is a selection setting of :class:`GuidelineConfig`, used by the trainer.
EPISODE_KEYS = ("enable", "apply_to_validation", "categories", "lines")
GUIDELINES_HEADER = "# Behavioral guidelines (env-evolved from recent failures):"


@dataclass
class GuidelineConfig:
    """Thresholds of guideline selection (the release's defaults).

    ``guidelines`` overrides the default line per tag (each tag's line is registered with it in
    :mod:`seal_shared.tags`); an empty string removes a tag's line.
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
        block = {k: v for k, v in (block or {}).items() if k not in EPISODE_KEYS}
        if "category_tags" in block:
            block["per_category"] = bool(block.pop("category_tags"))
        return dataclass_from_mapping(cls, block, section="diagnostic_evolution")

    def line_for(self, tag: str) -> str:
        return self.guidelines.get(tag, default_guidelines().get(tag, ""))


def render_guidelines(lines: Sequence[str]) -> str:
    """The system-prompt block for ``lines`` (``""`` when there are none)."""
    if not lines:
        return ""
    return "\n".join([GUIDELINES_HEADER, *(f"- {line}" for line in lines)])


def __getattr__(name: str) -> Any:
    # DEFAULT_GUIDELINES: the registered tags' lines at the time of access (see seal_shared.tags).
    if name == "DEFAULT_GUIDELINES":
        return default_guidelines()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
