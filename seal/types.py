"""Shared vocabulary: failure tags, the paper's labels, and the records that carry them.

This module is the only place where tag names are spelled. Everything else imports
``FailureTag`` (a ``StrEnum``, so a tag compares equal to its string and serialises as one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class FailureTag(StrEnum):
    """One label per ground-truth turn, as the release's per-turn scorer emits them.

    The first matching rule wins, in the order the members are listed (``checker_error`` is
    checked twice: around the state check and around the response check).
    """

    GT_ERROR = "gt_error"
    SPURIOUS_TOOL_CALL = "spurious_tool_call"
    CORRECT_ABSTENTION = "correct_abstention"
    EMPTY_TURN_MODEL_RESPONSE = "empty_turn_model_response"
    INSTANCE_MISMATCH = "instance_mismatch"
    CHECKER_ERROR = "checker_error"
    STATE_MISMATCH = "state_mismatch"
    RESPONSE_MISMATCH = "response_mismatch"
    PASS = "pass"

    @property
    def description(self) -> str:
        return TAG_DESCRIPTIONS[self]


TAG_DESCRIPTIONS: dict[FailureTag, str] = {
    FailureTag.GT_ERROR: "Executing the ground-truth calls of this turn raised; the turn cannot be judged.",
    FailureTag.SPURIOUS_TOOL_CALL: "The right move was to abstain (empty ground truth), but the model called a tool.",
    FailureTag.CORRECT_ABSTENTION: "The ground truth is empty and the model made no call: a correct abstention.",
    FailureTag.EMPTY_TURN_MODEL_RESPONSE: "The ground truth has calls, but the model made no accepted call in this turn.",
    FailureTag.INSTANCE_MISMATCH: "No model call of the turn executed cleanly, so the backend instances never matched.",
    FailureTag.CHECKER_ERROR: "The state or response checker itself raised while judging this turn.",
    FailureTag.STATE_MISMATCH: "After the turn, the backend state differs from the ground truth's.",
    FailureTag.RESPONSE_MISMATCH: "State matches, but a ground-truth result is missing from the model's results so far.",
    FailureTag.PASS: "Both the state check and the cumulative response check passed.",
}

# Tags that say nothing about the policy: excluded from A-Patch averaging and from prevalence.
EXCLUDED_TAGS: frozenset[FailureTag] = frozenset({FailureTag.CHECKER_ERROR, FailureTag.GT_ERROR})

# The pseudo-tag the capability state records for an episode that carries no tags at all.
UNKNOWN_TAG = "unknown"

# A-Patch static base weights (the release's defaults).
DEFAULT_TAG_WEIGHTS: dict[FailureTag, float] = {
    FailureTag.GT_ERROR: 1.0,
    FailureTag.SPURIOUS_TOOL_CALL: 2.0,
    FailureTag.CORRECT_ABSTENTION: 1.8,
    FailureTag.EMPTY_TURN_MODEL_RESPONSE: 1.5,
    FailureTag.INSTANCE_MISMATCH: 0.6,
    FailureTag.CHECKER_ERROR: 1.0,
    FailureTag.STATE_MISMATCH: 1.0,
    FailureTag.RESPONSE_MISMATCH: 0.9,
    FailureTag.PASS: 1.0,
}


class PaperLabel(StrEnum):
    """The failure vocabulary the paper's text uses (the release emits ``FailureTag`` instead)."""

    INVALID_TOOL_CALL = "invalid_tool_call"
    ARGUMENT_MISMATCH = "argument_mismatch"
    MISSING_TOOL_CALL = "missing_tool_call"
    RECOVERY_FAILURE = "recovery_failure"
    STATE_MISMATCH = "state_mismatch"
    RESPONSE_MISMATCH = "response_mismatch"
    NONE = "none"  # a passing turn, a correct abstention, or a turn that cannot be judged


# Per-turn tag -> paper label, when nothing else is known about the episode. Episode events
# (parse errors, unavailable tools, tool errors followed by failure) refine this; see
# ``seal.diagnosis.labels.paper_labels``.
TAG_TO_PAPER_LABEL: dict[FailureTag, PaperLabel] = {
    FailureTag.GT_ERROR: PaperLabel.NONE,
    FailureTag.SPURIOUS_TOOL_CALL: PaperLabel.INVALID_TOOL_CALL,
    FailureTag.CORRECT_ABSTENTION: PaperLabel.NONE,
    FailureTag.EMPTY_TURN_MODEL_RESPONSE: PaperLabel.MISSING_TOOL_CALL,
    FailureTag.INSTANCE_MISMATCH: PaperLabel.RECOVERY_FAILURE,
    FailureTag.CHECKER_ERROR: PaperLabel.NONE,
    FailureTag.STATE_MISMATCH: PaperLabel.ARGUMENT_MISMATCH,
    FailureTag.RESPONSE_MISMATCH: PaperLabel.RESPONSE_MISMATCH,
    FailureTag.PASS: PaperLabel.NONE,
}


@dataclass(frozen=True)
class TurnDiagnosis:
    """What the per-turn pass found for one ground-truth turn."""

    index: int
    tag: FailureTag
    valid: bool | None  # None: not scorable (ground truth empty)
    irrelevance: bool | None = None  # for empty-GT turns: True iff the model abstained
    errors: tuple[str, ...] = ()


@dataclass
class EpisodeRecord:
    """One finished training or validation episode, as the trainer consumes it."""

    task_id: str
    category: str
    reward: float
    success: bool
    tags: list[str] = field(default_factory=list)
    error_messages: list[str] = field(default_factory=list)
    meta: dict = field(default_factory=dict)
