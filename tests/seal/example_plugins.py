"""The research plug-ins of docs/extending.md, as a module a config lists under ``seal.plugins``:
a failure tag (``missed_tool``) and a reweighter (``failure_boost``) with its own settings."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch

from seal.advantage import register_reweighter
from seal.config_base import allows, check_fields
from seal_shared.tags import TagDefinition, TurnEvidence, register_tag
from seal_shared.types import PaperLabel


def _tool_names(calls: tuple[str, ...]) -> Counter[str]:
    return Counter(call.split("(", 1)[0].strip() for call in calls)


def _missed_a_tool(e: TurnEvidence) -> bool:
    """The state is wrong and the model never called a tool the ground truth needed."""
    return e.state_valid is False and bool(_tool_names(e.gt_calls) - _tool_names(e.model_calls))


register_tag(TagDefinition(
    "missed_tool", 55, _missed_a_tool,  # after checker_error (50), before state_mismatch (60)
    weight=1.7,
    guideline="Before ending a turn, check that you called every tool the request needs, in order.",
    description="The state is wrong and a tool the ground truth called was never called by the model.",
    paper_label=PaperLabel.MISSING_TOOL_CALL,
))


@dataclass
class FailureBoostConfig:
    """Settings of ``failure_boost`` (block ``seal.advantage.failure_boost``)."""

    factor: float = field(default=2.0, metadata=allows(ge=0))
    tag: str = "missed_tool"
    ramp_steps: int = field(default=0, metadata=allows(ge=0))  # reach ``factor`` over this many boosted steps

    def __post_init__(self) -> None:
        check_fields(self, "seal.advantage.failure_boost")


def ramp_boost(cfg: FailureBoostConfig, step: int, capability, saved):
    """This step's factor for ``cfg.tag``, and the state to keep: the steps boosted so far."""
    runs = saved.get("runs", 0) + 1
    share = min(1.0, runs / cfg.ramp_steps) if cfg.ramp_steps else 1.0
    return {cfg.tag: 1.0 + share * (cfg.factor - 1.0)}, {"runs": runs}


@register_reweighter("failure_boost", config=FailureBoostConfig, prepare=ramp_boost)
def failure_boost(advantages: torch.Tensor, tags, *, cfg: FailureBoostConfig, weights, step: int):
    """Multiply the negative advantages of episodes that carry ``cfg.tag`` by this step's factor."""
    rows = torch.tensor([bool(t) and cfg.tag in t for t in tags]).unsqueeze(-1)
    out = torch.where(rows & (advantages < 0), advantages * weights[cfg.tag], advantages)
    return out, {"seal/failure_boost/boosted_rows": float(rows.sum())}
