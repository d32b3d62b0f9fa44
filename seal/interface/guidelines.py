"""Guideline selection: the trainer's half of guideline evolution.

Each step the trainer picks the lines for the failure modes the policy has not solved from its
capability state and sends them with every training episode (``diagnostic_evolution.lines``); the
environment renders them (:mod:`seal_shared.interface.guidelines`).
"""

from __future__ import annotations

from seal.diagnosis.state import CapabilityState
from seal_shared.interface.guidelines import GuidelineConfig
from seal_shared.tags import guideline_excluded_tags


def select_guidelines(state: CapabilityState, *, category: str | None = None,
                      cfg: GuidelineConfig | None = None) -> list[str]:
    """The guideline lines for prevalent, unsolved failure tags, best first.

    The tags are ``state``'s window tags if any, else its totals; with ``category``, that
    category's. Prevalence is a tag's count over the summed counts of all tags there. A tag with
    a guideline line that marks a policy failure (:func:`seal_shared.tags.guideline_excluded_tags`
    lists the others) is kept when count >= ``min_tag_count``, prevalence >=
    ``prevalence_threshold`` and reward mean < ``reward_threshold``; kept tags are ranked by
    prevalence·(1 − reward mean) (ties: tag name) and the top ``max_lines`` lines returned.
    """
    cfg = cfg or GuidelineConfig()
    stats = state.tag_source(category=category)
    total = sum(st.count for st in stats.values())
    if total <= 0:
        return []
    ranked = []
    never = guideline_excluded_tags()
    for tag, st in stats.items():
        line = cfg.line_for(tag)
        if tag in never or not line:
            continue
        prevalence = st.count / total
        if (st.count >= cfg.min_tag_count and prevalence >= cfg.prevalence_threshold
                and st.reward_mean < cfg.reward_threshold):
            ranked.append((-prevalence * (1.0 - st.reward_mean), tag, line))
    ranked.sort()
    return [line for _, _, line in ranked[: cfg.max_lines]]
