"""Guideline selection: the trainer's half of guideline evolution.

Each step the trainer picks the lines for the failure modes the policy has not solved from its
capability state and sends them with every training episode (``diagnostic_evolution.lines``); the
environment renders them (:mod:`seal_shared.interface.guidelines`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from seal.diagnosis.state import CapabilityState
from seal_shared.interface.guidelines import GuidelineConfig
from seal_shared.tags import guideline_excluded_tags


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
    line that marks a policy failure (:func:`seal_shared.tags.guideline_excluded_tags` lists the others) is kept when count >= ``min_tag_count``,
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
